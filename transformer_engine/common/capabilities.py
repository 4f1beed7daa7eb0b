"""One capability query: which backend was built, which device is present, and which FP8
encoding and matrix support it has. `python -m transformer_engine info` prints this report."""
from __future__ import annotations

import dataclasses

from . import config
from .fp8_formats import ArchFP8, fp8_for_arch
from .native import build_backend, emulation, native_module, native_unavailable_reason


@dataclasses.dataclass(frozen=True)
class Capability:
    backend: str            # 'cuda' | 'rocm' | 'reference': where ops run for this device
    device: str | None      # marketing name, e.g. 'NVIDIA H100 80GB HBM3'
    arch: str | None        # 'sm_90', 'gfx942', or None for the reference backend
    fp8_flavor: str | None  # 'ocp' | 'fnuz' | None (no FP8)
    fp8_gemm: bool
    reason: str             # why this backend / FP8 support

    @property
    def has_fp8(self) -> bool:
        return self.fp8_flavor is not None


def reference_capability(reason: str) -> Capability:
    arch = fp8_for_arch("cpu")
    return Capability("reference", None, None, arch.flavor, False, f"{reason}; {arch.reason}")


def capability_for(backend: str, arch: str, name: str | None) -> Capability:
    info: ArchFP8 = fp8_for_arch(arch)
    return Capability(backend, name, arch.split(":")[0], info.flavor, info.fp8_gemm, info.reason)


def native_device_capability(device: int | None = None) -> Capability:
    """Capability of a GPU as the native library sees it (reference when there is none)."""
    mod = native_module()
    if mod is None:
        return reference_capability(native_unavailable_reason())
    count, why = mod.device_count()
    if count == 0:
        return reference_capability(f"{mod.build_backend()} backend, no device ({why or 'none visible'})")
    dev = mod.current_device() if device is None else device
    arch, name = mod.device_arch(dev)
    return capability_for(mod.build_backend(), arch, name)


def gemm_library() -> tuple:
    """(library name, why) of the native GEMM for this build."""
    backend = build_backend()
    if backend == "cuda":
        return "cuBLASLt", "NVIDIA build"
    if backend == "rocm" and emulation():
        return native_module().default_gemm_library(), emulation()
    if backend == "rocm":
        mod = native_module()
        default = bool(getattr(mod, "default_hipblaslt", lambda: True)())
        use, why = config.use_hipblaslt(default)
        return ("hipBLASLt" if use else "rocBLAS"), why
    return "framework matmul (reference)", "no native backend"
