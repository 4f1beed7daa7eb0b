"""The custom ops (namespace `te`). Each real implementation calls the eager op of
transformer_engine.pytorch.kernels; each fake implementation only describes the outputs. Optional
outputs come back as empty tensors (custom ops cannot return None)."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import kernels

_EMPTY = (0,)


def _empty(like: Tensor, dtype=None) -> Tensor:
    return torch.empty(_EMPTY, dtype=dtype or like.dtype, device=like.device)


def _gemm_shapes(A, B, layout):
    transa, transb = layout[0] == "T", layout[1] == "T"
    a_rows, a_cols = math.prod(A.shape[:-1]), A.shape[-1]
    m = a_rows if transa else a_cols
    if transb:
        n = B.shape[-1]
        out_shape = [n, m]
    else:
        out_shape = list(B.shape[:-1]) + [m]
    return m, out_shape


def _side_dtypes(out_dtype):
    fp8_out = out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    return (torch.bfloat16 if fp8_out else out_dtype), (torch.float16 if fp8_out else out_dtype)


@torch.library.custom_op("te::gemm", mutates_args=())
def gemm(A: Tensor, B: Tensor, out_dtype: torch.dtype, layout: str, A_scale_inv: Optional[Tensor],
         B_scale_inv: Optional[Tensor], bias: Optional[Tensor], gelu: bool,
         gelu_input: Optional[Tensor], bias_grad: bool, use_split_accumulator: bool,
         addend: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    r = kernels.general_gemm(A, B, out_dtype, layout=layout, A_scale_inv=A_scale_inv,
                         B_scale_inv=B_scale_inv, bias=bias, gelu=gelu, gelu_input=gelu_input,
                         bias_grad=bias_grad, use_split_accumulator=use_split_accumulator,
                         addend=addend)
    side, aux = _side_dtypes(out_dtype)
    return (r.out, r.bias_grad if r.bias_grad is not None else _empty(A, side),
            r.gelu_input if r.gelu_input is not None else _empty(A, aux))


@gemm.register_fake
def _(A, B, out_dtype, layout, A_scale_inv, B_scale_inv, bias, gelu, gelu_input, bias_grad,
      use_split_accumulator, addend=None):
    m, out_shape = _gemm_shapes(A, B, layout)
    side, aux = _side_dtypes(out_dtype)
    out = A.new_empty(out_shape, dtype=out_dtype)
    # the bias gradient has D's m columns (dGELU epilogue) or op_b(B)'s n rows (BGradB)
    bgrad_shape = ([m] if gelu_input is not None else [out_shape[0]]) if bias_grad else list(_EMPTY)
    bgrad = A.new_empty(bgrad_shape, dtype=side)
    aux_t = A.new_empty(out_shape if gelu else list(_EMPTY), dtype=aux)
    return out, bgrad, aux_t


@torch.library.custom_op("te::cast_transpose", mutates_args=("amax",))
def cast_transpose(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype, amax: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor, Tensor]:
    return kernels.cast_transpose(x, scale, fp8_dtype, amax)


@cast_transpose.register_fake
def _(x, scale, fp8_dtype, amax):
    rows, cols = math.prod(x.shape[:-1]), x.shape[-1]
    return (x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty([cols, rows], dtype=fp8_dtype),
            x.new_empty([1], dtype=torch.float32))


@torch.library.custom_op("te::quantize", mutates_args=("amax",))
def quantize(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype, amax: Optional[Tensor]
             ) -> Tuple[Tensor, Tensor]:
    return kernels.quantize(x, scale, fp8_dtype, amax)


@quantize.register_fake
def _(x, scale, fp8_dtype, amax):
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty([1], dtype=torch.float32)


@torch.library.custom_op("te::transpose", mutates_args=())
def transpose(x: Tensor) -> Tensor:
    return kernels.transpose(x)


@transpose.register_fake
def _(x):
    return x.new_empty([x.shape[-1], math.prod(x.shape[:-1])])


@torch.library.custom_op("te::norm_fwd", mutates_args=("amax",))
def norm_fwd(x: Tensor, gamma: Tensor, beta: Optional[Tensor], eps: float, zero_centered_gamma: bool,
             rms: bool, fp8_dtype: Optional[torch.dtype], scale: Optional[Tensor],
             amax: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    kw = dict(fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    if rms:
        r = kernels.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma, **kw)
    else:
        r = kernels.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, **kw)
    f32 = torch.float32
    return (r.out, r.mu if r.mu is not None else _empty(x, f32), r.rsigma,
            r.scale_inv if r.scale_inv is not None else _empty(x, f32))


@norm_fwd.register_fake
def _(x, gamma, beta, eps, zero_centered_gamma, rms, fp8_dtype, scale, amax):
    f32 = torch.float32
    stats = list(x.shape[:-1])
    return (x.new_empty(x.shape, dtype=fp8_dtype or x.dtype),
            x.new_empty(list(_EMPTY) if rms else stats, dtype=f32), x.new_empty(stats, dtype=f32),
            x.new_empty([1] if fp8_dtype is not None else list(_EMPTY), dtype=f32))


@torch.library.custom_op("te::norm_bwd", mutates_args=())
def norm_bwd(dz: Tensor, x: Tensor, mu: Optional[Tensor], rsigma: Tensor, gamma: Tensor,
             zero_centered_gamma: bool, rms: bool, dresidual: Optional[Tensor] = None
             ) -> Tuple[Tensor, Tensor, Tensor]:
    if rms:
        dx, dgamma = kernels.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma, dresidual)
        return dx, dgamma, _empty(gamma)
    return kernels.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual)


@norm_bwd.register_fake
def _(dz, x, mu, rsigma, gamma, zero_centered_gamma, rms, dresidual=None):
    return (torch.empty_like(x), torch.empty_like(gamma),
            gamma.new_empty(list(_EMPTY)) if rms else torch.empty_like(gamma))


def _act_out_shape(x, name):
    from ..kernels.activation import GATED
    return list(x.shape[:-1]) + [x.shape[-1] // 2] if name in GATED else list(x.shape)


@torch.library.custom_op("te::act_fwd", mutates_args=("amax",))
def act_fwd(x: Tensor, name: str, fp8_dtype: Optional[torch.dtype], scale: Optional[Tensor],
            amax: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    if fp8_dtype is None:
        return kernels.activation_forward(x, name), _empty(x, torch.float32)
    return kernels.activation_forward(x, name, fp8_dtype, scale, amax)


@act_fwd.register_fake
def _(x, name, fp8_dtype, scale, amax):
    return (x.new_empty(_act_out_shape(x, name), dtype=fp8_dtype or x.dtype),
            x.new_empty([1] if fp8_dtype is not None else list(_EMPTY), dtype=torch.float32))


def _dact_reference(grad: Tensor, x: Tensor, name: str) -> Tensor:
    """fp32 d act / dx applied to grad. Inside a custom op autograd is switched off, so the
    reference (which asks autograd) is replayed with torch.func.vjp instead."""
    from ..kernels.activation import activation_fp32_reference
    _, vjp = torch.func.vjp(lambda t: activation_fp32_reference(t, name), x.float())
    return vjp(grad.float())[0]


def _native(t: Tensor) -> bool:
    from .. import native
    return native.use_native(t)


@torch.library.custom_op("te::act_bwd", mutates_args=())
def act_bwd(grad: Tensor, x: Tensor, name: str) -> Tensor:
    if _native(x):
        return kernels.activation_backward(grad, x, name)
    return _dact_reference(grad, x, name).to(x.dtype)


@act_bwd.register_fake
def _(grad, x, name):
    return torch.empty_like(x)


@torch.library.custom_op("te::dbias_dact", mutates_args=())
def dbias_dact(grad: Tensor, x: Tensor, name: str) -> List[Tensor]:
    if _native(x):
        return list(kernels.dbias_dactivation(grad, x, name))
    dx = _dact_reference(grad, x, name)
    return [dx.to(x.dtype), dx.reshape(-1, x.shape[-1]).sum(0).to(x.dtype)]


@dbias_dact.register_fake
def _(grad, x, name):
    return [torch.empty_like(x), x.new_empty([x.shape[-1]])]


@torch.library.custom_op("te::dbias", mutates_args=())
def dbias(grad: Tensor, dbias_dtype: Optional[torch.dtype]) -> Tensor:
    return kernels.dbias(grad.contiguous(), dbias_dtype)


@dbias.register_fake
def _(grad, dbias_dtype):
    return grad.new_empty([grad.shape[-1]], dtype=dbias_dtype or grad.dtype)


@torch.library.custom_op("te::current_scale", mutates_args=())
def current_scale(x: Tensor, fp8_max: float, power_2: bool) -> Tensor:
    from ..quantization import compute_current_scale
    f32 = dict(dtype=torch.float32, device=x.device)
    scale = torch.ones(1, **f32)
    compute_current_scale(x, torch.zeros(1, **f32), scale, torch.ones(1, **f32), fp8_max, power_2)
    return scale


@current_scale.register_fake
def _(x, fp8_max, power_2):
    return x.new_empty([1], dtype=torch.float32)
