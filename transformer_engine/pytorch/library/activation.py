"""The modules' bias gradients: column sums of a 2-D output gradient, in fp32 (the reduction of
the activation family's dbias kernels): the unchecked native call in eager mode, the checked op
(or its traced custom op) otherwise. Used by the GEMM and cast steps alike, so that neither
imports the other for it."""
from __future__ import annotations

import torch

from . import dispatch as K
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
