"""Small helpers shared by the basic operations."""
from __future__ import annotations

from typing import Optional

import torch

from ...tensor import QuantizedTensor
from ..op import op_name


def default_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def default_dtype(op_cls: str, dtype: Optional[torch.dtype]) -> torch.dtype:
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"transformer_engine.pytorch.ops.{op_cls}: dtype is {dtype}; expected "
                        "torch.float32, torch.float16 or torch.bfloat16")
    return dtype


def positive_int(op_cls: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"transformer_engine.pytorch.ops.{op_cls}: {name} is {value!r}; "
                         "expected a positive int")
    return value


def high_precision(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype` (dequantised when it is a quantized tensor), contiguous."""
    if isinstance(x, QuantizedTensor):
        x = x.dequantize(dtype)
    elif x.dtype != dtype:
        x = x.to(dtype)
    return x.contiguous()


def param_as(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return p if p.dtype == dtype else p.to(dtype)


def check_device(op, x: torch.Tensor, param: torch.Tensor) -> None:
    if x.device != param.device:
        raise ValueError(f"{op_name(op)}: input is on {x.device}; expected {param.device}, where "
                         "the operation's parameters are")


def check_last_dim(op, x: torch.Tensor, expected: int, what: str) -> None:
    if x.dim() < 1 or x.shape[-1] != expected:
        raise ValueError(f"{op_name(op)}: input has shape {tuple(x.shape)}; expected the last "
                         f"dimension to be {what} ({expected})")
