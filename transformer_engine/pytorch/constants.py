"""NVIDIA Transformer Engine's constants module: its tensor-type enum (DType) and the maps
between it and torch dtypes, plus the block sizes of the block-scaled recipes.

FP8 members name the format (E4M3 / E5M2); the torch dtype they map to depends on the device's
FP8 flavour (OCP, or FNUZ on MI300), so `torch_dtype_of` takes the device.
"""
from __future__ import annotations

import enum
from typing import Optional

import torch

from ..common import fp8_formats


class DType(enum.IntEnum):
    """Tensor element types, numbered as NVIDIA TE's transformer_engine_torch.DType."""
    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8


TE_DType = {
    torch.uint8: DType.kByte,
    torch.int16: DType.kInt16,
    torch.int32: DType.kInt32,
    torch.int64: DType.kInt64,
    torch.float32: DType.kFloat32,
    torch.float16: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
}
if hasattr(torch, "float8_e4m3fnuz"):
    TE_DType[torch.float8_e4m3fnuz] = DType.kFloat8E4M3
    TE_DType[torch.float8_e5m2fnuz] = DType.kFloat8E5M2

TE_DType_To_Torch = {
    DType.kByte: torch.uint8,
    DType.kInt16: torch.int16,
    DType.kInt32: torch.int32,
    DType.kInt64: torch.int64,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
    DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
}

_FP8_FORMAT = {DType.kFloat8E4M3: fp8_formats.E4M3, DType.kFloat8E5M2: fp8_formats.E5M2}

# Block sizes of the block-scaled recipes (MXFP8: 32 elements per E8M0 scale; NVFP4: 16 per
# E4M3 scale; Float8BlockScaling: 128).
MXFP8_BLOCK_SCALING_SIZE = 32
NVFP4_BLOCK_SCALING_SIZE = 16
FP8_BLOCK_SCALING_SIZE = 128

dist_group_type = torch.distributed.ProcessGroup if torch.distributed.is_available() else object


def torch_dtype_of(dtype, device: Optional[torch.device] = None) -> torch.dtype:
    """The torch dtype of a DType (FP8: in the FP8 flavour of `device`) or of a torch dtype
    (returned as is)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, DType):
        raise TypeError(f"transformer_engine.pytorch.constants: expected a DType or torch.dtype, "
                        f"got {dtype!r}")
    fmt = _FP8_FORMAT.get(dtype)
    if fmt is None:
        return TE_DType_To_Torch[dtype]
    from .quantization import _flavor
    flavor = _flavor(torch.device(device)) if device is not None else fp8_formats.OCP
    return getattr(torch, fp8_formats.fp8_dtype_name(fmt, flavor))
