"""Clamped SwiGLU (kernels.clamped_swiglu_*): native kernels against the plain-torch reference
(computed on the CPU), the reference against a float64 model, FP8 outputs within one FP8 ulp of
the reference quantization, argument errors. limit 0.75 with inputs of scale 2 puts many values
past both clamps."""
import numpy as np
import pytest
import torch

from transformer_engine.pytorch.kernels import activation as act
from transformer_engine.pytorch.kernels.cast import quantize_reference
from test_activation import FP8, HP, _check_fp8, _close, _scale
from utils import DEVICES, randn, stable_seed

SHAPES = [(37, 46), (128, 256), (3, 5, 48), (1, 2), (0, 64), (1024, 4096)]
PARAMS = [(0.75, 1.702), (7.0, 1.702), (2.0, -0.5)]


def _model(x, limit, alpha):
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1] // 2
    a, b = np.minimum(x[..., :n], limit), np.clip(x[..., n:], -limit, limit)
    return a / (1 + np.exp(-alpha * a)) * (b + 1)


@pytest.mark.parametrize("limit,alpha", PARAMS)
def test_reference_matches_float64_model(limit, alpha):
    x = randn((64, 96), torch.float32, "cpu", seed=stable_seed(limit, alpha), scale=2.0)
    got = act.clamped_swiglu_fp32_reference(x, limit, alpha).double().numpy()
    np.testing.assert_allclose(got, _model(x.numpy(), limit, alpha), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("limit,alpha", PARAMS)
def test_forward_backward(device, dtype, shape, limit, alpha):
    x = randn(shape, dtype, device, seed=stable_seed(shape, dtype, limit), scale=2.0)
    y = act.clamped_swiglu_forward(x, limit, alpha)
    want = act.clamped_swiglu_fp32_reference(x.cpu(), limit, alpha).to(dtype)
    assert y.dtype == dtype and y.shape == want.shape
    _close(y, want, dtype)
    g = randn(want.shape, dtype, device, seed=stable_seed(shape, dtype, limit, "g"))
    dx = act.clamped_swiglu_backward(g, x, limit, alpha)
    xr = x.cpu().float().requires_grad_(True)
    act.clamped_swiglu_fp32_reference(xr, limit, alpha).backward(g.cpu().float())
    assert dx.dtype == dtype and dx.shape == x.shape
    _close(dx, xr.grad.to(dtype), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("shape", [(37, 46), (256, 512), (0, 32)])
def test_fp8_outputs(device, fp8_dtype, shape):
    limit, alpha = 0.75, 1.702
    x = randn(shape, torch.bfloat16, device, seed=stable_seed(shape, "f8"), scale=2.0)
    ref32 = act.clamped_swiglu_fp32_reference(x.cpu(), limit, alpha)
    scale = torch.tensor([_scale(ref32, fp8_dtype)], device=device)
    amax = torch.zeros(1, device=device)
    y8, si = act.clamped_swiglu_forward(x, limit, alpha, fp8_dtype, scale, amax)
    want, want_si, want_amax = quantize_reference(ref32, scale.cpu(), fp8_dtype)
    _check_fp8(y8, want, "clamped_swiglu")
    assert torch.equal(si.cpu(), want_si)
    torch.testing.assert_close(amax.cpu(), want_amax, rtol=1e-5, atol=0)
    g = randn(ref32.shape, torch.bfloat16, device, seed=stable_seed(shape, "f8g"))
    xr = x.cpu().float().requires_grad_(True)
    act.clamped_swiglu_fp32_reference(xr, limit, alpha).backward(g.cpu().float())
    dscale = torch.tensor([_scale(xr.grad, fp8_dtype)], device=device)
    dx8, _ = act.clamped_swiglu_backward(g, x, limit, alpha, fp8_dtype, dscale, None)
    _check_fp8(dx8, quantize_reference(xr.grad, dscale.cpu(), fp8_dtype)[0], "clamped_swiglu")


@pytest.mark.parametrize("device", DEVICES)
def test_apply_autograd(device):
    x = randn((33, 64), torch.bfloat16, device, seed=5, scale=2.0).requires_grad_(True)
    y = act.apply_clamped_swiglu(x, 0.75, 1.702)
    g = randn(y.shape, torch.bfloat16, device, seed=6)
    y.backward(g)
    xr = x.detach().cpu().float().requires_grad_(True)
    yr = act.clamped_swiglu_fp32_reference(xr, 0.75, 1.702)
    yr.backward(g.cpu().float())
    _close(y.detach(), yr.detach().bfloat16(), torch.bfloat16)
    _close(x.grad, xr.grad.bfloat16(), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x = randn((4, 6), torch.float32, device)
    with pytest.raises(ValueError, match="clamped_swiglu_forward: activation_params limit=0.0"):
        act.clamped_swiglu_forward(x, 0.0, 1.0)
    with pytest.raises(ValueError, match="clamped_swiglu_forward: x has shape \\(4, 5\\)"):
        act.clamped_swiglu_forward(randn((4, 5), torch.float32, device))
    with pytest.raises(ValueError, match="clamped_swiglu_backward: grad has shape"):
        act.clamped_swiglu_backward(randn((4, 6), torch.float32, device), x)
    with pytest.raises(ValueError, match="activation_params has \\['beta'\\]"):
        act.clamped_swiglu_params("LayerNormMLP", {"beta": 1.0})
