"""fused_attn: scaled dot-product attention for JAX, usable without Flax.

There is no native fused attention kernel for JAX yet (the attention family's native kernels
are built for the PyTorch frontend first): this is the unfused path, two GEMMs around the fused
scaled softmax primitive (a custom call on the GPU for float16/bfloat16), in jnp. Layout bshd:
q [b, sq, hq, d], k/v [b, sk, hkv, d] with hq a multiple of hkv (GQA/MQA). Masks: True = masked
out; attn_mask_type 'no_mask' | 'padding' | 'causal' | 'padding_causal'; window_size (left,
right) limits keys to [i - left, i + right] (-1: unlimited)."""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from .primitives.softmax import softmax

MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right")


def _window_mask(sq, sk, window_size, causal, bottom_right):
    i = jnp.arange(sq)[:, None] + (sk - sq if bottom_right else 0)
    j = jnp.arange(sk)[None, :]
    masked = jnp.zeros((sq, sk), bool)
    if causal:
        masked = masked | (j > i)
    if window_size is not None:
        left, right = window_size
        if left >= 0:
            masked = masked | (j < i - left)
        if right >= 0:
            masked = masked | (j > i + right)
    return masked


def fused_attn(query, key, value, mask=None, bias=None, scaling_factor: Optional[float] = None,
               attn_mask_type: str = "no_mask", dropout_probability: float = 0.0,
               dropout_rng=None, window_size: Optional[Tuple[int, int]] = None):
    """Scaled dot-product attention, ``softmax(scale * q k^T + bias, masked) v``; differentiable.

    Runs as GEMMs around the native fused softmax (XLA FFI on NVIDIA and AMD GPUs; jnp code on
    the CPU).

    Parameters
    ----------
    query : jax.Array
        ``[batch, seq_q, heads, dim]``.
    key : jax.Array
        ``[batch, seq_k, kv_heads, dim]``; ``heads`` must be a multiple of ``kv_heads`` (GQA).
    value : jax.Array
        Same shape as ``key``.
    mask : jax.Array, optional
        Boolean ``[batch, 1, seq_q, seq_k]``, True where masked out; used by the padding types.
    bias : jax.Array, optional
        Added to the scaled scores, broadcastable to ``[batch, heads, seq_q, seq_k]``.
    scaling_factor : float, optional
        Default ``1 / sqrt(dim)``.
    attn_mask_type : str, default 'no_mask'
        ``'no_mask'``, ``'padding'``, ``'causal'``, ``'padding_causal'`` or
        ``'causal_bottom_right'``.
    dropout_probability : float, default 0.0
        Dropout on the attention probabilities.
    dropout_rng : jax.Array, optional
        PRNG key for the dropout; required when ``dropout_probability > 0``.
    window_size : tuple of (int, int), optional
        Sliding window ``(left, right)``; -1 is unbounded.

    Returns
    -------
    jax.Array
        ``[batch, seq_q, heads, dim]``.
    """
    if attn_mask_type not in MASK_TYPES:
        raise ValueError(f"fused_attn: attn_mask_type is {attn_mask_type!r}; expected {MASK_TYPES}")
    if query.ndim != 4 or key.ndim != 4 or value.shape != key.shape:
        raise ValueError(f"fused_attn: expected q [b, sq, h, d], k/v [b, sk, hkv, d]; got "
                         f"{query.shape}, {key.shape}, {value.shape}")
    b, sq, hq, d = query.shape
    sk, hkv = key.shape[1], key.shape[2]
    if hq % hkv:
        raise ValueError(f"fused_attn: {hq} query heads is not a multiple of {hkv} key/value heads")
    if hkv != hq:
        key = jnp.repeat(key, hq // hkv, axis=2)
        value = jnp.repeat(value, hq // hkv, axis=2)
    scale = (1.0 / d ** 0.5) if scaling_factor is None else float(scaling_factor)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
    causal = attn_mask_type in ("causal", "padding_causal", "causal_bottom_right")
    full = None
    if mask is not None and attn_mask_type in ("padding", "padding_causal"):
        full = jnp.broadcast_to(mask.astype(bool), (mask.shape[0], 1, sq, sk)) if mask.ndim == 4 \
            else mask.astype(bool)
    elif mask is not None and attn_mask_type == "no_mask":
        full = mask.astype(bool)
    if causal or window_size is not None:
        wm = _window_mask(sq, sk, window_size, causal, attn_mask_type == "causal_bottom_right"
                          or sq != sk)[None, None]
        full = wm if full is None else (full | wm)
    if bias is not None:
        logits = (logits.astype(jnp.float32) * scale + bias.astype(jnp.float32)).astype(query.dtype)
        scale = 1.0
    if full is None:
        probs = softmax(logits, None, scale, "scaled")
    elif causal and window_size is None and full.shape[-1] == full.shape[-2] and mask is None:
        probs = softmax(logits, None, scale, "causal")
    else:
        probs = softmax(logits, jnp.broadcast_to(full, (full.shape[0], full.shape[1], sq, sk)),
                        scale, "masked")
    if dropout_probability > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_probability, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_probability), 0).astype(probs.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value)
