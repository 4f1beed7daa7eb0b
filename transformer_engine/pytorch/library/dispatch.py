"""The ops as the modules call them: eager calls go straight to transformer_engine.pytorch.kernels
(the thin fast path); while torch.compile traces, the same call goes through the registered
custom op (te_ops) so the graph holds one node per kernel and no data pointers."""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from ..kernels.gemm import GemmOutput
from ..kernels.normalization import NormOutput
from . import te_ops

_is_compiling = torch.compiler.is_compiling


def _te():
    return te_ops


def general_gemm(A, B, out_dtype=None, *, layout="TN", A_scale_inv=None, B_scale_inv=None,
                 bias=None, gelu=False, gelu_input=None, bias_grad=False, out=None,
                 accumulate=False, use_split_accumulator=False, addend=None) -> GemmOutput:
    if not _is_compiling():
        return kernels.general_gemm(A, B, out_dtype, layout=layout, A_scale_inv=A_scale_inv,
                                B_scale_inv=B_scale_inv, bias=bias, gelu=gelu, gelu_input=gelu_input,
                                bias_grad=bias_grad, out=out, accumulate=accumulate,
                                use_split_accumulator=use_split_accumulator, addend=addend)
    if addend is not None and accumulate:  # the op below never sees accumulate: refuse it here
        raise ValueError("general_gemm: addend and accumulate=True are exclusive (both are the "
                         "GEMM's C operand: accumulate adds out, addend another tensor)")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else (torch.bfloat16 if A_scale_inv is not None else A.dtype)
    # the addend rides the op (the GEMM's C operand), so the graph keeps one node for the fused add
    res, bgrad, aux = _te().gemm(A, B, out_dtype, layout, A_scale_inv, B_scale_inv, bias, gelu,
                                 gelu_input, bias_grad, use_split_accumulator, addend)
    if out is not None:  # traced form of "write into / accumulate into out"
        if accumulate:
            out.add_(res.view(out.shape))
        else:
            out.copy_(res.view(out.shape))
        res = out
    return GemmOutput(res, bgrad if bias_grad else None, aux if gelu else None)


def cast_transpose(x, scale, fp8_dtype, amax=None):
    if not _is_compiling():
        return kernels.cast_transpose(x, scale, fp8_dtype, amax)
    return _te().cast_transpose(x, scale, fp8_dtype, amax)


def quantize(x, scale, fp8_dtype, amax=None):
    if not _is_compiling():
        return kernels.quantize(x, scale, fp8_dtype, amax)
    return _te().quantize(x, scale, fp8_dtype, amax)


def transpose(x):
    if not _is_compiling():
        return kernels.transpose(x)
    return _te().transpose(x)


def compute_amax(x, amax):
    if not _is_compiling():
        return kernels.compute_amax(x, amax)
    # traced: plain torch (max|x| with NaN propagating, no host-side branch)
    cur = x.abs().amax().float().reshape(amax.shape) if x.numel() else torch.zeros_like(amax)
    amax.copy_(torch.where(torch.isnan(cur), cur, torch.maximum(amax, cur)))
    return amax


def norm_fwd(rms: bool, x, gamma, beta, eps, zero_centered_gamma, fp8_dtype=None, scale=None,
             amax=None) -> NormOutput:
    if not _is_compiling():
        kw = dict(fp8_dtype=fp8_dtype, scale=scale, amax=amax)
        if rms:
            return kernels.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma, **kw)
        return kernels.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, **kw)
    out, mu, rsigma, scale_inv = _te().norm_fwd(x, gamma, beta, float(eps), bool(zero_centered_gamma),
                                                rms, fp8_dtype, scale, amax)
    return NormOutput(out, None if rms else mu, rsigma, scale_inv if fp8_dtype is not None else None)


def norm_bwd(rms: bool, dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual=None):
    """(dx, dgamma, dbeta or None); dresidual: added into dx (kernels.layernorm_bwd)."""
    if not _is_compiling():
        if rms:
            dx, dgamma = kernels.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma, dresidual)
            return dx, dgamma, None
        return kernels.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual)
    dx, dgamma, dbeta = _te().norm_bwd(dz, x, mu, rsigma, gamma, bool(zero_centered_gamma), rms,
                                       dresidual)
    return dx, dgamma, (None if rms else dbeta)


def activation_forward(x, name, fp8_dtype: Optional[torch.dtype] = None, scale=None, amax=None):
    if not _is_compiling():
        return kernels.activation_forward(x, name, fp8_dtype, scale, amax)
    out, scale_inv = _te().act_fwd(x, name, fp8_dtype, scale, amax)
    return out if fp8_dtype is None else (out, scale_inv)


def activation_backward(grad, x, name):
    if not _is_compiling():
        return kernels.activation_backward(grad, x, name)
    return _te().act_bwd(grad, x, name)


def dbias_dactivation(grad, x, name, fp8_dtype=None, scale=None, amax=None):
    """(dx, dbias), or (dx_fp8, dbias, scale_inv) with fp8_dtype (eager only: delayed scaling,
    the one user of the FP8 form, is refused under torch.compile)."""
    if not _is_compiling():
        return kernels.dbias_dactivation(grad, x, name, fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    dx, dbias = _te().dbias_dact(grad, x, name)
    return dx, dbias


def dact_dbias_cast_transpose(grad, x, name, fp8_dtype, scale, amax, dbias_dtype=None):
    """(dx in FP8, its transpose, dbias or None, scale_inv) in one kernel with a known scale: the
    eager path's fused kernel, checked (delayed scaling, its one user, is refused under
    torch.compile, so this form is eager only)."""
    if _is_compiling():
        raise RuntimeError("dact_dbias_cast_transpose: eager only (delayed scaling)")
    return kernels.dact_dbias_cast_transpose(grad, x, name, scale, fp8_dtype, amax=amax,
                                             with_dbias=dbias_dtype is not None,
                                             dbias_dtype=dbias_dtype)


def dbias(grad, dbias_dtype=None):
    """grad's column sums (a linear layer's bias gradient) in dbias_dtype (default grad.dtype)."""
    if not _is_compiling():
        return kernels.dbias(grad, dbias_dtype)
    return _te().dbias(grad, dbias_dtype)


def current_scale(x, fp8_max: float, power_2: bool):
    """Float8CurrentScaling's scale of x while tracing (see quantization.compute_current_scale)."""
    return _te().current_scale(x, float(fp8_max), bool(power_2))
