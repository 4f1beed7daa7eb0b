"""Activations, gated forms, backward passes and fused dbias + dact in jnp, with the same maths
as the native kernels and the torch references: fp32 compute, one rounding to the output dtype,
FP8 outputs as quantize(fp32 result). Gated: y = act(x[..., :N]) * x[..., N:].
Functional: results (and FP8 metadata) are returned, nothing is updated in place."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .cast import quantize

ACTIVATIONS = ("gelu", "relu", "qgelu", "srelu", "silu", "sigmoid")
GATED = {"geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu", "swiglu": "silu",
         "glu": "sigmoid"}


def _base(name):
    return {
        # tanh-approximate gelu as x * sigmoid(2u) (0.5 (1 + tanh u) == sigmoid(2u)): XLA's
        # tanh approximation loses the small values of 1 + tanh(u) at very negative x.
        "gelu": lambda x: x * jax.nn.sigmoid(1.5957691216057308 * x * (1.0 + 0.044715 * x * x)),
        "relu": jax.nn.relu,
        "qgelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
        "srelu": lambda x: jnp.square(jax.nn.relu(x)),
        "silu": jax.nn.silu,
        "sigmoid": jax.nn.sigmoid,
    }[name]


def _check(op, name, allow_gated=True):
    names = ACTIVATIONS + (tuple(GATED) if allow_gated else ())
    if name not in names:
        raise ValueError(f"{op}: activation is {name!r}; expected one of {', '.join(names)}")


def activation_fp32(x, name):
    """act(x) (plain or gated name) in float32."""
    _check("activation", name)
    xf = x.astype(jnp.float32)
    if name in GATED:
        if xf.ndim == 0 or xf.shape[-1] % 2:
            raise ValueError(f"activation: x has shape {x.shape}; gated {name} expects [..., 2*N]")
        a, b = jnp.split(xf, 2, axis=-1)
        return _base(GATED[name])(a) * b
    return _base(name)(xf)


def activation_forward(x, name, fp8_dtype=None, scale=None):
    """y in x.dtype, or (y_fp8, scale_inv, amax) when fp8_dtype is given."""
    y = activation_fp32(x, name)
    return y.astype(x.dtype) if fp8_dtype is None else quantize(y, scale, fp8_dtype)


def dactivation_fp32(grad, x, name):
    """dx in float32 by autodiff of the fp32 activation."""
    _, vjp = jax.vjp(lambda v: activation_fp32(v, name), x.astype(jnp.float32))
    return vjp(grad.astype(jnp.float32))[0]


def activation_backward(grad, x, name, fp8_dtype=None, scale=None):
    dx = dactivation_fp32(grad, x, name)
    return dx.astype(x.dtype) if fp8_dtype is None else quantize(dx, scale, fp8_dtype)


def dbias_dactivation(grad, x, name, dbias_dtype=None, fp8_dtype=None, scale=None):
    """(dx, dbias) or (dx_fp8, dbias, scale_inv, amax): dbias = fp32 column sums of dx."""
    _check("dbias_dactivation", name, allow_gated=False)
    dx = dactivation_fp32(grad, x, name)
    cols = x.shape[-1] if x.ndim else 1
    dbias = dx.reshape(-1, cols).sum(axis=0).astype(dbias_dtype or x.dtype)
    if fp8_dtype is None:
        return dx.astype(x.dtype), dbias
    data, scale_inv, amax = quantize(dx, scale, fp8_dtype)
    return data, dbias, scale_inv, amax


def clamped_swiglu_fp32(x, limit=7.0, alpha=1.702):
    """Clamped SwiGLU of x [..., 2N] in float32 (see nvte_clamped_swiglu): with a = x[..., :N]
    clamped above at limit and b = x[..., N:] clamped to [-limit, limit],
    a sigmoid(alpha a) (b + 1). Differentiable (the clamps pass the gradient inside their range)."""
    xf = x.astype(jnp.float32)
    if xf.ndim == 0 or xf.shape[-1] % 2:
        raise ValueError(f"clamped_swiglu: x has shape {x.shape}; expected [..., 2*N]")
    a, b = jnp.split(xf, 2, axis=-1)
    a = jnp.minimum(a, limit)
    return a * jax.nn.sigmoid(alpha * a) * (jnp.clip(b, -limit, limit) + 1.0)
