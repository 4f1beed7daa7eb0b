"""Fused scaled softmax (plain, masked, causal), forward and backward.

Forward results are compared with the plain-torch reference at the shared tolerances, masked
elements must be exact zeros, and fully masked rows zeros rather than NaN. Gradients are compared
with torch autograd of the reference in float64 (an independent derivation of the closed form).
"""
import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.softmax import causal_mask
from utils import DEVICES, randn, seeded, tols

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# [b, h, sq, sk]: odd lengths (general path), register-path lengths from short to 16k, and one
# past the register path (16392 is a multiple of 8 but longer than 16384).
SHAPES = [(1, 1, 1, 1), (2, 3, 5, 37), (2, 2, 16, 128), (1, 4, 33, 1000), (2, 1, 8, 1001),
          (1, 2, 16, 4096), (1, 1, 4, 16384), (1, 1, 3, 16392), (0, 2, 4, 64)]
CAUSAL_SHAPES = [(1, 1, 1), (3, 37, 37), (2, 128, 128), (1, 1000, 1000), (1, 1001, 1001),
                 (0, 16, 16)]
SCALE = 0.125


def dname(dt):
    return str(dt).replace("torch.", "")


def sid(s):
    return "x".join(map(str, s))


def random_mask(shape, seed, p=0.3):
    return torch.rand(shape, generator=seeded(seed)) < p


def oracle_grad(x, dy, scale, mask):
    """autograd of softmax(where(mask, -inf, scale * x)) in float64 on the CPU."""
    xd = x.detach().cpu().double().requires_grad_()
    logits = xd * scale
    if mask is not None:
        logits = logits.masked_fill(mask.cpu(), float("-inf"))
    torch.softmax(logits, -1).backward(dy.detach().cpu().double())
    return xd.grad


def close(got, want, dtype, what):
    torch.testing.assert_close(got.cpu().float(), want.cpu().float(), **tols(dtype),
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", SHAPES, ids=sid)
def test_scaled_softmax(device, dtype, shape):
    x = randn(shape, dtype, device, seed=sum(shape), scale=4.0)
    y = kernels.scaled_softmax_forward(x, SCALE)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, kernels.softmax.scaled_softmax_forward_reference(x.cpu(), SCALE), dtype, "y")
    dy = randn(shape, dtype, device, seed=1)
    dx = kernels.scaled_softmax_backward(dy, y, SCALE)
    # The backward takes the rounded y, so compare with the closed form on that y at the dtype's
    # tolerance, and with autograd (float64, unrounded y) at a tolerance that includes y's rounding.
    close(dx, kernels.softmax.scaled_softmax_backward_reference(dy.cpu(), y.cpu(), SCALE), dtype, "dx")
    if x.numel():
        want = oracle_grad(x, dy, SCALE, None)
        err = (dx.cpu().double() - want).abs().max().item()
        assert err <= 4 * tols(dtype)["rtol"] * SCALE * dy.abs().max().item() + 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("broadcast", ["full", "batch", "heads", "both"])
@pytest.mark.parametrize("shape", SHAPES, ids=sid)
def test_scaled_masked_softmax(device, dtype, broadcast, shape):
    b, h, sq, sk = shape
    mb = 1 if broadcast in ("batch", "both") else b
    mh = 1 if broadcast in ("heads", "both") else h
    x = randn(shape, dtype, device, seed=sum(shape) + 3, scale=4.0)
    mask = random_mask((mb, mh, sq, sk), seed=sk)
    if sq > 1:
        mask[..., 1, :] = True  # a fully masked row: zeros, not NaN
    mask = mask.to(device)
    y = kernels.scaled_masked_softmax_forward(x, mask, SCALE)
    want = kernels.softmax.scaled_masked_softmax_forward_reference(x.cpu(), mask.cpu(), SCALE)
    close(y, want, dtype, "y")
    full_mask = mask.cpu().expand(shape)
    assert not torch.isnan(y).any()
    assert (y.cpu()[full_mask] == 0).all(), "masked elements must be exact zeros"
    dy = randn(shape, dtype, device, seed=2)
    dx = kernels.scaled_masked_softmax_backward(dy, y, SCALE)
    close(dx, kernels.softmax.scaled_softmax_backward_reference(dy.cpu(), y.cpu(), SCALE), dtype, "dx")
    assert (dx.cpu()[full_mask] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=sid)
