"""Mask types as DotProductAttention accepts them, and the dense boolean masks of the unfused path.

Convention everywhere in Transformer Engine: True means *masked out* (the key is not attended).
The semantics of each mask type and of the sliding window (which diagonal each is anchored to,
per-sequence lengths) are defined once, in kernels/attention.py's docstring and reference; this module
validates the user's arguments and builds the same mask for the unfused path.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..kernels.attention import MASK_TYPES, QKV_FORMATS, _visible_mask, is_bottom_right, is_causal, is_padding  # noqa: F401,E501

# Aliases accepted by NVIDIA TE (both spellings of the padding+causal type).
_ALIASES = {"causal_padding": "padding_causal",
            "causal_padding_bottom_right": "padding_causal_bottom_right"}


def canonical_mask_type(op: str, mask_type: str) -> str:
    mask_type = _ALIASES.get(mask_type, mask_type)
    if mask_type not in MASK_TYPES:
        raise ValueError(f"{op}: attn_mask_type is {mask_type!r}; expected one of {', '.join(MASK_TYPES)}")
    return mask_type


def check_qkv_format(op: str, qkv_format: str) -> str:
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"{op}: qkv_format is {qkv_format!r}; expected sbhd, bshd or thd")
    return qkv_format


def canonical_window(op: str, window_size, mask_type: str) -> Tuple[int, int]:
    """(left, right) with -1 for unbounded; causal types get right = 0."""
    if window_size is None:
        left, right = -1, -1
    else:
        try:
            left, right = (int(w) for w in window_size)
        except (TypeError, ValueError):
            raise ValueError(f"{op}: window_size is {window_size!r}; expected (left, right) "
                             "integers, -1 meaning unbounded") from None
        if left < -1 or right < -1:
            raise ValueError(f"{op}: window_size is {window_size!r}; entries must be >= -1")
    if is_causal(mask_type):
        if right not in (-1, 0):
            raise ValueError(f"{op}: window_size {window_size!r} looks ahead ({right} keys) but "
                             f"attn_mask_type {mask_type!r} is causal; use right = 0 or -1")
        right = 0
    return left, right


def has_window(window: Tuple[int, int], mask_type: str) -> bool:
    """True when the window restricts more than the mask type already does."""
    left, right = window
    return left >= 0 or (right >= 0 and not is_causal(mask_type))


def seqlens_from_cu(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)


def seqlens_from_padding_mask(op: str, name: str, mask: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Lengths from a [b, 1, 1, s] (or [b, s]) padding mask with True at padded positions."""
    if mask.dtype != torch.bool:
        raise ValueError(f"{op}: {name} has dtype {mask.dtype}; expected torch.bool (True = padded)")
    flat = mask.reshape(mask.shape[0], -1)
    if flat.shape[1] != seqlen:
        raise ValueError(f"{op}: {name} has shape {tuple(mask.shape)}; expected [b, 1, 1, {seqlen}]")
    return (~flat).sum(-1).to(torch.int64)


def build_attention_mask(mask_type: str, window: Tuple[int, int], batch: int, sq: int, sk: int,
                         device, seqlens_q: Optional[torch.Tensor] = None,
                         seqlens_kv: Optional[torch.Tensor] = None,
                         arbitrary_mask: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Dense bool mask [b or 1, 1 or h, sq, sk] (True = masked out), or None when nothing is masked
    (so the unfused path can take the unmasked softmax). seqlens_q/seqlens_kv (int [b]) are the
    valid lengths of the padding types."""
    if mask_type == "arbitrary":  # the caller's mask, narrowed by the window if there is one
        window_mask = build_attention_mask("no_mask", window, batch, sq, sk, device)
        if window_mask is None:
            return arbitrary_mask.bool()
        return arbitrary_mask.bool() | window_mask
    if not is_padding(mask_type) and not is_causal(mask_type) and not has_window(window, mask_type):
        return None
    if is_padding(mask_type):
        lq, lk, b = seqlens_q.to(device), seqlens_kv.to(device), batch
    else:  # one mask shared by the batch
        lq = torch.full((1,), sq, device=device)
        lk = torch.full((1,), sk, device=device)
        b = 1
    return ~_visible_mask(b, sq, sk, lq, lk, mask_type, window, device)
