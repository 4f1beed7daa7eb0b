"""LayerNorm and RMSNorm in jnp, the same maths as the native kernels and the torch references
(csrc/common/include/transformer_engine/normalization.h): statistics and results in float32,
z rounded once to x's dtype or quantised to FP8 like kernels.quantize of the float32 z.
Functional: results are returned, nothing is updated in place."""
from __future__ import annotations

import jax.numpy as jnp

from .cast import quantize


def _gamma(gamma, zero_centered_gamma):
    g = gamma.astype(jnp.float32)
    return g + 1.0 if zero_centered_gamma else g


def _layernorm_fp32(x, gamma, beta, eps, zero_centered_gamma):
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1)
    rsigma = 1.0 / jnp.sqrt(jnp.mean(jnp.square(xf - mu[..., None]), axis=-1) + eps)
    z = (xf - mu[..., None]) * rsigma[..., None] * _gamma(gamma, zero_centered_gamma)
    return z + beta.astype(jnp.float32), mu, rsigma


def _rmsnorm_fp32(x, gamma, eps, zero_centered_gamma):
    xf = x.astype(jnp.float32)
    rsigma = 1.0 / jnp.sqrt(jnp.mean(jnp.square(xf), axis=-1) + eps)
    return xf * rsigma[..., None] * _gamma(gamma, zero_centered_gamma), rsigma


def layernorm_fwd(x, gamma, beta, eps=1e-5, zero_centered_gamma=False):
    """(z in x's dtype, mu, rsigma) with mu / rsigma float32 of x's leading shape."""
    z, mu, rsigma = _layernorm_fp32(x, gamma, beta, eps, zero_centered_gamma)
    return z.astype(x.dtype), mu, rsigma


def rmsnorm_fwd(x, gamma, eps=1e-5, zero_centered_gamma=False):
    """(z in x's dtype, rsigma)."""
    z, rsigma = _rmsnorm_fp32(x, gamma, eps, zero_centered_gamma)
    return z.astype(x.dtype), rsigma


def layernorm_fwd_fp8(x, gamma, beta, scale, fp8_dtype, eps=1e-5, zero_centered_gamma=False):
    """(data, mu, rsigma, scale_inv, amax): z quantised to fp8_dtype with `scale`."""
    z, mu, rsigma = _layernorm_fp32(x, gamma, beta, eps, zero_centered_gamma)
    data, scale_inv, amax = quantize(z, scale, fp8_dtype)
    return data, mu, rsigma, scale_inv, amax


def rmsnorm_fwd_fp8(x, gamma, scale, fp8_dtype, eps=1e-5, zero_centered_gamma=False):
    """(data, rsigma, scale_inv, amax)."""
    z, rsigma = _rmsnorm_fp32(x, gamma, eps, zero_centered_gamma)
    data, scale_inv, amax = quantize(z, scale, fp8_dtype)
    return data, rsigma, scale_inv, amax


def _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma):
    hidden = x.shape[-1]
    xf, dzf = x.astype(jnp.float32), dz.astype(jnp.float32)
    rs = rsigma[..., None]
    xhat = (xf - mu[..., None]) * rs if mu is not None else xf * rs
    dy = dzf * _gamma(gamma, zero_centered_gamma)
    dx = dy - jnp.mean(dy * xhat, axis=-1, keepdims=True) * xhat
    if mu is not None:
        dx = dx - jnp.mean(dy, axis=-1, keepdims=True)
    dgamma = jnp.sum((dzf * xhat).reshape(-1, hidden), axis=0)
    dbeta = jnp.sum(dzf.reshape(-1, hidden), axis=0)
    return (rs * dx).astype(x.dtype), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


def layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta) of LayerNorm from the forward's mu and rsigma."""
    return _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)


def rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma) of RMSNorm from the forward's rsigma."""
    return _norm_bwd(dz, x, None, rsigma, gamma, zero_centered_gamma)[:2]
