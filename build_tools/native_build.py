"""Configures and builds the native library and the pybind11 module with CMake + ninja.

Usable from setup.py (pip install .) and on its own:
    python -m build_tools.native_build --build-dir build/native [--out DIR]
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from .backend import BuildPlan, plan_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT_GLOBS = ("libtransformer_engine.so", "_native*.so")  # _native*: also _native_jax


def xla_ffi_include_dir() -> str | None:
    """XLA's header-only FFI API for the JAX handlers: NVTE_XLA_FFI_INCLUDE (e.g. a copy made for
    a build without JAX, like the ROCm sysroot), else the installed jaxlib's include folder
    (what jax.ffi.include_dir() returns, found without importing jax)."""
    given = os.environ.get("NVTE_XLA_FFI_INCLUDE")
    if given:
        return given
    import importlib.util
    spec = importlib.util.find_spec("jaxlib")
    for root in (spec.submodule_search_locations or []) if spec else []:
        cand = os.path.join(root, "include")
        if os.path.isfile(os.path.join(cand, "xla", "ffi", "api", "ffi.h")):
            return cand
    return None


def cublas_search_dirs() -> list:
    """cuBLASLt comes from the nvidia-cublas wheel (nvidia/cu13 or nvidia/cublas) or the toolkit."""
    dirs = []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    roots += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for root in dict.fromkeys(roots):
        for sub in ("nvidia/cu13", "nvidia/cublas", "nvidia/cu12"):
            cand = os.path.join(root, sub)
            if os.path.isdir(os.path.join(cand, "lib")):
                dirs.append(cand)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    dirs += [cuda_home, os.path.join(cuda_home, "targets", "x86_64-linux")]
    return dirs


def cudnn_search_dirs() -> list:
    """cudnn.h from the nvidia-cudnn-cu13 wheel (nvidia/cudnn) and the nvidia-cudnn-frontend
    headers (installed as <site-packages>/include); both optional (attention's cuDNN backend)."""
    dirs = []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    roots += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for root in dict.fromkeys(roots):
        for sub in ("nvidia/cudnn", "nvidia/cu13", ""):
            cand = os.path.join(root, sub) if sub else root
            if os.path.isfile(os.path.join(cand, "include", "cudnn.h")) or \
                    os.path.isfile(os.path.join(cand, "include", "cudnn_frontend.h")):
                dirs.append(cand)
    return dirs


def _pybind11_cmake_dir() -> str:
    try:
        import pybind11
    except ImportError as exc:
        raise RuntimeError("building the native module needs pybind11: pip install pybind11") from exc
    return pybind11.get_cmake_dir()


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        raise RuntimeError("building the native module needs cmake: pip install cmake ninja")
    return exe


def _rocm_compiler_args(hipcc: str) -> list:
    """CMake's HIP language needs ROCm's clang++ (not the hipcc wrapper); hipconfig knows where
    it is (/opt/rocm/llvm/bin, or /usr/lib/llvm-N/bin on distribution packages). The C++ sources
    use the same clang unless CXX is set. HIPCXX, when set, is left to CMake."""
    if os.environ.get("HIPCXX"):
        return []
    hipconfig = os.path.join(os.path.dirname(hipcc), "hipconfig")
    try:
        clang_dir = subprocess.run([hipconfig, "--hipclangpath"], check=True, text=True,
                                   capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []  # let CMake search
    clangxx = os.path.join(clang_dir, "clang++")
    if not os.path.exists(clangxx):
        return []
    args = [f"-DCMAKE_HIP_COMPILER={clangxx}"]
    if not os.environ.get("CXX"):
        args.append(f"-DCMAKE_CXX_COMPILER={clangxx}")
    return args


def configure_args(plan: BuildPlan, build_dir: str) -> list:
    args = [
        f"-DNVTE_BACKEND={plan.backend}",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={_pybind11_cmake_dir()}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    ffi_include = xla_ffi_include_dir() if "jax" in plan.frameworks else None
    if ffi_include:
        args.append(f"-DNVTE_XLA_FFI_INCLUDE={ffi_include}")
    if shutil.which("ninja"):
        args.append("-GNinja")
    if plan.backend == "cuda":
        args += [f"-DNVTE_CUDA_ARCHS={plan.archs}",
                 f"-DCMAKE_CUDA_COMPILER={plan.compiler}",
                 f"-DNVTE_CUBLAS_DIRS={';'.join(cublas_search_dirs())}",
                 f"-DNVTE_CUDNN_DIRS={';'.join(cudnn_search_dirs())}"]
        if shutil.which("ccache"):
            args.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    elif plan.backend == "rocm":
        hip_dir = os.environ.get("NVTE_HIPIFIED_DIR")
        if hip_dir:
            # Hipified elsewhere (the sysroot build hipifies on the host, where torch is, and
            # compiles in a chroot without torch).
            if not os.path.isfile(os.path.join(hip_dir, "sources.txt")):
                raise RuntimeError(f"NVTE_HIPIFIED_DIR={hip_dir} holds no sources.txt: "
                                   "run python -m build_tools.hipify_stage first")
        else:
            from .hipify_stage import hipify_tree
            hip_dir = os.path.join(build_dir, "hipified", "common")
            hipify_tree(os.path.join(ROOT, "csrc", "common"), hip_dir)
        rocm = os.path.dirname(os.path.dirname(plan.compiler))
        args += [f"-DNVTE_ROCM_ARCH={plan.archs}", f"-DNVTE_HIPIFIED_DIR={hip_dir}",
                 f"-DCMAKE_PREFIX_PATH={rocm}",
                 f"-DNVTE_DEFAULT_HIPBLASLT={int(plan.default_hipblaslt)}"]
        args += _rocm_compiler_args(plan.compiler)
    return args


def build(build_dir: str, out_dir: str | None = None, plan: BuildPlan | None = None) -> list:
    """Builds into build_dir and copies the outputs into out_dir; returns the copied paths."""
    plan = plan or plan_build()
    print(plan.describe(), flush=True)
    if plan.backend == "none":
        return []
    build_dir = os.path.abspath(build_dir)
    os.makedirs(build_dir, exist_ok=True)
    cmake = _cmake()
    subprocess.check_call([cmake, "-S", ROOT, "-B", build_dir] + configure_args(plan, build_dir))
    jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
    subprocess.check_call([cmake, "--build", build_dir, "--parallel", jobs])
    outputs = []
    for pattern in OUTPUT_GLOBS:
        outputs += glob.glob(os.path.join(build_dir, pattern))
    copied = []
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        for path in outputs:
            dst = os.path.join(out_dir, os.path.basename(path))
            shutil.copy2(path, dst)
            copied.append(dst)
    return copied or outputs


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "native"))
    ap.add_argument("--out", default=None, help="copy the built libraries here")
    args = ap.parse_args(argv)
    for path in build(args.build_dir, args.out):
        print(path)


if __name__ == "__main__":
    main()
