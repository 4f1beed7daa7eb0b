"""LayerNorm / RMSNorm forward (optionally FP8 out) and backward: XLA FFI custom calls on the
GPU, the jnp references elsewhere; `layernorm` is the differentiable form (jax.custom_vjp)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import kernels
from .registry import empty, f32, ffi, i64, native, query_descriptor, scalar1, sds, use_custom_call

_F32 = jnp.float32
_TYPES = ("layernorm", "rmsnorm")


def _check(op, x, gamma, beta, rms):
    if x.ndim < 1:
        raise ValueError(f"{op}: x is a scalar; expected [..., hidden]")
    hidden = x.shape[-1]
    if gamma.shape != (hidden,):
        raise ValueError(f"{op}: gamma has shape {gamma.shape}; expected ({hidden},)")
    if not rms and (beta is None or beta.shape != (hidden,)):
        raise ValueError(f"{op}: beta has shape {None if beta is None else beta.shape}; "
                         f"expected ({hidden},)")


def _fwd_call(x, gamma, beta, eps, zero_centered_gamma, rms, z_dtype, scale):
    fp8 = scale is not None
    stats = x.shape[:-1]
    results = (sds(x.shape, z_dtype), sds((0,) if rms else stats, _F32), sds(stats, _F32),
               sds((1,), _F32), sds((1,), _F32))
    call = ffi("te_norm_fwd_ffi", results, aliases={4: 4})
    z, mu, rsigma, scale_inv, amax = call(
        x, gamma, empty(gamma.dtype) if rms else beta, scalar1(scale) if fp8 else scalar1(1.0),
        jnp.zeros((1,), _F32), epsilon=f32(eps), zero_centered_gamma=i64(zero_centered_gamma),
        rms=i64(rms))
    return z, (None if rms else mu), rsigma, scale_inv, amax


def norm_fwd(x, gamma, beta, eps=1e-5, zero_centered_gamma=False, layernorm_type="layernorm",
             fp8_dtype=None, scale=None):
    """(z, mu or None, rsigma, scale_inv, amax); scale_inv/amax are None unless FP8 out."""
    if layernorm_type not in _TYPES:
        raise ValueError(f"norm_fwd: layernorm_type is {layernorm_type!r}; expected {_TYPES}")
    rms = layernorm_type == "rmsnorm"
    _check(f"{layernorm_type}_fwd", x, gamma, beta, rms)
    if fp8_dtype is not None and scale is None:
        raise ValueError(f"{layernorm_type}_fwd: scale is required for an FP8 output")
    if use_custom_call(layernorm_type):
        z, mu, rs, si, amax = _fwd_call(x, gamma, beta, eps, zero_centered_gamma, rms,
                                        fp8_dtype or x.dtype, scale)
        return (z, mu, rs, si, amax) if fp8_dtype is not None else (z, mu, rs, None, None)
    if rms:
        if fp8_dtype is None:
            z, rs = kernels.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma)
            return z, None, rs, None, None
        z, rs, si, amax = kernels.rmsnorm_fwd_fp8(x, gamma, scale, fp8_dtype, eps, zero_centered_gamma)
        return z, None, rs, si, amax
    if fp8_dtype is None:
        z, mu, rs = kernels.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma)
        return z, mu, rs, None, None
    return kernels.layernorm_fwd_fp8(x, gamma, beta, scale, fp8_dtype, eps, zero_centered_gamma)


def _workspace_bytes(dz, x, gamma, zero_centered_gamma, rms):
    q = query_descriptor
    stats = q(x.shape[:-1], _F32)
    null_ws = (0, (0,), 7, 0, 0, 0)
    mod = native()
    if rms:
        return mod.rmsnorm_bwd(q(dz.shape, dz.dtype), q(x.shape, x.dtype), stats,
                               q(gamma.shape, gamma.dtype), bool(zero_centered_gamma),
                               q(x.shape, x.dtype), q(gamma.shape, gamma.dtype), null_ws, None, 0)
    return mod.layernorm_bwd(q(dz.shape, dz.dtype), q(x.shape, x.dtype), stats, stats,
                             q(gamma.shape, gamma.dtype), bool(zero_centered_gamma),
                             q(x.shape, x.dtype), q(gamma.shape, gamma.dtype),
                             q(gamma.shape, gamma.dtype), null_ws, None, 0)


def norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False, layernorm_type="layernorm"):
    """(dx, dgamma, dbeta or None)."""
    rms = layernorm_type == "rmsnorm"
    if not use_custom_call(layernorm_type):
        if rms:
            dx, dg = kernels.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma)
            return dx, dg, None
        return kernels.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
    dz = dz.astype(x.dtype)
    nbytes = _workspace_bytes(dz, x, gamma, zero_centered_gamma, rms)
    results = (sds(x.shape, x.dtype), sds(gamma.shape, gamma.dtype),
               sds((0,) if rms else gamma.shape, gamma.dtype), sds((max(int(nbytes), 1),), jnp.uint8))
    dx, dgamma, dbeta, _ = ffi("te_norm_bwd_ffi", results)(
        dz, x, empty() if rms else mu, rsigma, gamma,
        zero_centered_gamma=i64(zero_centered_gamma), rms=i64(rms))
    return dx, dgamma, (None if rms else dbeta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def layernorm(x, gamma, beta, eps=1e-5, zero_centered_gamma=False, layernorm_type="layernorm"):
    """Differentiable LayerNorm/RMSNorm (beta is ignored, and gets a zero gradient, for rmsnorm)."""
    return norm_fwd(x, gamma, beta, eps, zero_centered_gamma, layernorm_type)[0]


def _layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, layernorm_type):
    z, mu, rs, _, _ = norm_fwd(x, gamma, beta, eps, zero_centered_gamma, layernorm_type)
    return z, (x, mu, rs, gamma, beta)


def _layernorm_bwd(eps, zero_centered_gamma, layernorm_type, res, dz):
    x, mu, rs, gamma, beta = res
    dx, dgamma, dbeta = norm_bwd(dz, x, mu, rs, gamma, zero_centered_gamma, layernorm_type)
    if dbeta is None:
        dbeta = None if beta is None else jnp.zeros_like(beta)
    return dx, dgamma, dbeta


layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)
