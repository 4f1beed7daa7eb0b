"""Fused rotary position embedding (RoPE) for sbhd, bshd and thd (packed, with cu_seqlens)
layouts, interleaved or rotate-half, with a rotary dim R <= head dim (the rest passes through).

freqs: float32 [s_max, 1, 1, R] angles; freqs[p, k] rotates element k at position p:
  out[..., :R] = x * cos(freqs) + rotate(x) * sin(freqs),   out[..., R:] = x[..., R:]
rotate (non-interleaved, "rotate half"): cat(-x[R/2:R], x[:R/2]); interleaved: pairs
(x[2i], x[2i+1]) -> (-x[2i+1], x[2i]). thd: token t of sequence k (cu_seqlens[k] <= t <
cu_seqlens[k+1]) has position t - cu_seqlens[k]. Positions without a freqs row give NaN.

The native kernels and the reference both compute in fp32 and round once to x.dtype.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import native
from ._checks import check_tensor

FORMATS = {"sbhd": 0, "bshd": 1, "thd": 2}


# ----- reference -------------------------------------------------------------------------------

def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _thd_positions(cu_seqlens: torch.Tensor, tokens: int, device) -> torch.Tensor:
    """Position of each packed token: t minus the start of the last sequence starting <= t."""
    t = torch.arange(tokens, device=device, dtype=torch.int64)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:-1].contiguous(), t, right=True)
    return t - cu[seq]


def _angles_per_token(x, freqs, tensor_format, cu_seqlens):
    """freqs broadcastable against x[..., :R] (fp32), NaN where a position has no row."""
    rot = freqs.shape[-1]
    table = freqs.reshape(-1, rot).float().to(x.device)
    table = torch.cat((table, torch.full((1, rot), float("nan"), device=x.device)))
    rows = table.shape[0] - 1
    if tensor_format == "thd":
        pos = _thd_positions(cu_seqlens, x.shape[0], x.device)
        pos = torch.where((pos >= 0) & (pos < rows), pos, rows)
        return table[pos][:, None, :]                     # [t, 1, R]
    s = x.shape[0] if tensor_format == "sbhd" else x.shape[1]
    ang = table[torch.clamp(torch.arange(s, device=x.device), max=rows)]
    return ang[:, None, None, :] if tensor_format == "sbhd" else ang[None, :, None, :]


def rope_reference(x: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                   interleaved: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
    """RoPE in plain torch (fp32 maths, one rounding to x.dtype); differentiable in x."""
    rot = freqs.shape[-1]
    ang = _angles_per_token(x, freqs, tensor_format, cu_seqlens)
    xr = x[..., :rot].float()
    out = xr * torch.cos(ang) + _rotate(xr, interleaved) * torch.sin(ang)
    return torch.cat((out.to(x.dtype), x[..., rot:]), dim=-1)


def rope_backward_reference(grad, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None):
    """dx by torch autograd of the fp32 reference (the map is linear, so x's value is irrelevant)."""
    with torch.enable_grad():
        x = torch.zeros(grad.shape, dtype=torch.float32, device=grad.device, requires_grad=True)
        y = rope_reference(x, freqs, tensor_format, interleaved, cu_seqlens)
        (dx,) = torch.autograd.grad(y, x, grad.float())
    return dx.to(grad.dtype)


# ----- ops -------------------------------------------------------------------------------------

def _check(op, x, name, freqs, tensor_format, cu_seqlens):
    check_tensor(op, name, x, native.HP_DTYPES, contiguous=False)
    if tensor_format not in FORMATS:
        raise ValueError(f"{op}: tensor_format is {tensor_format!r}; expected sbhd, bshd or thd")
    want = 3 if tensor_format == "thd" else 4
    if x.dim() != want:
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}; expected {want} dims for "
                         f"{tensor_format}")
    check_tensor(op, "freqs", freqs, (torch.float32,), contiguous=False)
    rot = freqs.shape[-1] if freqs.dim() else 0
    if rot == 0 or rot % 2 or rot > x.shape[-1]:
        raise ValueError(f"{op}: freqs has rotary dim {rot} (its last dim); expected an even "
                         f"number in 2..{x.shape[-1]} (the head dim)")
    if freqs.device != x.device:
        raise ValueError(f"{op}: freqs is on {freqs.device}; expected {x.device} like {name}")
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError(f"{op}: cu_seqlens is required for the thd format")
        check_tensor(op, "cu_seqlens", cu_seqlens, (torch.int32,))
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{op}: cu_seqlens has shape {tuple(cu_seqlens.shape)}; expected "
                             "[num_sequences + 1]")
    else:
        s = x.shape[0] if tensor_format == "sbhd" else x.shape[1]
        rows = freqs.numel() // rot
        if s > rows:
            raise ValueError(f"{op}: freqs has {rows} positions; expected at least {s}")


