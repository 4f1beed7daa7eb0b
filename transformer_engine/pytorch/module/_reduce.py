"""The modules' bias gradients: column sums of the 2-D output gradient. Kept apart from the GEMM
and cast steps, which both need it, so that neither imports the other for it."""
from __future__ import annotations

import torch

from ..library import dispatch as K
from ..kernels import eager
from ..kernels.activation import dbias_unchecked


def bias_grad_of(dy2d: torch.Tensor, bias_dtype: torch.dtype) -> torch.Tensor:
    """Column sums of the 2-D output gradient in bias_dtype, summed in fp32: the native column
    sum (kernels.dbias; deterministic) on a GPU, through the direct call in eager mode, torch's sum
    on the reference backend."""
    if not dy2d.is_contiguous():
        dy2d = dy2d.contiguous()
    nc = eager.native_call(dy2d)
    if nc is not None:
        return dbias_unchecked(nc, dy2d, bias_dtype)
    return K.dbias(dy2d, bias_dtype)
