"""The unfused attention backend: two batched GEMMs in the framework's own ops around our fused
scaled (masked / causal) softmax. It accepts every configuration (any dtype, head dim, mask type
including arbitrary masks, layout, GQA ratio, window, dropout, a post-scale bias), which is why the
dispatcher can always fall back to it.

Layouts are brought to [b, s, h, d] first; thd is padded to [b, max_seqlen, h, d] with its
cu_seqlens turned into per-sequence lengths, and packed again at the end.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from . import masks


def to_bshd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return x.transpose(0, 1) if qkv_format == "sbhd" else x


def from_bshd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return x.transpose(0, 1) if qkv_format == "sbhd" else x


def pad_thd(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """[t, h, d] packed -> [b, max_seqlen, h, d] (zeros past each length); differentiable."""
    b = cu_seqlens.numel() - 1
    index = _thd_index(cu_seqlens, max_seqlen, x.device)
    flat = x.new_zeros((b * max_seqlen,) + tuple(x.shape[1:]))
    valid = index >= 0
    flat = flat.index_put((valid.nonzero().squeeze(1),), x[index[valid]])
    return flat.view((b, max_seqlen) + tuple(x.shape[1:]))


def unpad_thd(x: torch.Tensor, cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[b, s, ...] -> [t, ...] keeping each sequence's first len positions; differentiable."""
    index = _thd_index(cu_seqlens, x.shape[1], x.device)
    flat = x.reshape((-1,) + tuple(x.shape[2:]))
    valid = index >= 0
    out = x.new_zeros((total,) + tuple(x.shape[2:]))
    return out.index_put((index[valid],), flat[valid.nonzero().squeeze(1)])


def _thd_index(cu_seqlens, max_seqlen, device):
    """For each padded slot (b * max_seqlen of them), the packed token it holds, -1 if padding."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    lens = cu[1:] - cu[:-1]
    pos = torch.arange(max_seqlen, device=device).view(1, -1)
    index = cu[:-1].view(-1, 1) + pos
    return torch.where(pos < lens.view(-1, 1), index, torch.full_like(index, -1)).reshape(-1)


def _softmax(scores: torch.Tensor, mask: Optional[torch.Tensor], scale: float, causal_square: bool):
    """The fused softmax variant that matches the mask; every one has a native kernel."""
    if mask is None:
        return kernels.scaled_softmax(scores, scale)
    if causal_square:
        return kernels.scaled_upper_triang_masked_softmax(scores, scale)
    return kernels.scaled_masked_softmax(scores, mask.expand(mask.shape[0], mask.shape[1], *scores.shape[2:]),
                                     scale)


def unfused_attention(q, k, v, *, qkv_format: str, mask_type: str, window, softmax_scale: float,
                      dropout_p: float = 0.0, training: bool = True,
                      cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                      seqlens_q=None, seqlens_kv=None, arbitrary_mask=None, bias=None,
                      rng_context=None) -> torch.Tensor:
    """Attention output in q's layout with head dims kept: [.., h, d_v]. Arguments were checked by
    the caller (DotProductAttention); seqlens_* are per-sequence lengths for the padding types of
    bshd/sbhd, cu_seqlens_* describe thd."""
    if qkv_format == "thd":
        sq, sk = int(max_seqlen_q), int(max_seqlen_kv)
        total_q = q.shape[0]
        qb, kb, vb = (pad_thd(q, cu_seqlens_q, sq), pad_thd(k, cu_seqlens_kv, sk),
                      pad_thd(v, cu_seqlens_kv, sk))
        seqlens_q, seqlens_kv = masks.seqlens_from_cu(cu_seqlens_q), masks.seqlens_from_cu(cu_seqlens_kv)
    else:
        qb, kb, vb = (to_bshd(t, qkv_format) for t in (q, k, v))
    b, sq, hq, _ = qb.shape
    sk, hkv = kb.shape[1], kb.shape[2]
    if qkv_format == "thd" and not masks.is_padding(mask_type):
        # packed sequences always carry their own lengths; the mask type only says causal or not
        mask_type = {"no_mask": "padding", "causal": "padding_causal",
                     "causal_bottom_right": "padding_causal_bottom_right"}.get(mask_type, mask_type)
    mask = masks.build_attention_mask(mask_type, window, b, sq, sk, qb.device, seqlens_q, seqlens_kv,
                                      arbitrary_mask)
    causal_square = (mask_type in ("causal", "causal_bottom_right") and sq == sk
                     and not masks.has_window(window, mask_type) and bias is None)
    if hkv != hq:  # GQA/MQA: query head h reads kv head h // (hq / hkv)
        kb = kb.repeat_interleave(hq // hkv, dim=2)
        vb = vb.repeat_interleave(hq // hkv, dim=2)
    qh, kh, vh = qb.permute(0, 2, 1, 3), kb.permute(0, 2, 3, 1), vb.permute(0, 2, 1, 3)
    scores = torch.matmul(qh, kh)                                     # [b, h, sq, sk]
    scale = softmax_scale
    if bias is not None:  # post-scale bias: softmax(scale * qk + bias)
        scores = (scores.float() * softmax_scale + bias.float()).to(q.dtype)
        scale = 1.0
    probs = _softmax(scores, mask, scale, causal_square)
    if dropout_p > 0.0 and training:
        if rng_context is not None:
            with rng_context():
                probs = F.dropout(probs, dropout_p, training=True)
        else:
            probs = F.dropout(probs, dropout_p, training=True)
    out = torch.matmul(probs, vh).permute(0, 2, 1, 3)                # [b, sq, h, dv]
    if qkv_format == "thd":
        return unpad_thd(out, cu_seqlens_q, total_q)
    return from_bshd(out, qkv_format)
