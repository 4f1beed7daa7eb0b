"""LayerNorm and RMSNorm over the last dimension: forward (optionally straight to FP8) and backward.

Each op runs the native kernel for CUDA/ROCm tensors when the native core is built for this
torch, and its plain-torch reference (defined next to it) otherwise. The maths, in fp32
(csrc/common/include/transformer_engine/normalization.h has the full statement):
  LayerNorm:  mu = mean(x), rsigma = 1/sqrt(var(x) + eps), z = (x - mu) * rsigma * g + beta
  RMSNorm:    rsigma = 1/sqrt(mean(x^2) + eps),            z = x * rsigma * g
  g = gamma, or 1 + gamma with zero_centered_gamma.
z is returned in x's dtype, or quantised to FP8 exactly like kernels.quantize of the fp32 z.
gamma/beta are in x's dtype or float32; mu/rsigma are float32 with x's leading shape.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .. import native
from ..native import address, describe
from ._checks import check_fp8_dtype, check_scalar_fp32, check_tensor
from .cast import quantize_reference


class NormOutput(NamedTuple):
    out: torch.Tensor                  # x's dtype, or FP8 data
    mu: Optional[torch.Tensor]         # LayerNorm only
    rsigma: torch.Tensor
    scale_inv: Optional[torch.Tensor]  # FP8 output only


# ----- references ----------------------------------------------------------------------------

def _gamma(gamma, zero_centered_gamma):
    g = gamma.float()
    return g + 1.0 if zero_centered_gamma else g


def layernorm_fwd_reference(x, gamma, beta, eps=1e-5, zero_centered_gamma=False):
    """(z in fp32, mu, rsigma), computed in fp32 with plain torch ops."""
    xf = x.float()
    mu = xf.mean(-1)
    var = (xf - mu.unsqueeze(-1)).square().mean(-1)
    rsigma = torch.rsqrt(var + eps)
    z = (xf - mu.unsqueeze(-1)) * rsigma.unsqueeze(-1) * _gamma(gamma, zero_centered_gamma) + beta.float()
    return z, mu, rsigma


def rmsnorm_fwd_reference(x, gamma, eps=1e-5, zero_centered_gamma=False):
    """(z in fp32, rsigma)."""
    xf = x.float()
    rsigma = torch.rsqrt(xf.square().mean(-1) + eps)
    return xf * rsigma.unsqueeze(-1) * _gamma(gamma, zero_centered_gamma), rsigma


def _norm_bwd_reference(dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual=None):
    hidden = x.shape[-1]
    xf, dzf = x.float(), dz.float()
    rs = rsigma.unsqueeze(-1)
    xhat = (xf - mu.unsqueeze(-1)) * rs if mu is not None else xf * rs
    dy = dzf * _gamma(gamma, zero_centered_gamma)
    dx = dy - (dy * xhat).mean(-1, keepdim=True) * xhat
    if mu is not None:
        dx = dx - dy.mean(-1, keepdim=True)
    dgamma = (dzf * xhat).reshape(-1, hidden).sum(0)
    dbeta = dzf.reshape(-1, hidden).sum(0)
    dx = rs * dx
    if dresidual is not None:  # summed in fp32, rounded once, as the kernel does
        dx = dx + dresidual.float()
    return dx.to(x.dtype), dgamma.to(gamma.dtype), dbeta.to(gamma.dtype)


def layernorm_bwd_reference(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta) from the closed-form LayerNorm gradient, in fp32."""
    return _norm_bwd_reference(dz, x, mu, rsigma, gamma, zero_centered_gamma)


