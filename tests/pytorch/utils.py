"""Helpers of the PyTorch suites: devices to run on, with the reason a device is skipped."""
import zlib

import pytest
import torch

from tolerances import tols  # noqa: F401  (re-exported: the shared tolerance table)
from transformer_engine.pytorch.native import capability, native_for_torch


def native_gpu_reason() -> str:
    if not torch.cuda.is_available():
        return "no GPU: native kernels are tested on an NVIDIA/AMD GPU"
    if native_for_torch() is None:
        return "the native core is not built for this torch's GPU vendor"
    return ""


requires_native_gpu = pytest.mark.skipif(bool(native_gpu_reason()), reason=native_gpu_reason() or "ok")

# Devices every op is checked on: the reference backend always, the native one where it exists.
# In the emulated AMD build (tests/hipcpu: the hipified kernels on a wave64 CPU runtime), "cpu"
# is that build's device: its cases run the native kernels with CPU memory standing in.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_native_gpu)]

_OCP_TO_FNUZ = {torch.float8_e4m3fn: torch.float8_e4m3fnuz, torch.float8_e5m2: torch.float8_e5m2fnuz}


def device_fp8_dtype(dtype, device):
    """The FP8 dtype of dtype's format in the encoding `device` uses: suites are written with the
    OCP dtypes, and an FNUZ device (MI300, gfx942) refuses those."""
    if dtype not in _OCP_TO_FNUZ:
        return dtype
    try:
        flavor = capability(device).fp8_flavor
    except Exception:  # a device this machine lacks: its cases skip anyway
        return dtype
    return _OCP_TO_FNUZ[dtype] if flavor == "fnuz" else dtype


def use_device_fp8_flavour(items):
    """Collection hook: FP8 dtype parameters of a case follow the flavour of its `device`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "device" not in callspec.params:
            continue
        for name, value in list(callspec.params.items()):
            if isinstance(value, torch.dtype):
                callspec.params[name] = device_fp8_dtype(value, callspec.params["device"])


def stable_seed(*key, modulo: int = 10_000) -> int:
    """A seed from a test's parameters that is the same in every process (Python's hash() of
    strings is randomised per process, which made failures unrepeatable)."""
    return zlib.crc32(repr(tuple(str(k) for k in key)).encode()) % modulo


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype, device, seed=0, scale=1.0):
    """Random normal data made on the CPU (identical on every device), never zeros."""
    return (torch.randn(shape, generator=seeded(seed)) * scale).to(dtype).to(device)
