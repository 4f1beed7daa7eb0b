"""The activation family as the modules call it: in eager mode on the native core the unchecked
calls (kernels/activation.py, kernels/cast_fused.py), otherwise the checked ops (dispatch: the
kernels or, traced, their custom ops).

- bias_grad_of: column sums of a 2-D output gradient in fp32 (the family's dbias reduction);
  used by the GEMM and cast steps alike, so that neither imports the other for it.
- the FP8 forms of LayerNormMLP's activation with the module's own delayed scale: the
  activation writing FP8 (and its transpose), its derivative writing FP8 (with the bias
  gradient and the transpose). The fused one-pass forms answer None where the eager native path
  does not serve them (the module then runs the separate steps).
"""
from __future__ import annotations

import torch

from . import dispatch as K
from ..kernels import eager
from ..kernels.activation import (ACTIVATIONS, CLAMPED_SWIGLU, GATED, activation_fp8_unchecked,
                                  dbias_dactivation_fp8_unchecked, dbias_unchecked)
from ..kernels.cast_fused import act_cast_transpose_unchecked, dact_dbias_cast_transpose_unchecked


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


def _code(activation: str) -> int:
    """The native activation code (a gated form's code is its plain activation's)."""
    return ACTIVATIONS[GATED.get(activation, activation)]


def _fused_call(fi, h, backward=False):
    """The eager native call for the fused kernels that use the module's own scale (not a
    checkpoint's recorded one), else None."""
    ok = eager.usable_backward(fi) if backward else eager.usable(fi)
    if not ok or h.dim() != 2 or not h.is_contiguous():
        return None
    return eager.native_call(h)


def act_cast_transpose(fi, h, activation: str, slot: int):
    """(act(h) in FP8, its transpose, scale_inv) in one pass with the module's delayed scale of
    forward `slot`, or None where the eager native path does not serve it."""
    if not fi.rs.delayed or activation == CLAMPED_SWIGLU:
        return None
    nc = _fused_call(fi, h)
    if nc is None:
        return None
    return act_cast_transpose_unchecked(nc, fi.rs, h, _code(activation), activation in GATED, slot)


def activation_fp8(h, activation: str, fp8_dtype, scale, amax):
    """(act(h) in FP8, scale_inv) with a known scale: the activation kernel casts as it writes
    (not for clamped SwiGLU, whose parameters the module holds)."""
    nc = eager.native_call(h) if h.dim() == 2 and h.is_contiguous() else None
    if nc is not None:
        return activation_fp8_unchecked(nc, h, _code(activation), activation in GATED, fp8_dtype,
                                        scale, amax)
    return K.activation_forward(h, activation, fp8_dtype, scale, amax)


def dact_cast_transpose(fi, da, h, activation: str, slot: int, dbias_dtype):
    """(dh in FP8, its transpose, dbias or None, scale_inv): dh = da * act'(h) (gated: both
    halves), cast with the module's delayed scale of backward `slot`, transposed and (dbias_dtype
    not None) column-summed in one pass; None where the eager native path does not serve it."""
    if (not fi.rs.delayed or activation == CLAMPED_SWIGLU or not da.is_contiguous()
            or da.dtype != h.dtype):
        return None
    nc = _fused_call(fi, h, backward=True)
    if nc is None:
        return None
    return dact_dbias_cast_transpose_unchecked(nc, fi.rs, da, h, _code(activation),
                                               activation in GATED, slot, dbias_dtype)


def dbias_dactivation_fp8(da, h, activation: str, fp8_dtype, scale, amax):
    """(dh in FP8, dbias, scale_inv) of a plain activation in one kernel with a known scale."""
    nc = (eager.native_call(h) if h.dim() == 2 and h.is_contiguous() and da.is_contiguous()
          and da.dtype == h.dtype else None)
    if nc is not None:
        return dbias_dactivation_fp8_unchecked(nc, da, h, ACTIVATIONS[activation], h.dtype,
                                               fp8_dtype, scale, amax)
    return K.dbias_dactivation(da, h, activation, fp8_dtype=fp8_dtype, scale=scale, amax=amax)