def _run(fn_name, op, x, name, freqs, tensor_format, interleaved, cu_seqlens):
    _check(op, x, name, freqs, tensor_format, cu_seqlens)
    # q and k are often strided views (a split of a fused qkv); the kernel reads dense rows.
    x = x.contiguous()
    freqs = freqs.contiguous()
    out = torch.empty_like(x)
    cu = cu_seqlens.to(x.device) if tensor_format == "thd" else None
    getattr(native.native_for_torch(), fn_name)(
        native.describe(x), native.describe(freqs), None if cu is None else native.describe(cu),
        native.describe(out), FORMATS[tensor_format], bool(interleaved), native.stream_of(x))
    return out


def rope_forward(x: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                 interleaved: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
    """RoPE of x (see the module docstring); returns a new tensor of x's shape and dtype."""
    op = "rope_forward"
    if native.use_native(x):
        return _run("fused_rope_forward", op, x, "x", freqs, tensor_format, interleaved, cu_seqlens)
    _check(op, x, "x", freqs, tensor_format, cu_seqlens)
    return rope_reference(x, freqs, tensor_format, interleaved, cu_seqlens)


def rope_backward(grad: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                  interleaved: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
    """Gradient of rope_forward with respect to x, given the output gradient."""
    op = "rope_backward"
    if native.use_native(grad):
        return _run("fused_rope_backward", op, grad, "grad", freqs, tensor_format, interleaved,
                    cu_seqlens)
    _check(op, grad, "grad", freqs, tensor_format, cu_seqlens)
    return rope_backward_reference(grad, freqs, tensor_format, interleaved, cu_seqlens)


class _FusedRoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, freqs, tensor_format, interleaved, cu_seqlens):
        ctx.save_for_backward(freqs, cu_seqlens)
        ctx.tensor_format, ctx.interleaved = tensor_format, interleaved
        return rope_forward(x, freqs, tensor_format, interleaved, cu_seqlens)

    @staticmethod
    def backward(ctx, grad):
        freqs, cu_seqlens = ctx.saved_tensors
        dx = rope_backward(grad, freqs, ctx.tensor_format, ctx.interleaved, cu_seqlens)
        return dx, None, None, None, None


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         interleaved: bool = False, fused: bool = True,
                         cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Apply rotary position embeddings to ``t``; differentiable.

    Parameters
    ----------
    t : torch.Tensor
        Queries or keys ``[seq, batch, heads, dim]`` (``'sbhd'``), ``[batch, seq, heads, dim]``
        (``'bshd'``) or packed ``[tokens, heads, dim]`` (``'thd'``).
    freqs : torch.Tensor
        Angles ``[seq, 1, 1, R]`` from :class:`RotaryPositionEmbedding`, ``R <= dim``; the
        channels past ``R`` pass through unchanged.
    tensor_format : {'sbhd', 'bshd', 'thd'}, default 'sbhd'
        Layout of ``t``.
    interleaved : bool, default False
        Rotate adjacent channel pairs instead of the two halves of the rotated channels.
    fused : bool, default True
        Use the native fused kernels where available (NVIDIA and AMD GPUs); False, or a tensor on
        the CPU, uses the reference implementation with autograd.
    cu_seqlens : torch.Tensor, optional
        int32 ``[batch + 1]`` cumulative sequence lengths; required with ``'thd'``, where each
        sequence's positions start at 0.

    Returns
    -------
    torch.Tensor
        The rotated tensor, of ``t``'s shape and dtype.
    """
    if fused and native.use_native(t):
        return _FusedRoPE.apply(t, freqs, tensor_format, interleaved, cu_seqlens)
    _check("apply_rotary_pos_emb", t, "t", freqs, tensor_format, cu_seqlens)
    return rope_reference(t, freqs, tensor_format, interleaved, cu_seqlens)