def test_scaled_upper_triang_masked_softmax(device, dtype, shape):
    x = randn(shape, dtype, device, seed=sum(shape) + 5, scale=4.0)
    y = kernels.scaled_upper_triang_masked_softmax_forward(x, SCALE)
    want = kernels.softmax.scaled_upper_triang_masked_softmax_forward_reference(x.cpu(), SCALE)
    close(y, want, dtype, "y")
    upper = causal_mask(shape[-2], shape[-1]).expand(shape)
    assert (y.cpu()[upper] == 0).all()
    dy = randn(shape, dtype, device, seed=4)
    dx = kernels.scaled_upper_triang_masked_softmax_backward(dy, y, SCALE)
    close(dx, kernels.softmax.scaled_softmax_backward_reference(dy.cpu(), y.cpu(), SCALE), dtype, "dx")
    assert (dx.cpu()[upper] == 0).all(), "gradient above the diagonal must be exact zeros"


# Forward shapes with many rows at the attention lengths the register layouts are tuned for
# (8192: 256 threads x 4 chunks per row; 4096: 128 x 4; 1024: 32 x 4), row counts that leave the
# last block partly empty, and causal rows whose valid length ends inside a chunk.
MANY_ROW_SHAPES = [(3, 5, 211, 8192), (1, 3, 1031, 4096), (2, 1, 3001, 1024)]
CAUSAL_MANY_ROW_SHAPES = [(3, 1200, 1200), (2, 2048, 2048)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dname)
@pytest.mark.parametrize("shape", MANY_ROW_SHAPES + CAUSAL_MANY_ROW_SHAPES, ids=sid)
def test_forward_many_rows(device, dtype, shape):
    x = randn(shape, dtype, device, seed=len(shape) + shape[-1], scale=4.0)
    if len(shape) == 3:
        y = kernels.scaled_upper_triang_masked_softmax_forward(x, SCALE)
        want = kernels.softmax.scaled_upper_triang_masked_softmax_forward_reference(x.cpu(), SCALE)
        assert (y.cpu()[causal_mask(shape[-2], shape[-1]).expand(shape)] == 0).all()
    else:
        y = kernels.scaled_softmax_forward(x, SCALE)
        want = kernels.softmax.scaled_softmax_forward_reference(x.cpu(), SCALE)
    close(y, want, dtype, "y")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["plain", "masked", "causal"])
def test_autograd_matches_float64_autograd(device, kind):
    dtype = torch.bfloat16
    shape = (2, 3, 24, 24)
    x = randn(shape, dtype, device, seed=8, scale=4.0)
    dy = randn(shape, dtype, device, seed=9)
    mask = None
    xr = x.detach().clone().requires_grad_()
    if kind == "masked":
        mask = random_mask((2, 1, 24, 24), seed=3).to(device)
        y = kernels.scaled_masked_softmax(xr, mask, SCALE)
    elif kind == "causal":
        mask = causal_mask(24, 24, device).expand(shape)
        y = kernels.scaled_upper_triang_masked_softmax(xr, SCALE)
    else:
        y = kernels.scaled_softmax(xr, SCALE)
    y.backward(dy)
    want = oracle_grad(x, dy, SCALE, mask)
    err = (xr.grad.cpu().double() - want).abs().max().item()
    assert err <= 4 * tols(dtype)["rtol"] * SCALE * dy.abs().max().item()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_name_op_and_argument(device):
    x = randn((2, 2, 4, 8), torch.bfloat16, device)
    with pytest.raises(ValueError, match="scaled_masked_softmax_forward: mask has shape"):
        kernels.scaled_masked_softmax_forward(x, torch.zeros(2, 2, 4, 4, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="scaled_masked_softmax_forward: mask has dtype"):
        kernels.scaled_masked_softmax_forward(x, torch.zeros(2, 2, 4, 8, device=device))
    with pytest.raises(ValueError, match="scaled_upper_triang_masked_softmax_forward: x has shape"):
        kernels.scaled_upper_triang_masked_softmax_forward(x)
    with pytest.raises(ValueError, match="scaled_softmax_backward: dy has shape"):
        kernels.scaled_softmax_backward(x[:1], x)