def rmsnorm_bwd_reference(dz, x, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma)."""
    return _norm_bwd_reference(dz, x, None, rsigma, gamma, zero_centered_gamma)[:2]


# ----- checks --------------------------------------------------------------------------------

def _name(dtype):
    return str(dtype).replace("torch.", "")


def _check_weights(op, x, weights):
    hidden = x.shape[-1]
    w_dtype = weights[0][1].dtype if isinstance(weights[0][1], torch.Tensor) else None
    for name, w in weights:
        check_tensor(op, name, w, native.HP_DTYPES)
        if w.numel() != hidden:
            raise ValueError(f"{op}: {name} has shape {tuple(w.shape)}; expected {hidden} elements "
                             f"(the last dimension of x)")
        if w.dtype not in (x.dtype, torch.float32) or w.dtype != w_dtype:
            raise ValueError(f"{op}: {name} has dtype {_name(w.dtype)}; expected x's dtype "
                             f"{_name(x.dtype)} or float32, the same for every weight")
        if w.device != x.device:
            raise ValueError(f"{op}: {name} is on {w.device}; expected {x.device} like x")


def _check_x(op, name, x):
    check_tensor(op, name, x, native.HP_DTYPES)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected a last dimension >= 1")


def _check_stat(op, name, t, x):
    check_tensor(op, name, t, (torch.float32,))
    if t.numel() != x.numel() // x.shape[-1] or t.device != x.device:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} on {t.device}; expected "
                         f"{tuple(x.shape[:-1])} on {x.device} (one value per row of x)")


def _check_like(op, name, t, x):
    check_tensor(op, name, t, (x.dtype,))
    if t.shape != x.shape or t.device != x.device:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} on {t.device}; expected "
                         f"{tuple(x.shape)} on {x.device} like x")


# ----- forward -------------------------------------------------------------------------------

def _forward(op, rms, x, gamma, beta, eps, zero_centered_gamma, fp8_dtype, scale, amax, scale_inv):
    _check_x(op, "x", x)
    _check_weights(op, x, [("gamma", gamma)] + ([] if rms else [("beta", beta)]))
    if not eps >= 0.0:
        raise ValueError(f"{op}: eps is {eps}; expected a value >= 0")
    fp8 = fp8_dtype is not None
    if fp8:
        check_fp8_dtype(op, fp8_dtype, x.device)
        check_scalar_fp32(op, "scale", scale, x.device)
        if amax is not None:
            check_scalar_fp32(op, "amax", amax, x.device)
        if scale_inv is None:
            scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
        else:
            check_scalar_fp32(op, "scale_inv", scale_inv, x.device)
    stats_shape = x.shape[:-1]
    if native.use_native(x):
        out = torch.empty(x.shape, dtype=fp8_dtype if fp8 else x.dtype, device=x.device)
        mu = None if rms else torch.empty(stats_shape, dtype=torch.float32, device=x.device)
        rsigma = torch.empty(stats_shape, dtype=torch.float32, device=x.device)
        z_desc = native.describe(out, amax, scale, scale_inv) if fp8 else native.describe(out)
        mod, stream = native.native_for_torch(), native.stream_of(x)
        if rms:
            mod.rmsnorm_fwd(native.describe(x), native.describe(gamma), float(eps),
                            bool(zero_centered_gamma), z_desc, native.describe(rsigma), stream)
        else:
            mod.layernorm_fwd(native.describe(x), native.describe(gamma), native.describe(beta),
                              float(eps), bool(zero_centered_gamma), z_desc, native.describe(mu),
                              native.describe(rsigma), stream)
        return NormOutput(out, mu, rsigma, scale_inv if fp8 else None)
    if rms:
        z, rsigma = rmsnorm_fwd_reference(x, gamma, eps, zero_centered_gamma)
        mu = None
    else:
        z, mu, rsigma = layernorm_fwd_reference(x, gamma, beta, eps, zero_centered_gamma)
    if not fp8:
        return NormOutput(z.to(x.dtype), mu, rsigma, None)
    data, ref_scale_inv, ref_amax = quantize_reference(z, scale, fp8_dtype)
    scale_inv.copy_(ref_scale_inv.reshape(scale_inv.shape))
    if amax is not None:
        merged = ref_amax if torch.isnan(ref_amax).any() else torch.maximum(amax.reshape(1), ref_amax)
        amax.copy_(merged.reshape(amax.shape))
    return NormOutput(data, mu, rsigma, scale_inv)


def layernorm_fwd(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-5,
                  zero_centered_gamma: bool = False, *, fp8_dtype: Optional[torch.dtype] = None,
                  scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                  scale_inv: Optional[torch.Tensor] = None) -> NormOutput:
    """LayerNorm of x over its last dimension: NormOutput(out, mu, rsigma, scale_inv).

    With fp8_dtype, out is quantised with `scale` (one fp32 value); `amax`, if given, is updated in
    place with max|z| of the unscaled result and `scale_inv` (created if not given) receives 1/scale.
    """
    return _forward("layernorm_fwd", False, x, gamma, beta, eps, zero_centered_gamma, fp8_dtype,
                    scale, amax, scale_inv)


def rmsnorm_fwd(x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-5,
                zero_centered_gamma: bool = False, *, fp8_dtype: Optional[torch.dtype] = None,
                scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                scale_inv: Optional[torch.Tensor] = None) -> NormOutput:
    """RMSNorm of x over its last dimension: NormOutput(out, None, rsigma, scale_inv)."""
    return _forward("rmsnorm_fwd", True, x, gamma, None, eps, zero_centered_gamma, fp8_dtype,
                    scale, amax, scale_inv)


# ----- backward ------------------------------------------------------------------------------

def _backward(op, rms, dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual):
    _check_x(op, "x", x)
    _check_like(op, "dz", dz, x)
    if dresidual is not None:
        _check_like(op, "dresidual", dresidual, x)
    if not rms:
        _check_stat(op, "mu", mu, x)
    _check_stat(op, "rsigma", rsigma, x)
    _check_weights(op, x, [("gamma", gamma)])
    if not native.use_native(x):
        return _norm_bwd_reference(dz, x, mu, rsigma, gamma, zero_centered_gamma, dresidual)
    dx = torch.empty_like(x)
    dres = native.describe(dresidual) if dresidual is not None else None
    dgamma = torch.empty_like(gamma)
    dbeta = None if rms else torch.empty_like(gamma)
    mod, stream = native.native_for_torch(), native.stream_of(x)

    def call(workspace_desc):
        if rms:
            return mod.rmsnorm_bwd(native.describe(dz), native.describe(x), native.describe(rsigma),
                                   native.describe(gamma), bool(zero_centered_gamma),
                                   native.describe(dx), native.describe(dgamma), workspace_desc,
                                   dres, stream)
        return mod.layernorm_bwd(native.describe(dz), native.describe(x), native.describe(mu),
                                 native.describe(rsigma), native.describe(gamma),
                                 bool(zero_centered_gamma), native.describe(dx),
                                 native.describe(dgamma), native.describe(dbeta), workspace_desc,
                                 dres, stream)

    # First call with a null workspace asks for its size; the second does the work.
    nbytes = call((0, (0,), native.DTYPE_CODE[torch.uint8], 0, 0, 0))
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    call(native.describe(workspace))
    return dx, dgamma, dbeta


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor,
                  gamma: torch.Tensor, zero_centered_gamma: bool = False,
                  dresidual: Optional[torch.Tensor] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dgamma, dbeta) of LayerNorm, given the forward's mu and rsigma. dresidual (x's shape
    and dtype), when given, is added into dx in fp32 before rounding: the gradient of a residual
    connection around the norm, without a separate add."""
    return _backward("layernorm_bwd", False, dz, x, mu, rsigma, gamma, zero_centered_gamma,
                     dresidual)


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                zero_centered_gamma: bool = False, dresidual: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dx, dgamma) of RMSNorm, given the forward's rsigma; dresidual as in layernorm_bwd."""
    return _backward("rmsnorm_bwd", True, dz, x, None, rsigma, gamma, zero_centered_gamma,
                     dresidual)[:2]


