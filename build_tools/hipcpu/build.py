"""Builds the emulated AMD library: csrc/common through the ROCm build's own hipify stage, then the
host C++ compiler against the HIP-on-CPU runtime (tests/hipcpu), for gfx942 (FNUZ FP8) or gfx950
(OCP FP8). Device pointers of the result are host pointers.

    python -m build_tools.hipcpu.build --arch gfx942 [--build-dir build/hipcpu] [--jobs 2]
                                       [--wave-reduction-width 32]   (the mutation check)

Produces, under BUILD/ARCH/:
  python/transformer_engine/   the Python package with libtransformer_engine.so and _native
  te_cpp_tests                 the C API tests of tests/cpp
  te_failsafe_tests            the AMD fail-safes of the C API (tests/hipcpu/test_failsafes.cpp)
Objects are cached by the hash of their preprocessed source and flags, so a translation unit
whose preprocessed text is the same for both archs (or unchanged since the last build) is
compiled once.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

from build_tools import hipify_stage
from build_tools.hipcpu.host_source import rewrite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME_DIR = os.path.join(ROOT, "tests", "hipcpu")
ARCHS = {"gfx942": "HIPCPU_GFX942", "gfx950": "HIPCPU_GFX950"}
# csrc/hip files that run in the emulation; the GEMM libraries' files are replaced by the
# reference loop (tests/hipcpu/gemm_reference_loop.cpp), which says so in its name.
HIP_VENDOR_FILES = ("attention_vendor.cpp",)
CXX = os.environ.get("CXX", "g++")
# Modest optimisation: the kernels' arithmetic is what is tested, not their speed, and -O1
# compiles the template-heavy files several times faster than -O2.
OPT = ["-O1", "-g0"]


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


# The mutation check: the wavefront reductions (a shuffle-xor loop starting at half the wavefront)
# rebuilt to start at half of a narrower width, so that lanes 32..63 are left out of every sum.
REDUCTION_LOOP = "offset = TE_WARP_SIZE / 2"


def _mutate(text: str, width: int | None) -> str:
    return text if not width else text.replace(REDUCTION_LOOP, f"offset = {width} / 2")


def _mirror(src_dir: str, dst_dir: str, width: int | None = None) -> None:
    """Copies the hipified tree with the host rewrites applied; unchanged files keep mtimes."""
    for root, _, files in os.walk(src_dir):
        rel = os.path.relpath(root, src_dir)
        os.makedirs(os.path.join(dst_dir, rel), exist_ok=True)
        for f in files:
            s, d = os.path.join(root, f), os.path.join(dst_dir, rel, f)
            with open(s, encoding="utf-8") as fh:
                text = _mutate(rewrite(fh.read()), width)
            if os.path.exists(d):
                with open(d, encoding="utf-8") as fh:
                    if fh.read() == text:
                        continue
            with open(d, "w", encoding="utf-8") as fh:
                fh.write(text)


class Compiler:
    def __init__(self, cache_dir: str, jobs: int):
        self.cache_dir = cache_dir
        self.jobs = jobs
        os.makedirs(cache_dir, exist_ok=True)
        self.compiled = 0
        self.reused = 0

    def object_for(self, source: str, flags: list) -> str:
        lang = ["-x", "c++"] if not source.endswith((".S", ".s")) else []
        pre = subprocess.run([CXX, *lang, *flags, "-E", "-P", source], capture_output=True)
        if pre.returncode != 0:
            raise RuntimeError(f"preprocessing {source} failed:\n{pre.stderr.decode()[-4000:]}")
        obj = os.path.join(self.cache_dir, _hash(pre.stdout, CXX, *flags, *OPT) + ".o")
        if os.path.exists(obj):
            self.reused += 1
            return obj
        tmp = obj + f".tmp{os.getpid()}"
        cmd = [CXX, *lang, *flags, *OPT, "-fPIC", "-c", source, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"compiling {source} failed:\n{' '.join(cmd)}\n{res.stderr[-6000:]}")
        os.replace(tmp, obj)
        self.compiled += 1
        return obj

    def objects(self, sources_and_flags: list) -> list:
        errors = []

        def one(source_and_flags):
            try:
                return self.object_for(*source_and_flags)
            except RuntimeError as exc:  # report every failing unit, not only the first
                errors.append(str(exc))
                return None

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            objects = list(pool.map(one, sources_and_flags))
        if errors:
            raise RuntimeError("\n".join(errors))
        return objects


def _run(cmd: list) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-6000:]}")


def pybind_flags() -> list:
    import pybind11
    return [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]


def build(arch: str, build_dir: str, jobs: int, wave_reduction_width: int | None = None) -> dict:
    build_dir = os.path.abspath(build_dir)
    hip_dir = os.path.join(build_dir, "hipified")
    suffix = f"-mutant{wave_reduction_width}" if wave_reduction_width else ""
    host_dir = os.path.join(build_dir, "host" + suffix)
    # The same stage the ROCm build runs (build_tools/hipify_stage.py), over csrc/common and the
    # C API tests.
    common_units = hipify_stage.hipify_tree(os.path.join(ROOT, "csrc", "common"),
                                            os.path.join(hip_dir, "common"))
    test_units = hipify_stage.hipify_tree(os.path.join(ROOT, "tests", "cpp"),
                                          os.path.join(hip_dir, "cpp"))
    _mirror(os.path.join(hip_dir, "common"), os.path.join(host_dir, "common"), wave_reduction_width)
    _mirror(os.path.join(hip_dir, "cpp"), os.path.join(host_dir, "cpp"))
    common = os.path.join(host_dir, "common")

    device_flags = ["-std=c++17", "-D__HIP_PLATFORM_AMD__", "-D__HIPCC__", f"-D__{arch}__",
                    f"-D{ARCHS[arch]}", "-DTE_HIPCPU_EMULATION=1",
                    f"-DNVTE_BUILD_ARCHS=\"{arch}\"", "-DNVTE_DEFAULT_HIPBLASLT=1",
                    f"-I{os.path.join(RUNTIME_DIR, 'include')}", f"-I{common}",
                    f"-I{os.path.join(common, 'include')}", "-w"]
    out = os.path.join(build_dir, arch + suffix)
    pkg = os.path.join(out, "python", "transformer_engine")
    compiler = Compiler(os.path.join(build_dir, "objects"), jobs)

    lib_sources = [(os.path.join(common, u), device_flags) for u in common_units]
    lib_sources += [(os.path.join(ROOT, "csrc", "hip", f), device_flags) for f in HIP_VENDOR_FILES]
    lib_sources += [(os.path.join(RUNTIME_DIR, f), device_flags)
                    for f in ("runtime.cpp", "gemm_reference_loop.cpp")]
    lib_sources.append((os.path.join(RUNTIME_DIR, "fiber_switch_x86_64.S"), []))
    lib_objects = compiler.objects(lib_sources)

    # The Python package: a copy of the source tree's (Python files only) next to the libraries.
    if os.path.isdir(pkg):
        shutil.rmtree(pkg)
    shutil.copytree(os.path.join(ROOT, "transformer_engine"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    lib = os.path.join(pkg, "libtransformer_engine.so")
    _run([CXX, "-shared", "-o", lib, *lib_objects, "-lpthread"])

    binding_flags = ["-std=c++17", f"-I{os.path.join(ROOT, 'csrc', 'common', 'include')}",
                     *pybind_flags(), "-fvisibility=hidden", "-w"]
    bindings_dir = os.path.join(ROOT, "csrc", "bindings")
    binding_objects = compiler.objects(
        [(os.path.join(bindings_dir, f), binding_flags)
         for f in sorted(os.listdir(bindings_dir)) if f.endswith(".cpp")])
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    _run([CXX, "-shared", "-o", os.path.join(pkg, "_native" + ext), *binding_objects,
          f"-L{pkg}", "-ltransformer_engine", "-Wl,-rpath,$ORIGIN"])

    test_flags = device_flags + [f"-I{os.path.join(host_dir, 'cpp')}"]
    test_objects = compiler.objects([(os.path.join(host_dir, "cpp", u), test_flags)
                                     for u in test_units])
    tests = os.path.join(out, "te_cpp_tests")
    _run([CXX, "-o", tests, *test_objects, f"-L{pkg}", "-ltransformer_engine",
          f"-Wl,-rpath,{pkg}"])
    failsafe_objects = compiler.objects(
        [(os.path.join(RUNTIME_DIR, "test_failsafes.cpp"),
          ["-std=c++17", f"-I{os.path.join(ROOT, 'csrc', 'common', 'include')}"])])
    failsafes = os.path.join(out, "te_failsafe_tests")
    _run([CXX, "-o", failsafes, *failsafe_objects, f"-L{pkg}", "-ltransformer_engine",
          f"-Wl,-rpath,{pkg}"])
    print(f"hipcpu build {arch}: {compiler.compiled} objects compiled, {compiler.reused} reused "
          f"from the cache; library {lib}")
    return {"package_dir": os.path.dirname(pkg), "cpp_tests": tests, "failsafe_tests": failsafes,
            "library": lib}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "hipcpu"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--wave-reduction-width", type=int, default=None,
                    help="mutation check: rebuild the wavefront reductions with this width")
    args = ap.parse_args(argv)
    try:
        build(args.arch, args.build_dir, args.jobs, args.wave_reduction_width)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
