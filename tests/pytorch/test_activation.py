"""Activations, gated activations, their backward passes and the fused dbias + dact.

Every op is compared with its plain-torch reference (computed on the CPU), gradients with torch
autograd of the reference, FP8 outputs with the reference quantization of the fp32 reference
result: bit for bit where the maths is exact in fp32 (relu, srelu), else within one FP8 ulp.
On every device the references are also checked against an independent float64 model.
"""
import math

import numpy as np
import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels import activation as act
from transformer_engine.pytorch.kernels.cast import fp8_max_of, quantize_reference
from utils import DEVICES, device_fp8_dtype, randn, stable_seed, tols

HP = [torch.float32, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
PLAIN = list(act.ACTIVATIONS)
GATED = list(act.GATED)
EXACT = {"relu", "srelu", "reglu", "sreglu"}  # fp32 maths identical in kernel and reference
# Odd sizes (scalar paths), aligned ones (vector paths), 3-D, empty and a large one.
SHAPES = [(37, 46), (128, 256), (3, 5, 48), (1, 2), (0, 64), (1000, 18), (1024, 4096)]


def _seed(*key):
    return stable_seed(*key)


def _close(got, want, dtype, **extra):
    torch.testing.assert_close(got.cpu().float(), want.float(), **{**tols(dtype), **extra})


def _scale(ref_fp32, fp8_dtype):
    amax = ref_fp32.abs().max().item() if ref_fp32.numel() else 1.0
    return 0.6 * fp8_max_of(fp8_dtype) / max(amax, 1e-6)


def _fp8_ulps(got, want):
    """Distance in representable steps between two FP8 tensors (same format)."""
    def ordered(t):
        b = t.view(torch.uint8).to(torch.int32)
        mag = b & 0x7F
        return torch.where(b >= 0x80, -mag, mag)
    return (ordered(got.cpu()) - ordered(want)).abs()


def _check_fp8(got, want, name):
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.numel() == 0:
        return
    ulps = _fp8_ulps(got, want)
    if name in EXACT:
        assert int(ulps.max()) == 0, f"FP8 output not bit-exact at {int((ulps > 0).sum())} places"
    else:
        assert int(ulps.max()) <= 1, f"FP8 output off by {int(ulps.max())} ulps"
        assert ulps.float().mean().item() < 0.01, "too many FP8 values one ulp off"


# ----- independent float64 model ---------------------------------------------------------------

def _model(x, name):
    x = np.asarray(x, dtype=np.float64)
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    base = {
        "gelu": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "relu": lambda v: np.maximum(v, 0),
        "qgelu": lambda v: v * sig(1.702 * v),
        "srelu": lambda v: np.maximum(v, 0) ** 2,
        "silu": lambda v: v * sig(v),
        "sigmoid": sig,
    }
    if name in act.GATED:
        n = x.shape[-1] // 2
        return base[act.GATED[name]](x[..., :n]) * x[..., n:]
    return base[name](x)


@pytest.mark.parametrize("name", PLAIN + GATED)
def test_reference_matches_float64_model(name):
    x = randn((64, 96), torch.float32, "cpu", seed=_seed(name), scale=3.0)
    got = act.activation_fp32_reference(x, name).double().numpy()
    np.testing.assert_allclose(got, _model(x.numpy(), name), rtol=1e-5, atol=1e-6)
    # Derivatives: central differences of sum(g * model(x)); rows are independent, so moving a
    # whole column at once gives every row's partial derivative for that column.
    g = randn(got.shape, torch.float32, "cpu", seed=_seed(name, "g"))
    dx = act.dactivation_fp32_reference(g, x, name).double().numpy()
    xd, gd, h = x.double().numpy(), g.double().numpy(), 1e-5
    num = np.zeros_like(xd)
    for j in range(xd.shape[-1]):
        e = np.zeros_like(xd)
        e[:, j] = h
        num[:, j] = ((_model(xd + e, name) - _model(xd - e, name)) / (2 * h) * gd).sum(-1)
    smooth = np.abs(xd) > 1e-3  # relu kinks: differences straddling 0 are not derivatives
    np.testing.assert_allclose(dx[smooth], num[smooth], rtol=1e-4, atol=1e-4)


# ----- forward / backward vs reference -------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN + GATED)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward(device, dtype, name, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name), scale=2.0)
    y = kernels.activation_forward(x, name)
    want = act.activation_reference(x.cpu(), name)
    assert y.dtype == dtype and y.shape == want.shape
    _close(y, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN + GATED)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_autograd(device, dtype, name, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "x"), scale=2.0)
    out_shape = act.activation_reference(x.cpu(), name).shape
    g = randn(out_shape, dtype, device, seed=_seed(shape, dtype, name, "g"))
    dx = kernels.activation_backward(g, x, name)
    xr = x.cpu().requires_grad_(True)
    act.activation_reference(xr, name).backward(g.cpu())
    assert dx.dtype == dtype and dx.shape == x.shape
    _close(dx, xr.grad, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gelu", "swiglu", "srelu"])
def test_apply_activation_autograd(device, name):
    x = randn((33, 64), torch.bfloat16, device, seed=5, scale=2.0).requires_grad_(True)
    y = kernels.apply_activation(x, name)
    g = randn(y.shape, torch.bfloat16, device, seed=6)
    y.backward(g)
    xr = x.detach().cpu().requires_grad_(True)
    yr = act.activation_reference(xr, name)
    yr.backward(g.cpu())
    _close(y.detach(), yr.detach(), torch.bfloat16)
    _close(x.grad, xr.grad, torch.bfloat16)


# ----- FP8 outputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN + GATED)
@pytest.mark.parametrize("shape", [(37, 46), (256, 512), (0, 32)])
def test_forward_fp8(device, fp8_dtype, dtype, name, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "f8"), scale=2.0)
    ref32 = act.activation_fp32_reference(x.cpu(), name)
    scale = torch.tensor([_scale(ref32, fp8_dtype)], device=device)
    amax = torch.zeros(1, device=device)
    y8, scale_inv = kernels.activation_forward(x, name, fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    want, want_si, want_amax = quantize_reference(ref32, scale.cpu(), fp8_dtype)
    assert y8.dtype == fp8_dtype and y8.shape == want.shape
    _check_fp8(y8, want, name)
    assert torch.equal(scale_inv.cpu(), want_si)
    torch.testing.assert_close(amax.cpu(), want_amax, rtol=1e-5, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("name", PLAIN + GATED)
def test_backward_fp8(device, fp8_dtype, name):
    shape = (96, 160)
    x = randn(shape, torch.bfloat16, device, seed=_seed(name, "b8"), scale=2.0)
    gshape = act.activation_reference(x.cpu(), name).shape
    g = randn(gshape, torch.bfloat16, device, seed=_seed(name, "b8g"))
    ref32 = act.dactivation_fp32_reference(g.cpu(), x.cpu(), name)
    scale = torch.tensor([_scale(ref32, fp8_dtype)], device=device)
    amax = torch.zeros(1, device=device)
    dx8, _ = kernels.activation_backward(g, x, name, fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    want, _, want_amax = quantize_reference(ref32, scale.cpu(), fp8_dtype)
    _check_fp8(dx8, want, name if name in ("relu", "reglu") else "inexact")
    torch.testing.assert_close(amax.cpu(), want_amax, rtol=1e-5, atol=0)


# ----- fused dbias + dact -----------------------------------------------------------------------

DBIAS_SHAPES = [(37, 23), (128, 256), (2, 3, 40), (0, 24), (1, 8), (4096, 96), (333, 1000)]


def _dbias_tols(dtype, rows):
    # fp32 column sums in a different order: error grows with the number of rows summed.
    t = dict(tols(dtype))
    t["rtol"] = max(t["rtol"], 1e-5)
    t["atol"] = max(t["atol"], 2e-6 * max(rows, 1))
    return t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("shape", DBIAS_SHAPES)
def test_dbias_dactivation(device, dtype, name, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "db"), scale=2.0)
    g = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "dbg"))
    dx, dbias = kernels.dbias_dactivation(g, x, name)
    want_dx, want_dbias = act.dbias_dactivation_reference(g.cpu(), x.cpu(), name)
    rows = math.prod(shape[:-1])
    assert dx.dtype == dtype and dbias.dtype == dtype and dbias.shape == (shape[-1],)
    _close(dx, want_dx.to(dtype), dtype)
    _close(dbias, want_dbias, dtype, **_dbias_tols(dtype, rows))
    # The autograd view of the same thing: d/dbias of sum(g * act(x + bias)) at bias = 0.
    xr = x.cpu().float().requires_grad_(True)
    act.activation_fp32_reference(xr, name).backward(g.cpu().float())
    _close(dbias, xr.grad.reshape(-1, shape[-1]).sum(0), dtype, **_dbias_tols(dtype, rows))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("shape", [(200, 136), (37, 23), (0, 16)])
