#!/usr/bin/env bash
# Run the four training examples one after another and collect their PNGs and JSON summaries
# in one folder. Full length where a GPU is visible (pass --quick for a smoke test).
#   bash examples/run_all.sh [OUT_DIR] [extra example arguments...]
# Exit status: the number of examples that failed (an FP8 run more than 1 point from BF16 at
# full length counts as a failure).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT=${1:-$HERE/results}
shift || true
failed=0
for ex in mnist_pytorch sort_gpt_pytorch mnist_jax encoder_jax; do
  echo "=== $ex"
  python "$HERE/$ex.py" --out "$OUT" "$@" || failed=$((failed + 1))
done
echo "=== results in $OUT ($failed failed)"
exit "$failed"
