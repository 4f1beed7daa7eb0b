"""Scaled dot-product attention in jnp: the maths of the native attention backends
(csrc/common/include/transformer_engine/attention.h) and of the torch reference
(transformer_engine/pytorch/kernels/attention.py, whose docstring defines layouts and masks).

fp32 arithmetic, one rounding to q's dtype; True in attn_mask = masked out; a query row that sees
no key gives zeros; padded query rows give zeros. GQA: query head h reads kv head
h // (heads_q // heads_kv). thd needs max_seqlen_q / max_seqlen_kv as Python ints under jit.
"""
from __future__ import annotations

import jax.numpy as jnp

MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")


def _effective_window(mask_type, window_size):
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if "causal" in mask_type:
        right = 0
    return left, right


def visible_mask(b, sq, skv, lq, lk, mask_type, window_size):
    """[b, 1, sq, skv] bool, True = visible; lq, lk are [b] per-sequence lengths."""
    i = jnp.arange(sq).reshape(1, sq, 1)
    j = jnp.arange(skv).reshape(1, 1, skv)
    lq, lk = lq.reshape(b, 1, 1), lk.reshape(b, 1, 1)
    visible = (i < lq) & (j < lk)
    bottom_right = mask_type.endswith("bottom_right") or "causal" not in mask_type
    off = (lk - lq) if bottom_right else jnp.zeros_like(lq)
    left, right = _effective_window(mask_type, window_size)
    if right >= 0:
        visible &= j <= i + off + right
    if left >= 0:
        visible &= j >= i + off - left
    return visible[:, None]


def _padded(x, cu, smax):
    """[t, h, d] packed -> [b, smax, h, d], plus each token's (sequence, position)."""
    cu = cu.astype(jnp.int32)
    b = cu.shape[0] - 1
    tok = jnp.arange(x.shape[0])
    seq = jnp.clip(jnp.searchsorted(cu[1:], tok, side="right"), 0, max(b - 1, 0))
    pos = tok - cu[seq]
    out = jnp.zeros((b, smax) + x.shape[1:], x.dtype)
    out = out.at[seq, jnp.clip(pos, 0, smax - 1)].set(jnp.where((pos < smax)[:, None, None], x, 0))
    return out, seq, pos


def _core(q, k, v, lq, lk, mask_type, window_size, softmax_scale, attn_mask):
    """q [b, sq, hq, d], k/v [b, skv, hkv, d] -> out [b, sq, hq, dv] (q's dtype), lse [b, hq, sq]."""
    b, sq, hq, _ = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"attention_reference: q has {hq} heads, k/v {hkv}; expected a divisor")
    visible = visible_mask(b, sq, skv, lq, lk, mask_type, window_size)
    if mask_type == "arbitrary":
        if attn_mask is None:
            raise ValueError("attention_reference: mask_type 'arbitrary' needs attn_mask")
        visible = visible & ~attn_mask.astype(bool)
    group = hq // hkv
    qf = jnp.swapaxes(q.astype(jnp.float32), 1, 2)
    kf = jnp.repeat(jnp.swapaxes(k.astype(jnp.float32), 1, 2), group, axis=1)
    vf = jnp.repeat(jnp.swapaxes(v.astype(jnp.float32), 1, 2), group, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) * softmax_scale
    scores = jnp.where(visible, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    safe_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    e = jnp.exp(scores - safe_max)
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = jnp.where(total > 0, e / jnp.where(total > 0, total, 1.0), 0.0)
    lse = jnp.where(total[..., 0] > 0, jnp.log(jnp.where(total > 0, total, 1.0))[..., 0]
                    + safe_max[..., 0], -jnp.inf)
    out = jnp.swapaxes(jnp.einsum("bhqk,bhkd->bhqd", probs, vf), 1, 2)
    row_ok = (jnp.arange(sq)[None, :] < lq[:, None])[:, :, None, None]
    return jnp.where(row_ok, out, 0.0).astype(q.dtype), lse


def attention_reference(q, k, v, *, qkv_format, mask_type, window_size=(-1, -1), softmax_scale,
                        cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                        max_seqlen_kv=None, attn_mask=None, return_lse=False):
    """softmax(scale * q k^T + mask) v; layouts 'bshd', 'sbhd', 'thd' (with cu_seqlens)."""
    if mask_type not in MASK_TYPES:
        raise ValueError(f"attention_reference: mask_type is {mask_type!r}; expected one of "
                         f"{MASK_TYPES}")
    padding = mask_type.startswith("padding")
    if qkv_format == "thd":
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("attention_reference: qkv_format 'thd' needs cu_seqlens_q/kv")
        lq = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).astype(jnp.int32)
        lk = (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).astype(jnp.int32)
        sq = int(max_seqlen_q) if max_seqlen_q is not None else int(jnp.max(lq))
        skv = int(max_seqlen_kv) if max_seqlen_kv is not None else int(jnp.max(lk))
        qb, seq, pos = _padded(q, cu_seqlens_q, sq)
        kb, _, _ = _padded(k, cu_seqlens_kv, skv)
        vb, _, _ = _padded(v, cu_seqlens_kv, skv)
        out_b, lse = _core(qb, kb, vb, lq, lk, mask_type, window_size, softmax_scale, attn_mask)
        out = out_b[seq, jnp.clip(pos, 0, sq - 1)]
        return (out, lse) if return_lse else out
    if qkv_format not in ("bshd", "sbhd"):
        raise ValueError(f"attention_reference: qkv_format is {qkv_format!r}; expected 'bshd', "
                         "'sbhd' or 'thd'")
    if qkv_format == "sbhd":
        q, k, v = (jnp.swapaxes(t, 0, 1) for t in (q, k, v))
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    if padding:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError(f"attention_reference: mask_type {mask_type!r} needs cu_seqlens_q/kv")
        lq = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).astype(jnp.int32)
        lk = (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).astype(jnp.int32)
    else:
        lq = jnp.full((b,), sq, jnp.int32)
        lk = jnp.full((b,), skv, jnp.int32)
    out, lse = _core(q, k, v, lq, lk, mask_type, window_size, softmax_scale, attn_mask)
    if qkv_format == "sbhd":
        out = jnp.swapaxes(out, 0, 1)
    return (out, lse) if return_lse else out
