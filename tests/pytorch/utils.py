"""Helpers of the PyTorch suites: devices to run on, with the reason a device is skipped."""
import zlib

import pytest
import torch

from tolerances import tols  # noqa: F401  (re-exported: the shared tolerance table)
from transformer_engine.pytorch.native import native_for_torch


def native_gpu_reason() -> str:
    if not torch.cuda.is_available():
        return "no GPU: native kernels are tested on an NVIDIA/AMD GPU"
    if native_for_torch() is None:
        return "the native core is not built for this torch's GPU vendor"
    return ""


requires_native_gpu = pytest.mark.skipif(bool(native_gpu_reason()), reason=native_gpu_reason() or "ok")

# Devices every op is checked on: the reference backend always, the native one where it exists.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_native_gpu)]


def stable_seed(*key, modulo: int = 10_000) -> int:
    """A seed from a test's parameters that is the same in every process (Python's hash() of
    strings is randomised per process, which made failures unrepeatable)."""
    return zlib.crc32(repr(tuple(str(k) for k in key)).encode()) % modulo


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype, device, seed=0, scale=1.0):
    """Random normal data made on the CPU (identical on every device), never zeros."""
    return (torch.randn(shape, generator=seeded(seed)) * scale).to(dtype).to(device)
