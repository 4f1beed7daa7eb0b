"""fused_attn: scaled dot-product attention for JAX, usable without Flax, behind the attention
dispatcher (primitives/attention_selection.py: the PyTorch frontend's backends, order, rules
and explanations, NVTE_DEBUG=1 included):
  cudnn / portable  the native kernels through XLA FFI custom calls (primitives/attention.py);
  sdpa              jax.nn.dot_product_attention with XLA's fused (cuDNN) implementation;
  unfused           two GEMMs around the fused scaled softmax primitive, in jnp: takes everything.

Layouts: qkv_format 'bshd' (q [b, sq, hq, d], k/v [b, sk, hkv, d]) or 'sbhd' ([s, b, h, d]);
the output has q's layout. hq a multiple of hkv (GQA/MQA). Masks: True = masked out; mask types
as in PyTorch ('causal' is anchored top-left, 'causal_bottom_right' bottom-right; a window
(left, right) on a non-causal type is centred bottom-right). A padding type takes its padding as
a `mask` tensor [b, 1, sq, sk]; without one it masks nothing beyond its causal part. 'no_mask'
with a mask tensor applies it; the causal types ignore one. Mask tensors, bias and dropout run in
the jnp path.
"""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from ..common import attention_selection as sel
from ..common import config as env
from .primitives.attention import native_attention
from .primitives.attention_selection import AttentionConfig, get_attention_backend, native_call, vendor
from .primitives.softmax import softmax

MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right")
QKV_FORMATS = ("bshd", "sbhd")
_WITHOUT_PADDING = {"padding": "no_mask", "padding_causal": "causal",
                    "padding_causal_bottom_right": "causal_bottom_right"}


def _window_mask(sq, sk, mask_type, window_size):
    """[sq, sk] bool, True = masked out, with the diagonal offsets of the PyTorch frontend."""
    left, right = sel.effective_window(mask_type, window_size)
    bottom_right = mask_type.endswith("bottom_right") or "causal" not in mask_type
    i = jnp.arange(sq)[:, None] + (sk - sq if bottom_right else 0)
    j = jnp.arange(sk)[None, :]
    masked = jnp.zeros((sq, sk), bool)
    if right >= 0:
        masked = masked | (j > i + right)
    if left >= 0:
        masked = masked | (j < i - left)
    return masked


def _unfused(query, key, value, mask, bias, scale, mask_type, dropout_probability, dropout_rng,
             window_size):
    """The jnp path on bshd: softmax(scale * q k^T + bias, masked) v -> [b, sq, hq, d]."""
    _, sq, hq, _ = query.shape
    sk, hkv = key.shape[1], key.shape[2]
    if hkv != hq:
        key = jnp.repeat(key, hq // hkv, axis=2)
        value = jnp.repeat(value, hq // hkv, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
    full = None
    if mask is not None:
        full = mask.astype(bool)
        if full.ndim == 4:
            full = jnp.broadcast_to(full, (full.shape[0], full.shape[1], sq, sk))
    left, right = sel.effective_window(mask_type, window_size)
    structural = "causal" in mask_type or left >= 0 or right >= 0
    if structural:
        wm = _window_mask(sq, sk, mask_type, window_size)[None, None]
        full = wm if full is None else (full | wm)
    if bias is not None:
        logits = (logits.astype(jnp.float32) * scale + bias.astype(jnp.float32)).astype(query.dtype)
        scale = 1.0
    square_causal = sel.uses_top_left_causal(mask_type, sq, sk) and sq == sk and left < 0
    if full is None:
        probs = softmax(logits, None, scale, "scaled")
    elif square_causal and mask is None:
        probs = softmax(logits, None, scale, "causal")
    else:
        probs = softmax(logits, jnp.broadcast_to(full, (full.shape[0], full.shape[1], sq, sk)),
                        scale, "masked")
    if dropout_probability > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_probability, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_probability), 0).astype(probs.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value)


def _sdpa(query, key, value, scale, mask_type):
    """jax.nn.dot_product_attention on bshd (its BTNH), fused where the platform has it."""
    implementation = None if vendor() == "cpu" else "cudnn"
    return jax.nn.dot_product_attention(
        query, key, value, scale=scale, implementation=implementation,
        is_causal=sel.uses_top_left_causal(mask_type, query.shape[1], key.shape[1]))


