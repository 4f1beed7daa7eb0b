"""Which native backend to build, which archs and frameworks, and why.

Unset, NVTE_BACKEND is detected from a toolchain that works on this machine:
  cuda  nvcc (from CUDA_HOME when it is set, else PATH, else /usr/local/cuda) compiles a test
        file, cuBLASLt is found (the nvidia-cublas wheel or the toolkit) and a CUDA driver
        (libcuda.so.1) is present;
  rocm  hipcc (from ROCM_PATH when it is set, else PATH, else /opt/rocm), the HIP runtime
        (libamdhip64) and the GPU driver (/dev/kfd);
  none  otherwise: the pure-Python package, every op on its reference implementation.
A toolchain that is found but not usable gives `none` and a warning that says what is missing
and how to force a build (NVTE_BACKEND=cuda|rocm, e.g. to build for another machine).

Build-time environment variables (all listed in README.rst):
  NVTE_BACKEND        cuda | rocm | none; unset: detected as above
  NVTE_CUDA_ARCHS     CUDA archs, default "80;89;90a"
  NVTE_ROCM_ARCH      ROCm offload archs, default "gfx942;gfx90a"
  NVTE_FRAMEWORK      pytorch,jax | all | none; default: the installed ones
  NVTE_USE_HIPBLASLT  ROCm: the GEMM library used when the variable is unset at run time (1 = hipBLASLt)
  NVTE_XLA_FFI_INCLUDE  XLA FFI headers for the JAX handlers (default: the installed jaxlib's)
  CUDA_HOME (or CUDA_PATH), ROCM_PATH, MAX_JOBS
"""
from __future__ import annotations

import ctypes
import dataclasses
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

DEFAULT_CUDA_ARCHS = "80;89;90a"
DEFAULT_ROCM_ARCH = "gfx942;gfx90a"
KNOWN_FRAMEWORKS = ("pytorch", "jax")


@dataclasses.dataclass
class BuildPlan:
    backend: str  # cuda | rocm | none
    reason: str
    archs: str
    frameworks: tuple
    compiler: str | None
    default_hipblaslt: bool
    home: str | None = None  # the CUDA or ROCm installation the compiler belongs to
    warnings: tuple = ()     # a usable-looking toolchain that was not used, and why

    def describe(self) -> str:
        lines = [f"transformer_engine build: backend={self.backend} ({self.reason})"]
        if self.backend != "none":
            lines.append(f"  archs={self.archs} compiler={self.compiler}")
        if self.backend == "rocm":
            lib = "hipBLASLt" if self.default_hipblaslt else "rocBLAS"
            lines.append(f"  default GEMM library: {lib} (NVTE_USE_HIPBLASLT at run time overrides)")
        lines.append(f"  frameworks={','.join(self.frameworks) or 'none'}")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def summary(self) -> dict:
        """What `python -m transformer_engine info` shows of the build (build_info.json)."""
        return {"backend": self.backend, "reason": self.reason, "archs": self.archs,
                "frameworks": list(self.frameworks), "compiler": self.compiler,
                "warnings": list(self.warnings)}


# ----- toolchain discovery ----------------------------------------------------------------------

_HOST_PATHS: list = []


def host_site_paths() -> list:
    """sys.path of this interpreter as the user's environment sees it. Under pip's build
    isolation the build runs with only the build requirements importable; the frameworks and
    the nvidia-* wheels the native build looks for are in the user's environment, which the
    same interpreter shows when started isolated from PYTHONPATH (-I)."""
    if not _HOST_PATHS:
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        try:
            out = subprocess.run([sys.executable, "-I", "-c", "import sys; print('\\n'.join(sys.path))"],
                                 capture_output=True, text=True, timeout=60).stdout
            paths += [p for p in out.splitlines() if p and os.path.isdir(p)]
        except (OSError, subprocess.TimeoutExpired):
            pass
        paths += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        _HOST_PATHS.extend(dict.fromkeys(paths))
    return list(_HOST_PATHS)


