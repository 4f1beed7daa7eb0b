"""The sdpa backend: torch.nn.functional.scaled_dot_product_attention, the framework's own fused
attention. On ROCm builds of PyTorch it runs AMD's AOTriton / CK flash and memory-efficient
kernels (the AMD fast path); on NVIDIA PyTorch's flash or cuDNN kernels; on the CPU its CPU
kernels. Its backward is PyTorch's, so autograd, torch.compile and checkpointing need nothing here.

What it is handed (the rules in backend_selection.py and common/attention_selection.py say why
the rest goes elsewhere): bshd / sbhd as strided [b, h, s, d] views (no copy), GQA through
`enable_gqa` (torch >= 2.5) or repeated K/V, dropout (inside the caller's RNG tracker), and every
mask type: top-left causal as `is_causal`, everything else (padding, bottom-right causal with
sq != skv, windows, arbitrary masks) as an explicit boolean mask.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...common import attention_selection as sel
from . import masks

_HAS_ENABLE_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)
_HAS_SCALE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 1)


def support_reason(cfg) -> Optional[str]:
    """What only the installed torch decides (the rest is in the shared rule table)."""
    if not hasattr(F, "scaled_dot_product_attention") or not _HAS_SCALE:
        return f"torch {torch.__version__} has no scaled_dot_product_attention with a scale argument"
    return None


def _to_bhsd(t: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return t.transpose(1, 2) if qkv_format == "bshd" else t.permute(1, 2, 0, 3)


def _from_bhsd(t: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return t.transpose(1, 2) if qkv_format == "bshd" else t.permute(2, 0, 1, 3)


# Written for the host time of a call (every step of a training loop pays it while the device
# waits for SDPA's first kernel): no per-call closures, generators or keyword dicts.
def sdpa_attention(q, k, v, *, qkv_format: str, mask_type: str, window, softmax_scale: float,
                   dropout_p: float = 0.0, seqlens_q=None, seqlens_kv=None, arbitrary_mask=None,
                   rng_context=None) -> torch.Tensor:
    """Attention output in q's layout with head dims kept: [.., h, d_v]. Arguments were checked by
    the caller (DotProductAttention); seqlens_* are the per-sequence lengths of padding types."""
    qh, kh, vh = _to_bhsd(q, qkv_format), _to_bhsd(k, qkv_format), _to_bhsd(v, qkv_format)
    b, hq, sq, _ = qh.shape
    hkv, sk = kh.shape[1], kh.shape[2]
    gqa = hkv != hq   # GQA/MQA: query head h reads kv head h // (hq / hkv)
    if gqa and not _HAS_ENABLE_GQA:
        kh = kh.repeat_interleave(hq // hkv, dim=1)
        vh = vh.repeat_interleave(hq // hkv, dim=1)
        gqa = False
    attn_mask, empty_rows, is_causal = None, None, False
    if mask_type == "arbitrary" or sel.needs_dense_mask(mask_type, window, sq, sk):
        masked = masks.build_attention_mask(mask_type, window, b, sq, sk, qh.device, seqlens_q,
                                            seqlens_kv, arbitrary_mask)
        # rows that see no key (padded queries, windows past the keys) give zeros, as in every
        # backend; SDPA would give NaN for them, so they attend to everything and are zeroed after
        empty_rows = masked.all(dim=-1, keepdim=True)
        attn_mask = ~(masked & ~empty_rows)
    else:
        is_causal = sel.uses_top_left_causal(mask_type, sq, sk)
    if dropout_p > 0.0 and rng_context is not None:
        with rng_context():
            out = _sdpa(qh, kh, vh, attn_mask, dropout_p, is_causal, softmax_scale, gqa)
    else:
        out = _sdpa(qh, kh, vh, attn_mask, dropout_p, is_causal, softmax_scale, gqa)
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return _from_bhsd(out, qkv_format)


def _sdpa(qh, kh, vh, attn_mask, dropout_p: float, is_causal: bool, scale: float, gqa: bool):
    if gqa:   # only reached where torch has enable_gqa
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)
