"""Configures and builds the native library and the pybind11 module with CMake + ninja.

Usable from setup.py (pip install .) and on its own:
    python -m build_tools.native_build --build-dir build/native [--out DIR]

A build directory remembers the configuration it was made for (build_key.json: the CMake
arguments, the cmake and ninja executables). When a later build asks for another one (another
toolchain, archs, Python, or pip's temporary build environment of an earlier run, since deleted)
the directory is emptied first, so a stale or foreign build directory never breaks a build.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

from .backend import BuildPlan, cublas_search_dirs, find_package_dir, host_site_paths, plan_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT_GLOBS = ("libtransformer_engine.so", "_native*.so")  # _native*: also _native_jax


def xla_ffi_include_dir() -> str | None:
    """XLA's header-only FFI API for the JAX handlers: NVTE_XLA_FFI_INCLUDE (e.g. a copy made for
    a build without JAX, like the ROCm sysroot), else the installed jaxlib's include folder
    (what jax.ffi.include_dir() returns, found without importing jax)."""
    given = os.environ.get("NVTE_XLA_FFI_INCLUDE")
    if given:
        return given
    root = find_package_dir("jaxlib")  # also under pip's build isolation (see backend.py)
    cand = os.path.join(root, "include") if root else None
    if cand and os.path.isfile(os.path.join(cand, "xla", "ffi", "api", "ffi.h")):
        return cand
    return None


def cudnn_search_dirs() -> list:
    """cudnn.h from the nvidia-cudnn-cu13 wheel (nvidia/cudnn) and the nvidia-cudnn-frontend
    headers (installed as <site-packages>/include); both optional (attention's cuDNN backend)."""
    dirs = []
    for root in host_site_paths():
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


def _own_hipified_dir(build_dir: str) -> str:
    return os.path.join(build_dir, "hipified", "common")


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
    ninja = shutil.which("ninja")
    if ninja:
        # named explicitly: a cached path (e.g. of pip's deleted build environment) never wins
        args += ["-GNinja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    if plan.backend == "cuda":
        args += [f"-DNVTE_CUDA_ARCHS={plan.archs}",
                 f"-DCMAKE_CUDA_COMPILER={plan.compiler}",
                 f"-DNVTE_CUBLAS_DIRS={';'.join(cublas_search_dirs(plan.home))}",
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
            hip_dir = _own_hipified_dir(build_dir)  # filled by build(), after the key check
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
    args = configure_args(plan, build_dir)
    _reset_if_foreign(build_dir, {"cmake": os.path.realpath(cmake), "args": args})
    if plan.backend == "rocm" and not os.environ.get("NVTE_HIPIFIED_DIR"):
        from .hipify_stage import hipify_tree
        hipify_tree(os.path.join(ROOT, "csrc", "common"), _own_hipified_dir(build_dir))
    subprocess.check_call([cmake, "-S", ROOT, "-B", build_dir] + args)
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


def _reset_if_foreign(build_dir: str, key: dict) -> None:
    """Empties build_dir when it was configured for another key (or by an unknown build)."""
    key_file = os.path.join(build_dir, "build_key.json")
    try:
        with open(key_file) as fh:
            same = json.load(fh) == key
    except (OSError, ValueError):
        same = not os.listdir(build_dir)
    if not same:
        print(f"transformer_engine build: {build_dir} was configured for another toolchain or "
              f"environment; starting it afresh", flush=True)
        for name in os.listdir(build_dir):
            path = os.path.join(build_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    with open(key_file, "w") as fh:
        json.dump(key, fh, indent=1)


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
