"""Fused scaled softmax in jnp, the same maths as the native kernels and the torch references
(csrc/common/include/transformer_engine/softmax.h): fp32 arithmetic, one rounding to x's dtype,
mask True = masked out, fully masked rows give zeros, dx = scale * y * (dy - sum(dy * y))."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _softmax_fp32(logits):
    y = jax.nn.softmax(logits, axis=-1)
    if logits.size == 0:
        return y
    empty_row = jnp.max(logits, axis=-1, keepdims=True) == -jnp.inf
    return jnp.where(empty_row, 0.0, y)


def causal_mask(sq, sk):
    """[sq, sk] bool, True above the diagonal."""
    return jnp.triu(jnp.ones((sq, sk), dtype=bool), k=1)


def scaled_softmax_forward(x, scale=1.0):
    return _softmax_fp32(x.astype(jnp.float32) * scale).astype(x.dtype)


def scaled_masked_softmax_forward(x, mask, scale=1.0):
    """x [b, h, sq, sk]; mask [b or 1, h or 1, sq, sk], True = masked out."""
    logits = jnp.where(mask.astype(bool), -jnp.inf, x.astype(jnp.float32) * scale)
    return _softmax_fp32(logits).astype(x.dtype)


def scaled_upper_triang_masked_softmax_forward(x, scale=1.0):
    """Causal softmax of x [..., sq, sq]."""
    mask = causal_mask(x.shape[-2], x.shape[-1])
    logits = jnp.where(mask, -jnp.inf, x.astype(jnp.float32) * scale)
    return _softmax_fp32(logits).astype(x.dtype)


def scaled_softmax_backward(dy, y, scale=1.0):
    yf, dyf = y.astype(jnp.float32), dy.astype(jnp.float32)
    return (scale * yf * (dyf - jnp.sum(dyf * yf, axis=-1, keepdims=True))).astype(y.dtype)


# Masked elements have y == 0, so one formula serves every form.
scaled_masked_softmax_backward = scaled_softmax_backward
scaled_upper_triang_masked_softmax_backward = scaled_softmax_backward
