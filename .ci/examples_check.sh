#!/usr/bin/env bash
# The four training examples in quick mode on the reference backend (no GPU): each trains a few
# steps in BF16 and in FP8 and writes its loss-curve PNG and JSON summary. Then the quickstarts.
# Run from the repository root with transformer_engine importable.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${TE_EXAMPLES_OUT:-/tmp/te-ci-examples}
rm -rf "$OUT"
for ex in mnist_pytorch sort_gpt_pytorch mnist_jax encoder_jax; do
  t0=$SECONDS
  python "examples/$ex.py" --quick --no-progress --out "$OUT"
  for f in "$OUT/${ex}_quick.png" "$OUT/${ex}_quick.json"; do
    [ -s "$f" ] || { echo "examples: $ex did not write $f"; exit 1; }
  done
  echo "examples: $ex passed in $((SECONDS - t0)) s"
done
