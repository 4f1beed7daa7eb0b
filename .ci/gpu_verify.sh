#!/usr/bin/env bash
# The one GPU verification script (an NVIDIA H100/H200 machine):
# builds from a clean tree, runs the Python suites on the GPU, the C API tests, and the
# benchmarks, and prints a short summary last. Results land in $OUT.
#
#   bash .ci/gpu_verify.sh                       everything
#   PYTEST_ARGS="tests/pytorch/test_quantize.py" BENCHES="benchmarks/bench_quantize.py" bash .ci/gpu_verify.sh
#   SKIP_PIP=1 ...   build in place with build_tools only (faster; no pip install check)
#   SKIP_BUILD=1 ... use the package an earlier run installed on this machine
#   SKIP_SANITIZE=1 ... no compute-sanitizer pass (see below); SANITIZE_TOOLS="initcheck ..." picks tools
#   XDIST=N ...      N pytest-xdist workers spread over the visible GPUs (tests/gpu_spread.py),
#                    each result named as it lands (-v); needs pytest-xdist; not for tests/distributed
#   GPUS=2 ...       the multi-GPU mode: tensor/sequence/context parallelism over NCCL, one
#                    process per GPU (tests/distributed), then benchmarks/bench_distributed.py and
#                    bench_jax_mesh.py;
#                    NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
#                    NVSHMEM_DISABLE_NVLS=1)
#
# Every pytest run synchronises the GPU after each test (tests/gpu_sync.py): an asynchronous CUDA
# error fails the test that caused it and stops its process (an xdist worker is replaced).
#
# compute-sanitizer: memcheck, racecheck, synccheck and initcheck, each over the C API tests
# (CPP_FILTER) and over a small pytest kernel subset (SANITIZE_PYTEST; "none": the C API tests
# only), logs in $OUT/sanitize_<tool>_<cpp|py>.log; .ci/sanitizer_summary.py counts the findings,
# ours apart (kernels of te::, or host-side errors in te:: frames; a cuDNN kernel we launch is
# cuDNN's), into $OUT/sanitize_summary.txt and the final summary. Ours must be zero.
#
# For a GPU machine without internet access, the header-only cudnn-frontend can travel with the
# tree in the git-ignored folder .cudnn_fe (make it with: pip download --no-deps nvidia-cudnn-frontend==1.32.0
# -d /tmp/fe && unzip -q /tmp/fe/*.whl 'include/*' -d .cudnn_fe; copy it along with the tree).
# The build looks for include/cudnn_frontend.h on sys.path, hence PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/te_gpu_out}
mkdir -p "$OUT"
export NVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-90a}
export PYTHONUNBUFFERED=1
if [ "${GPUS:-1}" -ge 2 ]; then
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  visible=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$visible" -ge "$GPUS" ] || { echo "GPUS=$GPUS but $visible GPUs visible"; exit 1; }
  PYTEST_ARGS=${PYTEST_ARGS:-tests/distributed}
  BENCHES=${BENCHES:-benchmarks/bench_distributed.py benchmarks/bench_jax_mesh.py}
  SKIP_CPP=${SKIP_CPP:-1} SKIP_SANITIZE=${SKIP_SANITIZE:-1}
fi
# steps may run inside pipelines (subshells), so they record into a file, not a variable
: > "$OUT/summary.txt"
step() { local name=$1; shift; local t0=$SECONDS; "$@"; local rc=$?; printf '%-16s rc=%d %4ds\n' "$name" "$rc" $((SECONDS - t0)) >> "$OUT/summary.txt"; return $rc; }

[ -f .cudnn_fe/include/cudnn_frontend.h ] && export PYTHONPATH=$PWD/.cudnn_fe${PYTHONPATH:+:$PYTHONPATH}
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  PY="python3 -P"
  (cd /tmp && python3 -m transformer_engine info) | tee "$OUT/info.txt"
