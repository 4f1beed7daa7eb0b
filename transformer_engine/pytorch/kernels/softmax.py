"""Fused scaled softmax over the last dimension: plain, masked and causal (upper-triangular).

Each op runs the native kernel for float16/bfloat16 CUDA/ROCm tensors when the native core is built
for this torch, and its plain-torch reference (defined next to it) otherwise (float32 included).
The maths, in fp32, rounded once to x's dtype:
  scaled_softmax:                      y = softmax(scale * x)
  scaled_masked_softmax:               y = softmax(where(mask, -inf, scale * x)), True = masked out,
                                       mask [b or 1, h or 1, sq, sk] broadcast over x [b, h, sq, sk]
  scaled_upper_triang_masked_softmax:  causal: key j > query i masked, x is [..., sq, sk], sq == sk
A row with every element masked gives zeros (not NaN). Backward: dx = scale * y * (dy - sum(dy * y)).
"""
from __future__ import annotations

import torch

from .. import native
from ._checks import check_tensor

_NATIVE_DTYPES = (torch.float16, torch.bfloat16)
_KIND = {"plain": 0, "masked": 1, "causal": 2}


# ----- references ----------------------------------------------------------------------------

def _softmax_fp32(logits):
    """softmax over the last dim; rows that are entirely -inf give zeros instead of NaN."""
    y = torch.softmax(logits, -1)
    if logits.numel() == 0:
        return y
    empty_row = logits.amax(-1, keepdim=True) == float("-inf")
    return torch.where(empty_row, torch.zeros((), device=y.device), y)


def causal_mask(sq: int, sk: int, device=None) -> torch.Tensor:
    """[sq, sk] bool, True above the diagonal (key after query): the upper-triangular mask."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def scaled_softmax_forward_reference(x, scale):
    return _softmax_fp32(x.float() * scale).to(x.dtype)


def scaled_masked_softmax_forward_reference(x, mask, scale):
    return _softmax_fp32((x.float() * scale).masked_fill(mask.bool(), float("-inf"))).to(x.dtype)


def scaled_upper_triang_masked_softmax_forward_reference(x, scale):
    mask = causal_mask(x.shape[-2], x.shape[-1], x.device)
    return _softmax_fp32((x.float() * scale).masked_fill(mask, float("-inf"))).to(x.dtype)


def scaled_softmax_backward_reference(dy, y, scale):
    yf, dyf = y.float(), dy.float()
    return (scale * yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(y.dtype)


# ----- checks --------------------------------------------------------------------------------

def _check_input(op, name, x, min_dims):
    check_tensor(op, name, x, native.HP_DTYPES)
    if x.dim() < min_dims:
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected at least {min_dims} dims")


def _check_causal(op, name, x):
    _check_input(op, name, x, 2)
    if x.shape[-2] != x.shape[-1]:
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected [..., sq, sk] with sq == sk")


def _check_mask(op, x, mask):
    check_tensor(op, "mask", mask, (torch.bool, torch.uint8))
    b, h, sq, sk = x.shape
    ok = (mask.dim() == 4 and mask.shape[0] in (1, b) and mask.shape[1] in (1, h)
          and tuple(mask.shape[2:]) == (sq, sk))
    if not ok:
        raise ValueError(f"{op}: mask has shape {tuple(mask.shape)}; expected "
                         f"[{b} or 1, {h} or 1, {sq}, {sk}] for x of shape {tuple(x.shape)}")
    if mask.device != x.device:
        raise ValueError(f"{op}: mask is on {mask.device}; expected {x.device} like x")


def _native_ok(x):
    return x.dtype in _NATIVE_DTYPES and native.use_native(x)


# ----- forward -------------------------------------------------------------------------------

def scaled_softmax_forward(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """softmax(scale * x) over the last dimension."""
    _check_input("scaled_softmax_forward", "x", x, 1)
    if not _native_ok(x):
        return scaled_softmax_forward_reference(x, scale)
    y = torch.empty_like(x)
    native.native_for_torch().scaled_softmax_forward(native.describe(x), native.describe(y),
                                                     float(scale), native.stream_of(x))
    return y


def scaled_masked_softmax_forward(x: torch.Tensor, mask: torch.Tensor, scale: float = 1.0
                                  ) -> torch.Tensor:
    """softmax(where(mask, -inf, scale * x)); x [b, h, sq, sk], mask [b|1, h|1, sq, sk] bool/uint8."""
    op = "scaled_masked_softmax_forward"
    _check_input(op, "x", x, 4)
    if x.dim() != 4:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}; expected [b, h, sq, sk]")
    _check_mask(op, x, mask)
    if not _native_ok(x):
        return scaled_masked_softmax_forward_reference(x, mask, scale)
    y = torch.empty_like(x)
    native.native_for_torch().scaled_masked_softmax_forward(
        native.describe(x), native.describe(mask), native.describe(y), float(scale),
        native.stream_of(x))
    return y


def scaled_upper_triang_masked_softmax_forward(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Causal softmax of x [..., sq, sq]: key j > query i is masked out."""
    _check_causal("scaled_upper_triang_masked_softmax_forward", "x", x)
    if not _native_ok(x):
        return scaled_upper_triang_masked_softmax_forward_reference(x, scale)
    y = torch.empty_like(x)
    native.native_for_torch().scaled_upper_triang_masked_softmax_forward(
        native.describe(x), native.describe(y), float(scale), native.stream_of(x))
    return y


