#!/usr/bin/env bash
# The ROCm build check, end to end, on a machine without ROCm or an AMD GPU:
#   1. the Debian sid sysroot (reused when its stamp matches, ~75 s to create otherwise),
#   2. hipify on the host + hipcc in the sysroot for gfx942;gfx90a;gfx950, linking
#      libtransformer_engine.so and the _native module against libamdhip64, rocBLAS, hipBLASLt,
#   3. the checks of build_tools/rocm_check.py (hipified twins, no CUDA names, fat binary archs,
#      kernels of every family, NEEDED entries, nvte_* symbols equal to the CUDA build's,
#      import of the module inside the sysroot with "rocm backend, no device").
# Exit status 0 only when every step passed; a summary is printed at the end.
#
#   .ci/rocm_check.sh [--cuda-lib PATH | --cuda-symbols FILE] [--archs "gfx942;gfx90a;gfx950"]
#
# Without --cuda-lib/--cuda-symbols (or NVTE_CUDA_SYMBOLS, a file of the CUDA build's nvte_*
# names) the CUDA library is built here with nvcc for the symbol comparison; CI passes the list
# of the one it has already built. Environment: TE_ROCM_SYSROOT (sysroot
# path, default /var/cache/te-rocm-sysroot), TE_ROCM_BUILD_DIR (default build/rocm),
# PYTHON (a Python with torch, for hipify; default python3), MAX_JOBS.
set -euo pipefail

cd "$(dirname "$0")/.."
SYSROOT=${TE_ROCM_SYSROOT:-/var/cache/te-rocm-sysroot}
BUILD_DIR=${TE_ROCM_BUILD_DIR:-build/rocm}
PYTHON=${PYTHON:-python3}

start=$(date +%s)
echo "== ROCm sysroot: $SYSROOT"
.ci/rocm_sysroot.sh "$SYSROOT"
sysroot_s=$(( $(date +%s) - start ))

extra=()
case " $* " in
  *" --cuda-lib"*|*" --cuda-symbols"*) ;;
  *) if [ -n "${NVTE_CUDA_SYMBOLS:-}" ]; then extra=(--cuda-symbols "$NVTE_CUDA_SYMBOLS"); fi;;
esac

echo "== ROCm build and checks (build dir $BUILD_DIR)"
rc=0
"$PYTHON" -m build_tools.rocm_check --sysroot "$SYSROOT" --build-dir "$BUILD_DIR" "${extra[@]}" "$@" \
  || rc=$?

echo "== ROCm check: sysroot ${sysroot_s} s, total $(( $(date +%s) - start )) s, exit $rc"
if [ "$rc" -ne 0 ]; then
  echo "ROCm check FAILED (see the FAIL lines above)" >&2
fi
exit "$rc"