def test_dbias_dactivation_fp8(device, fp8_dtype, name, shape):
    x = randn(shape, torch.bfloat16, device, seed=_seed(shape, name, "d8"), scale=2.0)
    g = randn(shape, torch.bfloat16, device, seed=_seed(shape, name, "d8g"))
    ref_dx, ref_dbias = act.dbias_dactivation_reference(g.cpu(), x.cpu(), name, torch.float32)
    scale = torch.tensor([_scale(ref_dx, fp8_dtype)], device=device)
    amax = torch.zeros(1, device=device)
    dx8, dbias, scale_inv = kernels.dbias_dactivation(g, x, name, dbias_dtype=torch.float32,
                                                  fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    want, want_si, want_amax = quantize_reference(ref_dx, scale.cpu(), fp8_dtype)
    _check_fp8(dx8, want, "relu" if name == "relu" else "inexact")
    assert torch.equal(scale_inv.cpu(), want_si)
    torch.testing.assert_close(amax.cpu(), want_amax, rtol=1e-5, atol=0)
    _close(dbias, ref_dbias, torch.float32, **_dbias_tols(torch.float32, shape[0]))


# ----- layout corner cases and errors -----------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gelu", "geglu"])
def test_misaligned_pointer(device, name):
    # A contiguous tensor starting one element into its storage defeats 16-byte accesses.
    base = randn((64 * 64 + 1,), torch.bfloat16, device, seed=9, scale=2.0)
    x = base[1:].view(64, 64)
    _close(kernels.activation_forward(x, name), act.activation_reference(x.cpu(), name), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_op_and_argument(device):
    x = randn((4, 6), torch.bfloat16, device, seed=1)
    with pytest.raises(ValueError, match="activation_forward.*activation"):
        kernels.activation_forward(x, "tanh")
    with pytest.raises(ValueError, match="even last dimension"):
        kernels.activation_forward(randn((4, 5), torch.bfloat16, device, seed=1), "swiglu")
    with pytest.raises(ValueError, match="grad"):
        kernels.activation_backward(randn((4, 4), torch.bfloat16, device, seed=2), x, "gelu")
    with pytest.raises(ValueError, match="grad.*dtype"):
        kernels.activation_backward(x.float(), x, "gelu")
    with pytest.raises(ValueError, match="dbias_dactivation.*activation"):
        kernels.dbias_dactivation(x, x, "geglu")
    with pytest.raises(ValueError, match="scale"):
        kernels.activation_forward(x, "gelu", fp8_dtype=device_fp8_dtype(torch.float8_e4m3fn, device))
    with pytest.raises(ValueError, match="x has dtype int32"):
        kernels.activation_forward(x.to(torch.int32), "relu")
