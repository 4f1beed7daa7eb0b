"""Activations (plain and gated, optionally FP8 out), their backward and the fused dbias + dact:
XLA FFI custom calls on the GPU, the jnp references elsewhere; `activation` is the
differentiable form (jax.custom_vjp). Names as in transformer_engine.jax.kernels.activation:
gelu, relu, qgelu, srelu, silu and the gated geglu, reglu, qgeglu, sreglu, swiglu."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import kernels
from ..kernels.activation import ACTIVATIONS, GATED
from .registry import ffi, i64, native, query_descriptor, scalar1, sds, use_custom_call

_F32 = jnp.float32


def _enum(op, name):
    """(NVTEActivation value, gated) of a name."""
    kernels.activation._check(op, name)
    base = GATED.get(name, name)
    return ACTIVATIONS.index(base), name in GATED


def _out_shape(x, gated, op):
    if not gated:
        return x.shape
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(f"{op}: x has shape {x.shape}; gated activations expect [..., 2*N]")
    return x.shape[:-1] + (x.shape[-1] // 2,)


def _meta_operands(scale):
    return scalar1(1.0 if scale is None else scale), jnp.zeros((1,), _F32)


def activation_forward(x, name, fp8_dtype=None, scale=None):
    """y in x.dtype, or (y_fp8, scale_inv, amax) when fp8_dtype is given."""
    if not use_custom_call("activation"):
        return kernels.activation_forward(x, name, fp8_dtype, scale)
    act, gated = _enum("activation", name)
    kernels.cast._check_hp("activation", x)
    shape = _out_shape(x, gated, "activation")
    call = ffi("te_activation_ffi", (sds(shape, fp8_dtype or x.dtype), sds((1,), _F32),
                                     sds((1,), _F32)), aliases={2: 2})
    y, scale_inv, amax = call(x, *_meta_operands(scale), act=i64(act), gated=i64(gated))
    return y if fp8_dtype is None else (y, scale_inv, amax)


def activation_backward(grad, x, name, fp8_dtype=None, scale=None):
    """dx in x.dtype, or (dx_fp8, scale_inv, amax)."""
    if not use_custom_call("activation"):
        return kernels.activation_backward(grad, x, name, fp8_dtype, scale)
    act, gated = _enum("activation_backward", name)
    expected = _out_shape(x, gated, "activation_backward")
    if grad.shape != expected:
        raise ValueError(f"activation_backward: grad has shape {grad.shape}; expected {expected}")
    call = ffi("te_dactivation_ffi", (sds(x.shape, fp8_dtype or x.dtype), sds((1,), _F32),
                                      sds((1,), _F32)), aliases={3: 2})
    dx, scale_inv, amax = call(grad.astype(x.dtype), x, *_meta_operands(scale), act=i64(act),
                               gated=i64(gated))
    return dx if fp8_dtype is None else (dx, scale_inv, amax)


def dbias_dactivation(grad, x, name, dbias_dtype=None, fp8_dtype=None, scale=None):
    """(dx, dbias) or (dx_fp8, dbias, scale_inv, amax); plain activations only."""
    if not use_custom_call("activation"):
        return kernels.dbias_dactivation(grad, x, name, dbias_dtype, fp8_dtype, scale)
    act, gated = _enum("dbias_dactivation", name)
    if gated:
        raise ValueError(f"dbias_dactivation: activation is {name!r}; expected a plain one "
                         f"({', '.join(ACTIVATIONS)})")
    if grad.shape != x.shape:
        raise ValueError(f"dbias_dactivation: grad has shape {grad.shape}; expected {x.shape}")
    dbias_dtype = jnp.dtype(dbias_dtype or x.dtype)
    cols = x.shape[-1] if x.ndim else 1
    q = query_descriptor
    ws_shape = native().dbias_dactivation_workspace(
        act, q(x.shape, x.dtype), q(x.shape, x.dtype), q(x.shape, fp8_dtype or x.dtype, True),
        q((cols,), dbias_dtype))
    ws_shape = tuple(ws_shape) or (0,)
    results = (sds(x.shape, fp8_dtype or x.dtype), sds((cols,), dbias_dtype), sds((1,), _F32),
               sds((1,), _F32), sds(ws_shape, _F32))
    dx, dbias, scale_inv, amax, _ = ffi("te_dbias_dactivation_ffi", results, aliases={3: 3})(
        grad.astype(x.dtype), x, *_meta_operands(scale), act=i64(act))
    return (dx, dbias) if fp8_dtype is None else (dx, dbias, scale_inv, amax)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def activation(x, name):
    """Differentiable act(x) (plain or gated name)."""
    return activation_forward(x, name)


def _activation_fwd(x, name):
    return activation_forward(x, name), x


def _activation_bwd(name, x, dy):
    return (activation_backward(dy, x, name),)


activation.defvjp(_activation_fwd, _activation_bwd)