# ----- autograd ------------------------------------------------------------------------------

class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, eps, zero_centered_gamma):
        res = layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma)
        ctx.save_for_backward(x, gamma, res.mu, res.rsigma)
        ctx.zero_centered_gamma = zero_centered_gamma
        return res.out

    @staticmethod
    def backward(ctx, dz):
        x, gamma, mu, rsigma = ctx.saved_tensors
        dx, dgamma, dbeta = layernorm_bwd(dz.contiguous(), x, mu, rsigma, gamma,
                                          ctx.zero_centered_gamma)
        return dx, dgamma, dbeta, None, None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, eps, zero_centered_gamma):
        res = rmsnorm_fwd(x, gamma, eps, zero_centered_gamma)
        ctx.save_for_backward(x, gamma, res.rsigma)
        ctx.zero_centered_gamma = zero_centered_gamma
        return res.out

    @staticmethod
    def backward(ctx, dz):
        x, gamma, rsigma = ctx.saved_tensors
        dx, dgamma = rmsnorm_bwd(dz.contiguous(), x, rsigma, gamma, ctx.zero_centered_gamma)
        return dx, dgamma, None, None


def layernorm(x, gamma, beta, eps=1e-5, zero_centered_gamma=False):
    """Differentiable LayerNorm (native forward and backward where available)."""
    return _LayerNorm.apply(x, gamma, beta, eps, zero_centered_gamma)


