"""Which native backend to build, which archs and frameworks, and why.

Build-time environment variables (all listed in README.rst):
  NVTE_BACKEND        cuda | rocm | none; unset: detected (nvcc -> cuda, hipcc -> rocm, else none)
  NVTE_CUDA_ARCHS     CUDA archs, default "80;89;90a"
  NVTE_ROCM_ARCH      ROCm offload archs, default "gfx942;gfx90a"
  NVTE_FRAMEWORK      pytorch,jax | all | none; default: the installed ones
  NVTE_USE_HIPBLASLT  ROCm: the GEMM library used when the variable is unset at run time (1 = hipBLASLt)
  NVTE_XLA_FFI_INCLUDE  XLA FFI headers for the JAX handlers (default: the installed jaxlib's)
  CUDA_HOME, ROCM_PATH, MAX_JOBS
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil

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

    def describe(self) -> str:
        lines = [f"transformer_engine build: backend={self.backend} ({self.reason})"]
        if self.backend != "none":
            lines.append(f"  archs={self.archs} compiler={self.compiler}")
        if self.backend == "rocm":
            lib = "hipBLASLt" if self.default_hipblaslt else "rocBLAS"
            lines.append(f"  default GEMM library: {lib} (NVTE_USE_HIPBLASLT at run time overrides)")
        lines.append(f"  frameworks={','.join(self.frameworks) or 'none'}")
        return "\n".join(lines)


def _find_tool(name: str, home_var: str) -> str | None:
    home = os.environ.get(home_var)
    if home:
        cand = os.path.join(home, "bin", name)
        if os.path.exists(cand):
            return cand
    found = shutil.which(name)
    if found:
        return found
    default = {"CUDA_HOME": "/usr/local/cuda", "ROCM_PATH": "/opt/rocm"}[home_var]
    cand = os.path.join(default, "bin", name)
    return cand if os.path.exists(cand) else None


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
        if importlib.util.find_spec("torch") is not None:
            found.append("pytorch")
        if importlib.util.find_spec("jax") is not None:
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
    nvcc = _find_tool("nvcc", "CUDA_HOME")
    hipcc = _find_tool("hipcc", "ROCM_PATH")
    if requested:
        backend, reason = requested, "NVTE_BACKEND is set"
    elif nvcc:
        backend, reason = "cuda", f"found nvcc at {nvcc}"
    elif hipcc:
        backend, reason = "rocm", f"found hipcc at {hipcc}"
    else:
        backend, reason = "none", "neither nvcc (CUDA_HOME) nor hipcc (ROCM_PATH) found"
    if backend == "cuda":
        if not nvcc:
            raise RuntimeError("NVTE_BACKEND=cuda but nvcc was not found (set CUDA_HOME)")
        archs, compiler = env.get("NVTE_CUDA_ARCHS") or DEFAULT_CUDA_ARCHS, nvcc
    elif backend == "rocm":
        if not hipcc:
            raise RuntimeError("NVTE_BACKEND=rocm but hipcc was not found (set ROCM_PATH)")
        archs, compiler = env.get("NVTE_ROCM_ARCH") or DEFAULT_ROCM_ARCH, hipcc
    else:
        archs, compiler = "", None
    return BuildPlan(backend, reason, archs.replace(",", ";"), frameworks, compiler, hipblaslt)