def find_package_dir(name: str) -> str | None:
    """The folder of an installed top-level package, in this process or the user's environment,
    found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    for root in host_site_paths():
        cand = os.path.join(root, name)
        if os.path.isfile(os.path.join(cand, "__init__.py")):
            return cand
    return None


def _home_of(tool_path: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.realpath(tool_path)))


def find_tool(name: str, home_vars: tuple, default_home: str, env) -> tuple:
    """(path or None, home or None, how it was found). An explicit home variable is obeyed:
    the tool is looked for there only."""
    for var in home_vars:
        home = env.get(var)
        if home:
            cand = os.path.join(home, "bin", name)
            if os.path.exists(cand):
                return cand, home, f"{var}={home}"
            return None, home, f"{var}={home} has no bin/{name}"
    found = shutil.which(name, path=env.get("PATH"))
    if found:
        return found, _home_of(found), "PATH"
    cand = os.path.join(default_home, "bin", name)
    if os.path.exists(cand):
        return cand, default_home, default_home
    return None, None, f"not on PATH nor in {default_home}"


def cublas_search_dirs(cuda_home: str | None) -> list:
    """cuBLASLt comes from the nvidia-cublas wheel (nvidia/cu13 or nvidia/cublas) or the toolkit."""
    dirs = []
    for root in host_site_paths():
        for sub in ("nvidia/cu13", "nvidia/cublas", "nvidia/cu12"):
            cand = os.path.join(root, sub)
            if os.path.isdir(os.path.join(cand, "lib")):
                dirs.append(cand)
    if cuda_home:
        dirs += [cuda_home, os.path.join(cuda_home, "targets", "x86_64-linux")]
    return dirs


def _has_lib(dirs, pattern: str) -> bool:
    return any(glob.glob(os.path.join(d, sub, pattern)) for d in dirs for sub in ("lib", "lib64"))


def _cuda_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _nvcc_compiles(nvcc: str, arch: str) -> tuple:
    """(ok, why not): nvcc builds a one-kernel file for the first arch asked for."""
    arch = arch.replace("a", "") if arch else "80"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cu")
        with open(src, "w") as fh:
            fh.write("__global__ void probe(float* x) { x[threadIdx.x] *= 2.f; }\n")
        try:
            res = subprocess.run([nvcc, f"-arch=sm_{arch}", "-c", src, "-o",
                                  os.path.join(tmp, "probe.o")],
                                 capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        return False, lines[-1] if lines else f"exit status {res.returncode}"
    return True, ""


def _detect_cuda(env, archs: str) -> tuple:
    """(nvcc, home, None) when the CUDA backend can be built and run here, else (nvcc or None,
    home, why not) where why-not is a warning when nvcc exists, None when it does not."""
    nvcc, home, how = find_tool("nvcc", ("CUDA_HOME", "CUDA_PATH"), "/usr/local/cuda", env)
    if nvcc is None:
        explicit = any(env.get(v) for v in ("CUDA_HOME", "CUDA_PATH"))
        return None, home, (f"nvcc not found ({how})" if explicit else None)
    if not _has_lib(cublas_search_dirs(home), "libcublasLt.so*"):
        return nvcc, home, (f"nvcc found at {nvcc} but no cuBLASLt library (pip install "
                            f"nvidia-cublas, or a toolkit with cuBLAS)")
    if not _cuda_driver_present():
        return nvcc, home, (f"nvcc found at {nvcc} but no CUDA driver (libcuda.so.1): no NVIDIA "
                            f"GPU to run native kernels on")
    ok, why = _nvcc_compiles(nvcc, archs.split(";")[0])
    if not ok:
        return nvcc, home, f"nvcc at {nvcc} cannot compile a test kernel: {why}"
    return nvcc, home, ""


def _detect_rocm(env) -> tuple:
    hipcc, home, how = find_tool("hipcc", ("ROCM_PATH",), "/opt/rocm", env)
    if hipcc is None:
        return None, home, (f"hipcc not found ({how})" if env.get("ROCM_PATH") else None)
    if not _has_lib([home], "libamdhip64.so*"):
        return hipcc, home, f"hipcc found at {hipcc} but no HIP runtime (libamdhip64) in {home}"
    if not os.path.exists("/dev/kfd"):
        return hipcc, home, f"hipcc found at {hipcc} but no AMD GPU driver (/dev/kfd)"
    return hipcc, home, ""


# ----- the plan ---------------------------------------------------------------------------------

def _flag(value: str | None, default: bool, name: str) -> bool:
    if value is None or value == "":
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: expected 0 or 1")


def _frameworks(env) -> tuple:
    value = env.get("NVTE_FRAMEWORK", "").strip().lower()
    if value in ("", "auto"):
        found = []
        if find_package_dir("torch") is not None:
            found.append("pytorch")
        if find_package_dir("jax") is not None:
            found.append("jax")
        return tuple(found)
    if value == "all":
        return KNOWN_FRAMEWORKS
    if value == "none":
        return ()
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in KNOWN_FRAMEWORKS]
    if bad:
        raise ValueError(f"NVTE_FRAMEWORK={value!r}: unknown {bad}; expected pytorch, jax, all or none")
    return names


def plan_build(env=None) -> BuildPlan:
    env = os.environ if env is None else env
    frameworks = _frameworks(env)
    hipblaslt = _flag(env.get("NVTE_USE_HIPBLASLT"), True, "NVTE_USE_HIPBLASLT")
    requested = env.get("NVTE_BACKEND", "").strip().lower()
    if requested not in ("", "cuda", "rocm", "none"):
        raise ValueError(f"NVTE_BACKEND={requested!r}: expected cuda, rocm or none")
    cuda_archs = (env.get("NVTE_CUDA_ARCHS") or DEFAULT_CUDA_ARCHS).replace(",", ";")
    rocm_archs = (env.get("NVTE_ROCM_ARCH") or DEFAULT_ROCM_ARCH).replace(",", ";")

    if requested == "none":
        return BuildPlan("none", "NVTE_BACKEND=none", "", frameworks, None, hipblaslt)
    if requested == "cuda":
        nvcc, home, how = find_tool("nvcc", ("CUDA_HOME", "CUDA_PATH"), "/usr/local/cuda", env)
        if not nvcc:
            raise RuntimeError(f"NVTE_BACKEND=cuda but nvcc was not found ({how}); set CUDA_HOME")
        return BuildPlan("cuda", f"NVTE_BACKEND=cuda, nvcc at {nvcc}", cuda_archs, frameworks,
                         nvcc, hipblaslt, home)
    if requested == "rocm":
        hipcc, home, how = find_tool("hipcc", ("ROCM_PATH",), "/opt/rocm", env)
        if not hipcc:
            raise RuntimeError(f"NVTE_BACKEND=rocm but hipcc was not found ({how}); set ROCM_PATH")
        return BuildPlan("rocm", f"NVTE_BACKEND=rocm, hipcc at {hipcc}", rocm_archs, frameworks,
                         hipcc, hipblaslt, home)

    warnings = []
    nvcc, cuda_home, why = _detect_cuda(env, cuda_archs)
    if nvcc and not why:
        return BuildPlan("cuda", f"nvcc at {nvcc} compiles, cuBLASLt and a CUDA driver found",
                         cuda_archs, frameworks, nvcc, hipblaslt, cuda_home)
    if why:
        warnings.append(why)
    hipcc, rocm_home, why = _detect_rocm(env)
    if hipcc and not why:
        return BuildPlan("rocm", f"hipcc at {hipcc}, the HIP runtime and an AMD GPU driver found",
                         rocm_archs, frameworks, hipcc, hipblaslt, rocm_home)
    if why:
        warnings.append(why)
    if warnings:
        warnings.append("built the reference backend only; NVTE_BACKEND=cuda or rocm builds the "
                        "native one anyway (e.g. for another machine)")
        reason = "no usable GPU toolchain: " + "; ".join(warnings[:-1])
    else:
        reason = "no GPU toolchain found (nvcc, hipcc)"
    return BuildPlan("none", reason, "", frameworks, None, hipblaslt, None, tuple(warnings))
