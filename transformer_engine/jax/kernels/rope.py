"""Rotary position embedding in jnp for sbhd, bshd and thd (cu_seqlens) layouts, interleaved or
rotate-half, rotary dim R = freqs.shape[-1] <= head dim; fp32 maths, one rounding to x.dtype.
Same definition as transformer_engine/pytorch/kernels/rope.py and csrc rope.h; positions without a
freqs row give NaN."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _rotate(x, interleaved):
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return jnp.stack((-odd, even), axis=-1).reshape(x.shape)
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-second, first), axis=-1)


def _angles(x, freqs, tensor_format, cu_seqlens):
    rot = freqs.shape[-1]
    table = jnp.asarray(freqs, jnp.float32).reshape(-1, rot)
    rows = table.shape[0]
    table = jnp.concatenate((table, jnp.full((1, rot), jnp.nan, jnp.float32)))
    if tensor_format == "thd":
        t = jnp.arange(x.shape[0])
        cu = jnp.asarray(cu_seqlens, jnp.int32)
        seq = jnp.searchsorted(cu[1:-1], t, side="right")
        pos = t - cu[seq]
        pos = jnp.where((pos >= 0) & (pos < rows), pos, rows)
        return table[pos][:, None, :]
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"rope: tensor_format is {tensor_format!r}; expected sbhd, bshd or thd")
    s = x.shape[0] if tensor_format == "sbhd" else x.shape[1]
    ang = table[jnp.minimum(jnp.arange(s), rows)]
    return ang[:, None, None, :] if tensor_format == "sbhd" else ang[None, :, None, :]


def rope_forward(x, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None):
    rot = freqs.shape[-1]
    if rot % 2 or rot > x.shape[-1]:
        raise ValueError(f"rope: rotary dim {rot} must be even and <= head dim {x.shape[-1]}")
    ang = _angles(x, freqs, tensor_format, cu_seqlens)
    xr = x[..., :rot].astype(jnp.float32)
    out = xr * jnp.cos(ang) + _rotate(xr, interleaved) * jnp.sin(ang)
    return jnp.concatenate((out.astype(x.dtype), x[..., rot:]), axis=-1)


def rope_backward(grad, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None):
    """dx of rope (linear in x) by autodiff of the fp32 map."""
    zero = jnp.zeros(grad.shape, jnp.float32)
    _, vjp = jax.vjp(lambda v: rope_forward(v, freqs, tensor_format, interleaved, cu_seqlens), zero)
    return vjp(grad.astype(jnp.float32))[0].astype(grad.dtype)
