"""Fused rotary position embedding: forward vs the plain-torch reference, backward vs torch
autograd of the reference, over layouts (sbhd, bshd, thd), both rotation conventions, rotary
dim <= head dim, dtypes and odd sizes. The reference itself is checked against an element-by-
element float64 model of the definition in rope.h.
"""
import numpy as np
import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels import rope as rope_mod
from utils import DEVICES, randn, stable_seed, tols

HP = [torch.float32, torch.float16, torch.bfloat16]
# (heads, head dim, rotary dim): full rotation, partial, odd head dim, rotary halves that are
# not a whole 16-byte group (scalar paths), a large head.
HEAD_CASES = [(4, 128, 128), (3, 64, 32), (2, 33, 16), (5, 40, 24), (1, 256, 64), (2, 6, 2)]


def _freqs(rows, rot, interleaved, seed, kind):
    """[rows, 1, 1, rot] float32: standard RoPE angles (large at long positions) or random ones
    (every element its own angle, so a wrong partner index cannot go unnoticed)."""
    if kind == "random":
        return (torch.rand((rows, 1, 1, rot), generator=torch.Generator().manual_seed(seed))
                * 20 - 10)
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    ang = torch.outer(torch.arange(rows, dtype=torch.float32), inv)
    ang = ang.repeat_interleave(2, dim=-1) if interleaved else torch.cat((ang, ang), dim=-1)
    return ang.reshape(rows, 1, 1, rot)


def _shape(fmt, s, b, h, d):
    return {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (s * b, h, d)}[fmt]


