#!/usr/bin/env bash
# AMD kernels executed without an AMD GPU: the hipified csrc/common built by the host compiler
# against the wave64 HIP-on-CPU runtime (tests/hipcpu), for gfx942 (FNUZ FP8) and gfx950 (OCP
# FP8). Runs the C API tests and the native pytest cases of the kernel families on each (CPU
# tensors stand in for device memory), then the mutation check: the wavefront reductions rebuilt
# 32 lanes wide must make the C API tests fail. GEMM here is a reference loop, never rocBLAS or
# hipBLASLt; nothing here measures performance or the hardware's FP8 instructions.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python}
BUILD=$ROOT/build/hipcpu
JOBS=${MAX_JOBS:-2}
# The native families: quantize, cast+transpose and fused forms, scaling updates, norms,
# activations (gated, dbias), softmax, RoPE, dbias, portable attention, the fused Linear step.
NATIVE_SUITES=(test_quantize.py test_cast_transpose_fused.py test_normalization.py test_activation.py
               test_dbias.py test_softmax.py test_rope.py test_attention_kernels.py
               test_linear_step.py)
failed=0
summary=()

for arch in gfx942 gfx950; do
  "$PY" -m build_tools.hipcpu.build --arch "$arch" --jobs "$JOBS" || { echo "hipcpu: $arch build failed"; exit 1; }
  cpp=$("$BUILD/$arch/te_cpp_tests" 2>&1 | tail -1)
  echo "hipcpu $arch C API tests: $cpp"
  case "$cpp" in *" 0 failed"*) ;; *) failed=1 ;; esac
  # the AMD fail-safes of the C API (MI200: FP8 casts and GEMMs refused)
  safe=$("$BUILD/$arch/te_failsafe_tests" 2>&1 | tail -1)
  echo "hipcpu $arch C API fail-safe tests: $safe"
  case "$safe" in *" 0 failed"*) ;; *) failed=1 ;; esac
  suites=()
  for s in "${NATIVE_SUITES[@]}"; do suites+=("$ROOT/tests/pytorch/$s"); done
  # Run from the build's package folder so that its transformer_engine (with the emulated
  # library) is the one imported; the "cpu" cases are the native ones in this build.
  log=$BUILD/$arch/pytest.log
  (cd "$BUILD/$arch/python" && "$PY" -m pytest -q -rf -p no:cacheprovider -k cpu "${suites[@]}" > "$log" 2>&1)
  line=$(tail -1 "$log")
  grep "^FAILED" "$log" | sed "s|^|hipcpu $arch |" || true
  ran=$(echo "$line" | grep -oE '[0-9]+ (passed|failed)' | awk '{s += $1} END {print s + 0}')
  echo "hipcpu $arch pytest: $line"
  echo "hipcpu $arch native cases executed on the emulated AMD library: $ran"
  summary+=("$arch: C API $cpp | fail-safes $safe | pytest $line | native cases $ran")
  # every selected native case must pass, as the C API tests, the fail-safes and the mutation
  # check must
  case "$line" in *failed*|*error*) failed=1 ;; *passed*) ;; *) failed=1 ;; esac
done

# Mutation check: lanes 32..63 left out of every wavefront reduction must be caught.
"$PY" -m build_tools.hipcpu.build --arch gfx942 --jobs "$JOBS" --wave-reduction-width 32 \
    || { echo "hipcpu: mutant build failed"; exit 1; }
mutant=$("$BUILD/gfx942-mutant32/te_cpp_tests" 2>&1 | tail -1)
case "$mutant" in
  *" 0 failed"*) echo "hipcpu mutation check: FAILED (32-lane reductions went unnoticed: $mutant)"; failed=1 ;;
  *) echo "hipcpu mutation check: passed (32-lane reductions caught: $mutant)" ;;
esac

printf '%s\n' "${summary[@]}"
exit $failed