# ----- backward ------------------------------------------------------------------------------

def _backward(op, kind, dy, y, scale):
    _check_input(op, "y", y, 2 if kind == "causal" else 1)
    if kind == "causal":
        _check_causal(op, "y", y)
    check_tensor(op, "dy", dy, (y.dtype,))
    if dy.shape != y.shape or dy.device != y.device:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} on {dy.device}; expected "
                         f"{tuple(y.shape)} on {y.device} like y")
    if not _native_ok(y):
        dx = scaled_softmax_backward_reference(dy, y, scale)
        if kind == "causal":  # exact zeros above the diagonal, as the kernel writes them
            dx = dx.masked_fill(causal_mask(y.shape[-2], y.shape[-1], y.device), 0)
        return dx
    dx = torch.empty_like(y)
    native.native_for_torch().scaled_softmax_backward(
        native.describe(dy), native.describe(y), native.describe(dx), float(scale), _KIND[kind],
        native.stream_of(y))
    return dx


def scaled_softmax_backward(dy: torch.Tensor, y: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """dx = scale * y * (dy - sum(dy * y)) with y the forward's output."""
    return _backward("scaled_softmax_backward", "plain", dy, y, scale)


def scaled_masked_softmax_backward(dy: torch.Tensor, y: torch.Tensor, scale: float = 1.0
                                   ) -> torch.Tensor:
    return _backward("scaled_masked_softmax_backward", "masked", dy, y, scale)


def scaled_upper_triang_masked_softmax_backward(dy: torch.Tensor, y: torch.Tensor,
                                                scale: float = 1.0) -> torch.Tensor:
    return _backward("scaled_upper_triang_masked_softmax_backward", "causal", dy, y, scale)


# ----- autograd ------------------------------------------------------------------------------

class _ScaledSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, scale, kind):
        if kind == "causal":
            y = scaled_upper_triang_masked_softmax_forward(x, scale)
        elif kind == "masked":
            y = scaled_masked_softmax_forward(x, mask, scale)
        else:
            y = scaled_softmax_forward(x, scale)
        ctx.save_for_backward(y)
        ctx.scale, ctx.kind = scale, kind
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = _backward("scaled_softmax_backward", ctx.kind, dy.contiguous(), y, ctx.scale)
        return dx, None, None, None


def scaled_softmax(x, scale=1.0):
    """Differentiable softmax(scale * x)."""
    return _ScaledSoftmax.apply(x, None, scale, "plain")


def scaled_masked_softmax(x, mask, scale=1.0):
    """Differentiable masked softmax (mask True = masked out)."""
    return _ScaledSoftmax.apply(x, mask, scale, "masked")


def scaled_upper_triang_masked_softmax(x, scale=1.0):
    """Differentiable causal softmax."""
    return _ScaledSoftmax.apply(x, None, scale, "causal")