def _cu_seqlens(total, device):
    # Uneven sequences, one of them empty.
    cuts = sorted({0, total, total // 5, total // 5, total // 2 + 1, total - 1})
    return torch.tensor(cuts, dtype=torch.int32, device=device)


def _model(x, freqs, fmt, interleaved, cu=None):
    """Element-by-element float64 model of rope.h (slow; small inputs only)."""
    x = x.double().numpy()
    f = freqs.reshape(-1, freqs.shape[-1]).double().numpy()
    rot = f.shape[-1]
    out = x.copy()
    tokens = x.reshape(-1, x.shape[-2], x.shape[-1])
    res = out.reshape(tokens.shape)
    for t in range(tokens.shape[0]):
        if fmt == "sbhd":
            pos = t // x.shape[1]
        elif fmt == "bshd":
            pos = t % x.shape[1]
        else:
            k = max(i for i in range(len(cu) - 1) if cu[i] <= t)
            pos = t - cu[k]
        c, s = np.cos(f[pos]), np.sin(f[pos])
        v = tokens[t][:, :rot]
        if interleaved:
            rotv = np.empty_like(v)
            rotv[:, 0::2], rotv[:, 1::2] = -v[:, 1::2], v[:, 0::2]
        else:
            half = rot // 2
            rotv = np.concatenate((-v[:, half:], v[:, :half]), axis=-1)
        res[t][:, :rot] = v * c + rotv * s
    return out


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("heads", [(3, 10, 6), (2, 8, 8)])
def test_reference_matches_model(fmt, interleaved, heads):
    h, d, rot = heads
    x = randn(_shape(fmt, 7, 3, h, d), torch.float32, "cpu", seed=3)
    freqs = _freqs(9, rot, interleaved, seed=4, kind="random")
    cu = _cu_seqlens(21, "cpu") if fmt == "thd" else None
    got = rope_mod.rope_reference(x, freqs, fmt, interleaved, cu)
    want = _model(x, freqs, fmt, interleaved, cu.tolist() if cu is not None else None)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("heads", HEAD_CASES)
@pytest.mark.parametrize("kind", ["standard", "random"])
def test_forward_and_backward(device, dtype, fmt, interleaved, heads, kind):
    h, d, rot = heads
    s, b = 37, 3
    x = randn(_shape(fmt, s, b, h, d), dtype, device, seed=stable_seed(fmt, heads, modulo=1000))
    rows = s * b if fmt == "thd" else s + 5  # cover the longest packed sequence
    freqs = _freqs(rows, rot, interleaved, seed=11, kind=kind).to(device)
    cu = _cu_seqlens(s * b, device) if fmt == "thd" else None
    y = kernels.rope_forward(x, freqs, fmt, interleaved, cu)
    xc = x.cpu().requires_grad_(True)
    cuc = cu.cpu() if cu is not None else None
    want = rope_mod.rope_reference(xc, freqs.cpu(), fmt, interleaved, cuc)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.cpu(), want.detach(), **tols(dtype))
    # Backward: the op against torch autograd of the reference.
    g = randn(x.shape, dtype, device, seed=5)
    dx = kernels.rope_backward(g, freqs, fmt, interleaved, cu)
    want.backward(g.cpu())
    torch.testing.assert_close(dx.cpu(), xc.grad, **tols(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_long_sequence_large_angles(device, fmt):
    # Angles reach thousands of radians at long positions: fast sin/cos would fail here.
    s, b, h, d = 4096, 2, 2, 64
    x = randn(_shape(fmt, s, b, h, d), torch.float32, device, seed=8)
    freqs = _freqs(s, d, False, 0, "standard").to(device)
    y = kernels.rope_forward(x, freqs, fmt)
    want = rope_mod.rope_reference(x.cpu(), freqs.cpu(), fmt)
    torch.testing.assert_close(y.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_pos_emb_autograd_and_views(device, interleaved):
    s, b, h, d = 16, 2, 4, 64
    qkv = randn((s, b, 3 * h, d), torch.bfloat16, device, seed=2)
    q = qkv[:, :, :h].detach().requires_grad_(True)  # a strided view, as after a qkv split
    freqs = _freqs(s, 32, interleaved, 0, "standard").to(device)
    y = kernels.apply_rotary_pos_emb(q, freqs, "sbhd", interleaved)
    g = randn(y.shape, torch.bfloat16, device, seed=3)
    y.backward(g)
    qr = q.detach().cpu().requires_grad_(True)
    yr = rope_mod.rope_reference(qr, freqs.cpu(), "sbhd", interleaved)
    yr.backward(g.cpu())
    torch.testing.assert_close(y.detach().cpu(), yr.detach(), **tols(torch.bfloat16))
    torch.testing.assert_close(q.grad.cpu(), qr.grad, **tols(torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_single(device):
    freqs = _freqs(4, 8, False, 0, "standard").to(device)
    x = randn((0, 2, 3, 8), torch.bfloat16, device, seed=1)
    assert kernels.rope_forward(x, freqs).shape == x.shape
    x1 = randn((1, 1, 1, 8), torch.bfloat16, device, seed=1)
    torch.testing.assert_close(kernels.rope_forward(x1, freqs).cpu(),
                               rope_mod.rope_reference(x1.cpu(), freqs.cpu()), **tols(torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_thd_positions_past_freqs_are_nan(device):
    # The caller guarantees freqs covers every packed sequence; if not, the rotated part of the
    # uncovered tokens is NaN (never silently wrong), the pass-through part is still copied.
    x = randn((10, 2, 8), torch.float32, device, seed=1)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32, device=device)
    freqs = _freqs(5, 4, False, 0, "random").to(device)
    y = kernels.rope_forward(x, freqs, "thd", cu_seqlens=cu).cpu()
    nan_rows = torch.isnan(y[:, :, :4]).all(-1).all(-1)
    assert nan_rows.tolist() == [False] * 3 + [False] * 5 + [True] * 2
    torch.testing.assert_close(y[:, :, 4:], x[:, :, 4:].cpu())
    torch.testing.assert_close(y, rope_mod.rope_reference(x.cpu(), freqs.cpu(), "thd", False,
                                                          cu.cpu()), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_op_and_argument(device):
    x = randn((4, 2, 3, 8), torch.bfloat16, device, seed=1)
    freqs = _freqs(4, 8, False, 0, "standard").to(device)
    with pytest.raises(ValueError, match="rope_forward.*rotary dim"):
        kernels.rope_forward(x, _freqs(4, 10, False, 0, "standard").to(device))
    with pytest.raises(ValueError, match="freqs has 2 positions"):
        kernels.rope_forward(x, freqs[:2])
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        kernels.rope_forward(x[:, 0], freqs, "thd")
    with pytest.raises(ValueError, match="tensor_format"):
        kernels.rope_forward(x, freqs, "hbsd")
    with pytest.raises(ValueError, match="freqs has dtype"):
        kernels.rope_forward(x, freqs.double())
