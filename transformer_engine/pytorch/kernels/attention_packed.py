"""q, k and v as strided views of one packed projection, their gradients written into one buffer.

A fused QKV projection yields one tensor `mixed` [..., (hq + 2 hkv) * d]: either [all q | all k |
all v] per token, or per kv group [its hq/hkv query heads, key, value] (NVIDIA TE's interleaved
weight). split_packed_qkv returns q, k, v [..., heads, d] as views of it (no copies) through an
autograd Function; each view carries the QKVPack (attribute PACK_ATTR) that says how to take
the same views of any tensor of mixed's shape.

FusedAttention (kernels/attention.py) hands the views to cuDNN with their strides, and in its
backward, when q/k/v are one pack's views, allocates one buffer of mixed's shape and has the
kernel write dq/dk/dv into the pack's views of it. The split's backward recognises that buffer
(the three gradients are exactly its views) and returns it as mixed's gradient: no concatenation.
Any other gradients (another backend, an op between split and attention, a second use of q) are
copied into a new buffer, which is what torch.split's backward costs.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

PACK_ATTR = "_te_qkv_pack"


class QKVPack:
    """Geometry of one packed projection: its shape and how q/k/v are taken from it."""

    def __init__(self, shape, dtype, device, views: Callable):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self._views = views  # tensor of `shape` (contiguous) -> (q, k, v) views of it

    def views(self, packed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._views(packed)

    def new_grads(self, zero: bool):
        """(buffer, (dq, dk, dv)): one buffer of the packed shape and the pack's views of it."""
        alloc = torch.zeros if zero else torch.empty
        buf = alloc(self.shape, dtype=self.dtype, device=self.device)
        return buf, self.views(buf)

    def is_views_of(self, base: torch.Tensor, tensors) -> bool:
        """Whether `tensors` are exactly this pack's views of `base` (pointer, shape, strides)."""
        if tuple(base.shape) != self.shape or not base.is_contiguous():
            return False
        return all(t is not None and t.data_ptr() == r.data_ptr() and t.shape == r.shape
                   and t.stride() == r.stride() for t, r in zip(tensors, self.views(base)))


def pack_of(q, k, v) -> Optional[QKVPack]:
    """The pack q, k and v are the views of (all three of the same split), else None."""
    pack = getattr(q, PACK_ATTR, None)
    if pack is None or getattr(k, PACK_ATTR, None) is not pack or getattr(v, PACK_ATTR, None) is not pack:
        return None
    return pack


class _SplitPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, pack):
        ctx.pack = pack
        return pack.views(packed)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        pack = ctx.pack
        grads = (dq, dk, dv)
        base = dq._base if dq is not None else None
        if base is not None and all(g is not None and g._base is base for g in grads) \
                and pack.is_views_of(base, grads):
            return base, None  # the attention backward wrote the packed gradient in place
        buf = torch.empty(pack.shape, dtype=pack.dtype, device=pack.device)
        for g, view in zip(grads, pack.views(buf)):
            if g is None:
                view.zero_()
            else:
                view.copy_(g)
        return buf, None


def _views_fn(hq: int, hkv: int, d: int, interleaved: bool):
    if interleaved:  # per kv group [its query heads, key, value]: strided q when hq == hkv only
        def views(x):
            grouped = x.view(*x.shape[:-1], hkv, 3, d)
            return grouped[..., 0, :], grouped[..., 1, :], grouped[..., 2, :]
        return views

    def views(x):  # [all q | all k | all v]
        lead = x.shape[:-1]
        q_end, k_end = hq * d, (hq + hkv) * d
        return (x[..., :q_end].view(*lead, hq, d), x[..., q_end:k_end].view(*lead, hkv, d),
                x[..., k_end:].view(*lead, hkv, d))
    return views


def can_pack(mixed: torch.Tensor, hq: int, hkv: int, interleaved: bool) -> bool:
    """Whether split_packed_qkv applies: q/k/v are strided views of `mixed` (the interleaved GQA
    layout puts a kv group's query heads between keys and values: no single stride for q)."""
    return mixed.is_contiguous() and mixed.dim() >= 2 and (not interleaved or hq == hkv)


def split_packed_qkv(mixed: torch.Tensor, hq: int, hkv: int, d: int, interleaved: bool):
    """(q, k, v) [..., heads, d] as views of the packed projection `mixed` (see the module
    docstring)."""
    if not can_pack(mixed, hq, hkv, interleaved):
        raise ValueError(f"split_packed_qkv: mixed {tuple(mixed.shape)} (contiguous: "
                         f"{mixed.is_contiguous()}) with {hq}/{hkv} heads, interleaved "
                         f"{interleaved}: q/k/v are not strided views of it; see can_pack")
    if mixed.shape[-1] != (hq + 2 * hkv) * d:
        raise ValueError(f"split_packed_qkv: mixed has {mixed.shape[-1]} features; expected "
                         f"(hq {hq} + 2 * hkv {hkv}) * d {d} = {(hq + 2 * hkv) * d}")
    pack = QKVPack(mixed.shape, mixed.dtype, mixed.device, _views_fn(hq, hkv, d, interleaved))
    q, k, v = _SplitPacked.apply(mixed, pack)
    for t in (q, k, v):
        setattr(t, PACK_ATTR, pack)
    return q, k, v