def attention_config(query, key, value, *, qkv_format, mask_type, window_size, dropout_p, has_bias,
                     has_mask_tensor) -> AttentionConfig:
    b_axis, s_axis = (0, 1) if qkv_format == "bshd" else (1, 0)
    window = (-1, -1) if window_size is None else tuple(int(w) for w in window_size)
    return AttentionConfig(
        batch=int(query.shape[b_axis]), num_heads_q=int(query.shape[2]),
        num_heads_kv=int(key.shape[2]), seqlen_q=int(query.shape[s_axis]),
        seqlen_kv=int(key.shape[s_axis]), head_dim_qk=int(query.shape[3]),
        head_dim_v=int(value.shape[3]), dtype_name=jnp.dtype(query.dtype).name,
        qkv_format=qkv_format, mask_type=mask_type, window_size=window,
        dropout_p=float(dropout_p), has_bias=has_bias, has_mask_tensor=has_mask_tensor,
        deterministic=not env.allow_nondeterministic_algo())


def _check(query, key, value, attn_mask_type, qkv_format):
    if attn_mask_type not in MASK_TYPES:
        raise ValueError(f"fused_attn: attn_mask_type is {attn_mask_type!r}; expected {MASK_TYPES}")
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"fused_attn: qkv_format is {qkv_format!r}; expected one of {QKV_FORMATS}")
    if query.ndim != 4 or key.ndim != 4 or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"fused_attn: expected q, k, v of 4 dims in {qkv_format!r} with k/v "
                         f"sharing batch, sequence and heads; got {query.shape}, {key.shape}, "
                         f"{value.shape}")
    if query.shape[3] != key.shape[3]:
        raise ValueError(f"fused_attn: q head dim {query.shape[3]} != k head dim {key.shape[3]}")
    hq, hkv = query.shape[2], key.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"fused_attn: {hq} query heads is not a multiple of {hkv} key/value heads")


def fused_attn(query, key, value, mask=None, bias=None, scaling_factor: Optional[float] = None,
               attn_mask_type: str = "no_mask", dropout_probability: float = 0.0,
               dropout_rng=None, window_size: Optional[Tuple[int, int]] = None,
               qkv_format: str = "bshd"):
    """Scaled dot-product attention, ``softmax(scale * q k^T + bias, masked) v``; differentiable.

    The backend is chosen per call by the same rule table as the PyTorch frontend
    (``NVTE_DEBUG=1`` logs the choice): the native fused kernels through an XLA FFI custom call
    (cuDNN, then the portable kernel, on NVIDIA), ``jax.nn.dot_product_attention`` where XLA has a
    fused path (the AMD default), else jnp code (GEMMs around the softmax; the CPU, and every call
    with a mask tensor, bias or dropout).

    Parameters
    ----------
    query : jax.Array
        ``[batch, seq_q, heads, dim]`` (``qkv_format='bshd'``) or ``[seq_q, batch, heads, dim]``
        (``'sbhd'``).
    key : jax.Array
        ``[batch, seq_k, kv_heads, dim]`` in the same layout; ``heads`` must be a multiple of
        ``kv_heads`` (GQA).
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
    qkv_format : {'bshd', 'sbhd'}, default 'bshd'
        Layout of ``query``, ``key``, ``value`` and the output.

    Returns
    -------
    jax.Array
        ``[batch, seq_q, heads, dim]`` in ``qkv_format``.
    """
    _check(query, key, value, attn_mask_type, qkv_format)
    scale = (1.0 / query.shape[3] ** 0.5) if scaling_factor is None else float(scaling_factor)
    dropout_p = float(dropout_probability) if dropout_rng is not None else 0.0
    if attn_mask_type in ("causal", "causal_bottom_right"):
        mask = None  # the causal types make their own mask; a padding mask needs a padding type
    mask_type = attn_mask_type if mask is not None else _WITHOUT_PADDING.get(attn_mask_type, attn_mask_type)
    cfg = attention_config(query, key, value, qkv_format=qkv_format, mask_type=mask_type,
                           window_size=window_size, dropout_p=dropout_p, has_bias=bias is not None,
                           has_mask_tensor=mask is not None)
    chosen = get_attention_backend(cfg).chosen
    if chosen in ("cudnn", "portable"):
        return native_attention(query, key, value, native_call(chosen, cfg, scale))
    if qkv_format == "sbhd":
        query, key, value = (jnp.swapaxes(t, 0, 1) for t in (query, key, value))
    if chosen == "sdpa":
        out = _sdpa(query, key, value, scale, mask_type)
    else:
        out = _unfused(query, key, value, mask, bias, scale, mask_type, dropout_p, dropout_rng,
                       window_size)
    return jnp.swapaxes(out, 0, 1) if qkv_format == "sbhd" else out
