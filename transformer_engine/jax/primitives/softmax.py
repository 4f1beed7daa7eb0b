"""Fused scaled softmax (plain, masked, causal) forward and backward: XLA FFI custom calls on
the GPU for float16/bfloat16, the jnp references elsewhere; `softmax` is the differentiable form
(jax.custom_vjp). Mask: True = masked out."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import kernels
from .registry import empty, f32, ffi, i64, sds, use_custom_call

KINDS = {"scaled": 0, "masked": 1, "causal": 2}
_REF_FWD = {"scaled": lambda x, m, s: kernels.scaled_softmax_forward(x, s),
            "masked": lambda x, m, s: kernels.scaled_masked_softmax_forward(x, m, s),
            "causal": lambda x, m, s: kernels.scaled_upper_triang_masked_softmax_forward(x, s)}


def _native_ok(x):
    # The kernels take 16-bit inputs; float32 runs in the reference (XLA fuses it well).
    return jnp.dtype(x.dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)) and \
        use_custom_call("softmax")


def _check(x, mask, kind):
    if kind not in KINDS:
        raise ValueError(f"softmax: kind is {kind!r}; expected one of {tuple(KINDS)}")
    if kind == "masked":
        if mask is None or x.ndim != 4 or mask.ndim != 4:
            raise ValueError(f"softmax: masked softmax expects x [b, h, sq, sk] and a 4-D mask; "
                             f"got x {x.shape} and mask {None if mask is None else mask.shape}")
        for d, (mx, xx) in enumerate(zip(mask.shape, x.shape)):
            if mx != xx and not (mx == 1 and d < 2):
                raise ValueError(f"softmax: mask {mask.shape} does not broadcast to x {x.shape}")
    if kind == "causal" and (x.ndim < 2 or x.shape[-1] != x.shape[-2]):
        raise ValueError(f"softmax: causal softmax expects x [..., s, s]; got {x.shape}")


def softmax_forward(x, mask=None, scale=1.0, kind="scaled"):
    _check(x, mask, kind)
    if not _native_ok(x):
        return _REF_FWD[kind](x, mask, scale)
    m = mask.astype(jnp.bool_) if kind == "masked" else empty(jnp.bool_)
    return ffi("te_softmax_fwd_ffi", sds(x.shape, x.dtype))(x, m, kind=i64(KINDS[kind]),
                                                              scale=f32(scale))


def softmax_backward(dy, y, scale=1.0, kind="scaled"):
    if not _native_ok(y):
        return kernels.scaled_softmax_backward(dy, y, scale)
    return ffi("te_softmax_bwd_ffi", sds(y.shape, y.dtype))(dy.astype(y.dtype), y,
                                                              kind=i64(KINDS[kind]), scale=f32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def softmax(x, mask=None, scale=1.0, kind="scaled"):
    """``softmax(scale * x)`` over the last axis with a mask; differentiable.

    Native kernels through XLA FFI on NVIDIA and AMD GPUs, jnp code on the CPU.

    Parameters
    ----------
    x : jax.Array
        Scores, e.g. ``[batch, heads, seq_q, seq_k]``; float32, bfloat16 or float16.
    mask : jax.Array, optional
        For ``kind='masked'``: boolean, broadcastable to ``x``, True where masked out. The mask
        gets no gradient.
    scale : float, default 1.0
        Factor applied to ``x`` before the softmax.
    kind : {'scaled', 'masked', 'causal'}, default 'scaled'
        No mask, the given ``mask``, or the upper-triangular (causal) mask.
    """
    return softmax_forward(x, mask, scale, kind)


def _softmax_fwd(x, mask, scale, kind):
    y = softmax_forward(x, mask, scale, kind)
    return y, (y, mask)


def _softmax_bwd(scale, kind, res, dy):
    y, mask = res
    dmask = None if mask is None else jnp.zeros(mask.shape, jax.dtypes.float0) \
        if not jnp.issubdtype(mask.dtype, jnp.floating) else jnp.zeros_like(mask)
    return softmax_backward(dy, y, scale, kind), dmask


softmax.defvjp(_softmax_fwd, _softmax_bwd)
