"""The GEMMs of a linear layer, in high precision or FP8, shared by Linear, LayerNormLinear and
LayerNormMLP (see ops/gemm.py for the layouts):

    fprop  y  = x @ W.T (+ b)   TN: A = W  [out, in],      B = x  [tokens, in]
    dgrad  dx = dy @ W          FP8 TN: A = W.T (cached),  B = dy; high precision NN
    wgrad  dW = dy.T @ x        FP8 TN: A = x.T, B = dy.T;  high precision NT
FP8 wgrad uses the split (precise) accumulator; with fuse_wgrad_accumulation it adds into the
weight's fp32 `main_grad` (beta = 1) and the weight gets no .grad.
"""
from __future__ import annotations

import torch

from ..library import dispatch as K
from ..tensor import Float8Tensor
from . import _fast
from ._casts import cast, transposed


def fp8_weight(module, weight, fi, slot: int, need_transpose: bool, is_first_microbatch, nc=None):
    """(data, data_t, scale_inv) of a weight in FP8: the Float8Tensor's own data, the per-step
    cache (is_first_microbatch=False reuses what the first microbatch cast), or a fresh cast."""
    if isinstance(weight, Float8Tensor):
        return weight._data, (weight.transpose_fp8() if need_transpose else None), weight._scale_inv
    cache = module._fp8_weight_cache if module is not None else None
    if is_first_microbatch is False and cache is not None and slot in cache:
        data, data_t, scale_inv = cache[slot]
        if need_transpose and data_t is None:
            data_t = transposed(data)
            cache[slot] = (data, data_t, scale_inv)
        return data, data_t, scale_inv
    if nc is not None:
        data, data_t, scale_inv = _fast.cast(nc, fi.rs, weight.contiguous(), True, slot, need_transpose)
    else:
        data, data_t, scale_inv = cast(fi.rs, weight.contiguous(), True, slot, need_transpose,
                                       fi.replay, fi.record)
    if is_first_microbatch is not None and module is not None:
        if module._fp8_weight_cache is None:
            module._fp8_weight_cache = {}
        module._fp8_weight_cache[slot] = (data, data_t, scale_inv)
    return data, data_t, scale_inv


def fprop_fp8(wq, w_sinv, xq, x_sinv, out_dtype, bias=None, gelu=False):
    return K.general_gemm(wq, xq, out_dtype, layout="TN", A_scale_inv=w_sinv, B_scale_inv=x_sinv,
                            bias=bias, gelu=gelu)


def dgrad_fp8(wq_t, w_sinv, dyq, dy_sinv, out_dtype):
    return K.general_gemm(wq_t, dyq, out_dtype, layout="TN", A_scale_inv=w_sinv,
                            B_scale_inv=dy_sinv).out


def wgrad_out(weight, fuse_wgrad_accumulation: bool):
    """(out buffer, accumulate) for the weight gradient: main_grad when fused, else new."""
    if fuse_wgrad_accumulation:
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None:
            raise ValueError("fuse_wgrad_accumulation=True needs weight.main_grad (an fp32 tensor of "
                             "the weight's shape) to accumulate into; set it before backward")
        return main_grad, True
    return None, False


def wgrad_fp8(xq_t, x_sinv, dyq_t, dy_sinv, out_dtype, weight, fuse):
    out, acc = wgrad_out(weight, fuse)
    res = K.general_gemm(xq_t, dyq_t, out.dtype if out is not None else out_dtype, layout="TN",
                           A_scale_inv=x_sinv, B_scale_inv=dy_sinv, out=out,
                           accumulate=acc, use_split_accumulator=True).out
    return None if fuse else res


def wgrad_hp(x2d, dy2d, weight, fuse, out_features: int, in_features: int):
    out, acc = wgrad_out(weight, fuse)
    if x2d.shape[0] == 0:
        if fuse:
            return None
        return torch.zeros(out_features, in_features, dtype=dy2d.dtype, device=dy2d.device)
    res = K.general_gemm(x2d, dy2d, out.dtype if out is not None else dy2d.dtype, layout="NT",
                           out=out, accumulate=acc).out
    return None if fuse else res


def dgrad_hp(w, dy2d):
    return K.general_gemm(w, dy2d, layout="NN").out


def bias_grad_of(dy2d: torch.Tensor, bias_dtype: torch.dtype) -> torch.Tensor:
    """Column sums of the output gradient (torch accumulates 16-bit sums in fp32)."""
    db = dy2d.sum(0)
    return db if db.dtype == bias_dtype else db.to(bias_dtype)