def rmsnorm(x, gamma, eps=1e-5, zero_centered_gamma=False):
    """Differentiable RMSNorm (native forward and backward where available)."""
    return _RMSNorm.apply(x, gamma, eps, zero_centered_gamma)


# ----- the unchecked calls of the modules' eager path (nc: a NativeCall, kernels/eager.py) ------
def norm_fwd_unchecked(nc, rms, x, gamma, beta, eps, zcg, fp8_dtype=None, scale=None, amax=None):
    """(out, mu or None, rsigma, scale_inv or None) of LayerNorm/RMSNorm over a 2-D x; FP8 out
    when fp8_dtype is given (scale and amax as tensors of the recipe state)."""
    rows, device = x.shape[0], x.device
    rsigma = torch.empty(rows, dtype=torch.float32, device=device)
    if fp8_dtype is not None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=device)
        out = torch.empty(x.shape, dtype=fp8_dtype, device=device)
        z = describe(out, address(amax), scale.data_ptr(), scale_inv.data_ptr())
    else:
        scale_inv, out = None, torch.empty(x.shape, dtype=x.dtype, device=device)
        z = describe(out)
    if rms:
        nc.mod.rmsnorm_fwd(describe(x), describe(gamma), float(eps), zcg, z, describe(rsigma), nc.stream)
        return out, None, rsigma, scale_inv
    mu = torch.empty(rows, dtype=torch.float32, device=device)
    nc.mod.layernorm_fwd(describe(x), describe(gamma), describe(beta), float(eps), zcg, z, describe(mu),
                         describe(rsigma), nc.stream)
    return out, mu, rsigma, scale_inv


_NORM_BWD_WS: dict = {}
_NULL_WS = (0, (0,), native.DTYPE_CODE[torch.uint8], 0, 0, 0)


def norm_bwd_unchecked(nc, rms, dz, x, mu, rsigma, gamma, zcg, dresidual=None):
    """(dx, dgamma, dbeta or None), dresidual (or None) added into dx; the workspace size is
    asked once per problem and kept."""
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    dbeta = None if rms else torch.empty_like(gamma)
    if rms:
        args = [describe(dz), describe(x), describe(rsigma), describe(gamma), zcg, describe(dx), describe(dgamma)]
        fn = nc.mod.rmsnorm_bwd
    else:
        args = [describe(dz), describe(x), describe(mu), describe(rsigma), describe(gamma), zcg, describe(dx),
                describe(dgamma), describe(dbeta)]
        fn = nc.mod.layernorm_bwd
    key = (rms, tuple(x.shape), x.dtype, gamma.dtype, x.device)
    nbytes = _NORM_BWD_WS.get(key)
    if nbytes is None:
        nbytes = _NORM_BWD_WS[key] = fn(*args, _NULL_WS, None, nc.stream)
    ws = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    fn(*args, describe(ws), describe(dresidual) if dresidual is not None else None, nc.stream)
    return dx, dgamma, dbeta