elif [ "${SKIP_PIP:-0}" = 1 ]; then
  rm -rf build transformer_engine/*.so
  step build python3 -m build_tools.native_build --build-dir build/native --out transformer_engine > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  export PYTHONPATH=$PWD:$PYTHONPATH
  PY="python3"
  python3 -m transformer_engine info | tee "$OUT/info.txt"
else
  rm -rf build transformer_engine/*.so
  step pip python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  # -P: import the installed package, not the source tree in the current directory
  PY="python3 -P"
  (cd /tmp && python3 -m transformer_engine info) | tee "$OUT/info.txt"
fi

TE_LIB_DIR=$($PY -c "import os, transformer_engine as t; print(os.path.dirname(t.__file__))")
# the NCCL suites (tests/distributed) belong to the GPUS=2 mode: run in the same pytest process
# before tests/pytorch/test_graph.py on a two-GPU machine, they have left its captures failing
pytest_target=${PYTEST_ARGS:-tests --ignore=tests/distributed}
# tests/ on the path for the plugins: gpu_sync (an asynchronous CUDA error is pinned on the test
# that launched it, and its process stops rather than failing every later test) and gpu_spread
export PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
spread=()
if [ "${XDIST:-0}" -gt 0 ]; then
  export TE_TEST_SPREAD_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
  spread=(-n "$XDIST" -p gpu_spread -vv)  # with the -q below: one line per test, named
fi
step pytest $PY -m pytest -q -rs -p no:cacheprovider -p gpu_sync "${spread[@]}" $pytest_target 2>&1 | tee "$OUT/pytest.log" | tail -25

if [ "${SKIP_CPP:-0}" != 1 ]; then
  step cpp-build bash -c "cmake -S tests/cpp -B build/cpp -GNinja -DTE_LIB_DIR=$TE_LIB_DIR -DCMAKE_CUDA_ARCHITECTURES=${NVTE_CUDA_ARCHS} > $OUT/cpp.log 2>&1 && cmake --build build/cpp >> $OUT/cpp.log 2>&1" || tail -30 "$OUT/cpp.log"
  step cpp-test ./build/cpp/te_cpp_tests ${CPP_FILTER:-} 2>&1 | tee "$OUT/cpp_tests.log" | tail -15
fi

sanitize() {  # tool suite command...
  local tool=$1 suite=$2; shift 2
  local extra=()
  # racecheck and synccheck track mbarriers (the wgmma backward's stages, cuDNN's kernels) in a
  # table of --num-cuda-barriers a block. With the automatic size racecheck lost the backward's
  # mbarriers and reported thousands of hazards on its stages, none with 64; synccheck still
  # overflowed at 64 in cuDNN's backward ("Detected overflow of tracked cuda::barrier
  # structures"), after which the context fails and the later tests with it
  case $tool in
    racecheck) extra=(--racecheck-report analysis --num-cuda-barriers 1024) ;;
    synccheck) extra=(--num-cuda-barriers 1024) ;;
  esac
  timeout "${SANITIZE_TIMEOUT:-900}" "$SANITIZER" --tool "$tool" --print-limit 100000 "${extra[@]}" \
    --log-file "$OUT/sanitize_${tool}_${suite}.log" "$@" > "$OUT/sanitize_${tool}_${suite}.out" 2>&1
}
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SANITIZE_PYTEST=${SANITIZE_PYTEST:-tests/pytorch/test_attention_kernels.py -k "portable and (bshd_causal_d128 or sbhd_causal_br_gqa or bshd_nomask_tiles_gqa_d128)"}
if [ "${SKIP_SANITIZE:-0}" != 1 ] && [ -x "$SANITIZER" ]; then
  rm -f "$OUT"/sanitize_*.log
  tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
  if [ -x build/cpp/te_cpp_tests ]; then
    for tool in $tools; do step "san-$tool-cpp" sanitize $tool cpp ./build/cpp/te_cpp_tests ${CPP_FILTER:-}; done
  fi
  if [ "$SANITIZE_PYTEST" != none ]; then
    eval "set -- $SANITIZE_PYTEST"
    for tool in $tools; do step "san-$tool-py" sanitize $tool py $PY -m pytest -q -p no:cacheprovider "$@"; done
  fi
  python3 .ci/sanitizer_summary.py "$OUT"/sanitize_*.log > "$OUT/sanitize_summary.txt"
  printf '%-16s rc=%d\n' sanitize-ours $? >> "$OUT/summary.txt"
fi

for bench in ${BENCHES:-benchmarks/bench_*.py}; do
  [ -f "$bench" ] || continue
  name=$(basename "$bench" .py)
  step "$name" $PY "$bench" --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" | tail -30
done

echo "==================== summary ===================="
head -4 "$OUT/info.txt"
grep -E "passed|failed|error" "$OUT/pytest.log" | tail -1
[ -f "$OUT/cpp_tests.log" ] && tail -1 "$OUT/cpp_tests.log"
[ -f "$OUT/sanitize_summary.txt" ] && cat "$OUT/sanitize_summary.txt"
cat "$OUT/summary.txt"
