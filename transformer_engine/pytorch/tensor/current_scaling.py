"""Current scaling of one tensor: scale = fp8_max / amax, the rule of Float8Tensor.quantize and of
in-place updates of FP8 weights (kept apart so that the FSDP hooks can use it without importing
the tensor class)."""
from __future__ import annotations

from typing import Optional

import torch

from ...common import fp8_formats


def fp8_max_of_dtype(fp8_dtype: torch.dtype) -> float:
    fmt, flavor = fp8_formats.format_of_dtype_name(str(fp8_dtype).replace("torch.", ""))
    return fp8_formats.fp8_max(fmt, flavor)


def amax_of(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a one-element float32 tensor on x's device (0 for an empty x)."""
    return x.abs().amax().float().reshape(1) if x.numel() else torch.zeros(1, device=x.device)


def quantize_current(x: torch.Tensor, fp8_dtype: torch.dtype, amax: Optional[torch.Tensor] = None):
    """(fp8 data, scale_inv) of x with scale = fp8_max / amax (default amax(x)), on x's device."""
    from ..kernels import quantize
    from ..quantization import scale_from_amax
    x = x.contiguous()
    if amax is None:
        amax = amax_of(x)
    scale = scale_from_amax(amax, torch.full((1,), fp8_max_of_dtype(fp8_dtype), device=x.device), False)
    data, scale_inv = quantize(x, scale.contiguous(), fp8_dtype)
    return data, scale_inv
