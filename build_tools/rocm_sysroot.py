"""The ROCm build inside a Debian sid sysroot (made by .ci/rocm_sysroot.sh), for machines without
ROCm: hipify runs here on the host (torch's tool), CMake + hipcc run in the sysroot via chroot.

    python3 -m build_tools.rocm_sysroot --sysroot /var/cache/te-rocm-sysroot --build-dir build/rocm

The checkout is bind-mounted read-only and the build directory read-write into the sysroot at
their own absolute paths, so paths in logs, CMake caches and error messages are the host's.
Needs root (mount, chroot).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SYSROOT = os.environ.get("TE_ROCM_SYSROOT", "/var/cache/te-rocm-sysroot")
DEFAULT_ARCHS = "gfx942;gfx90a;gfx950"
SYSROOT_PYTHON = "/usr/bin/python3"  # sid's, with python3-pybind11; hipify needs no torch there
# The chroot sees a clean environment: only these host variables pass through.
PASSTHROUGH = ("MAX_JOBS", "NVTE_USE_HIPBLASLT", "NVTE_ROCM_ARCH")


def _mounts_under(path: str) -> list:
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            target = line.split()[1].replace("\\040", " ")
            if target == path or target.startswith(path + "/"):
                out.append(target)
    return out


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], check=False, stderr=subprocess.DEVNULL)


def unmount_all(sysroot: str) -> None:
    """Undoes every mount below the sysroot (a run killed mid-build leaves them behind)."""
    sysroot = os.path.realpath(sysroot)
    for target in sorted(_mounts_under(sysroot), key=len, reverse=True):
        if target != sysroot:
            _umount(target)


class Sysroot:
    """A prepared sysroot with /proc and the given host directories mounted while in use."""

    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        self._mounted = []
        stamp = os.path.join(self.path, ".te-rocm-sysroot-stamp")
        if not os.path.isfile(stamp):
            raise RuntimeError(f"{self.path} is not a ready sysroot (no stamp file): "
                               "run .ci/rocm_sysroot.sh first")
        if os.geteuid() != 0:
            raise RuntimeError("the sysroot build needs root (mount, chroot)")

    def inside(self, host_path: str) -> str:
        return os.path.join(self.path, os.path.abspath(host_path).lstrip("/"))

    def _mount(self, args: list, target: str) -> None:
        os.makedirs(target, exist_ok=True)
        subprocess.run(["mount"] + args + [target], check=True)
        self._mounted.append(target)

    def bind(self, host_dir: str, read_only: bool) -> None:
        target = self.inside(host_dir)
        self._mount(["--bind", os.path.abspath(host_dir)], target)
        if read_only:
            subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)

    def __enter__(self):
        # One user at a time (the same lock .ci/rocm_sysroot.sh holds while it creates or
        # deletes the sysroot): a second run's cleanup must not unmount a running build.
        self._lock = open(self.path.rstrip("/") + ".lock", "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another user of {self.path} ...", flush=True)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        unmount_all(self.path)
        self._mount(["-t", "proc", "proc"], os.path.join(self.path, "proc"))
        return self

    def __exit__(self, *exc):
        for target in reversed(self._mounted):
            _umount(target)
        self._mounted.clear()
        self._lock.close()  # releases the flock
        return False

    def run(self, argv: list, cwd: str = "/", env: dict | None = None, check: bool = True,
            capture: bool = False) -> subprocess.CompletedProcess:
        """Runs argv in the sysroot (paths are the chroot's, i.e. the host's for bound dirs)."""
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root",
                "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        base.update(env or {})
        cmd = ["chroot", self.path, "/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in base.items()]
        cmd += ["/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd] + list(argv)
        return subprocess.run(cmd, check=check, text=True,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.STDOUT if capture else None)


def hipify(build_dir: str) -> str:
    from .hipify_stage import hipify_tree
    hip_dir = os.path.join(build_dir, "hipified", "common")
    hipify_tree(os.path.join(ROOT, "csrc", "common"), hip_dir)
    return hip_dir


def _stage_xla_ffi_headers(build_dir: str) -> dict:
    """The sysroot has no JAX: copy the host's header-only XLA FFI API into the build tree so
    the JAX handlers (_native_jax) are compiled there too. {} (no JAX module) without jaxlib."""
    import shutil
    from .native_build import xla_ffi_include_dir
    src = xla_ffi_include_dir()
    if not src:
        print("rocm sysroot build: no jaxlib on the host, the JAX FFI handlers are not built",
              flush=True)
        return {}
    dst = os.path.join(build_dir, "xla_ffi_include")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(src, "xla", "ffi", "api"), os.path.join(dst, "xla", "ffi", "api"))
    return {"NVTE_FRAMEWORK": "jax", "NVTE_XLA_FFI_INCLUDE": dst}


def build(sysroot: str, build_dir: str, archs: str = DEFAULT_ARCHS) -> dict:
    """Hipifies on the host, then configures and builds in the sysroot. Returns the outputs."""
    build_dir = os.path.abspath(build_dir)
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    hip_dir = hipify(build_dir)
    t_hipify = time.time() - t0
    cmake_dir = os.path.join(build_dir, "cmake")
    env = {k: os.environ[k] for k in PASSTHROUGH if os.environ.get(k)}
    env.update({"NVTE_BACKEND": "rocm", "NVTE_ROCM_ARCH": archs, "NVTE_HIPIFIED_DIR": hip_dir,
                "NVTE_FRAMEWORK": "none"})
    env.update(_stage_xla_ffi_headers(build_dir))
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    with Sysroot(sysroot) as root:
        root.bind(ROOT, read_only=True)
        # Its own read-write mount, also when it lies inside the checkout (over the ro bind).
        root.bind(build_dir, read_only=False)
        t1 = time.time()
        root.run([SYSROOT_PYTHON, "-m", "build_tools.native_build", "--build-dir", cmake_dir],
                 cwd=ROOT, env=env)
        t_build = time.time() - t1
    lib = os.path.join(cmake_dir, "libtransformer_engine.so")
    # "_native." only: _native_jax (the JAX handlers) sits next to it
    mods = [f for f in os.listdir(cmake_dir) if f.startswith("_native.") and f.endswith(".so")]
    jax_mods = [f for f in os.listdir(cmake_dir) if f.startswith("_native_jax.")]
    print(f"rocm sysroot build: JAX FFI handlers module: {jax_mods[0] if jax_mods else 'not built'}",
          flush=True)
    if not os.path.isfile(lib) or not mods:
        raise RuntimeError(f"the sysroot build finished without its outputs in {cmake_dir}")
    print(f"rocm sysroot build: hipify {t_hipify:.1f} s, configure+compile+link {t_build:.1f} s "
          f"for {archs}", flush=True)
    return {"library": lib, "module": os.path.join(cmake_dir, mods[0]), "hipified": hip_dir,
            "cmake_dir": cmake_dir, "archs": archs}


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sysroot", default=DEFAULT_SYSROOT)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "rocm"))
    ap.add_argument("--archs", default=os.environ.get("NVTE_ROCM_ARCH") or DEFAULT_ARCHS)
    args = ap.parse_args(argv)
    out = build(args.sysroot, args.build_dir, args.archs)
    for key in ("library", "module"):
        print(f"{key}: {out[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
