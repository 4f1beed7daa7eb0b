"""backward_override of Float8CurrentScaling and Float8BlockScaling: the forward GEMM in FP8 as
without it, the backward GEMMs in the activation dtype with the output gradient unquantized, on
the forward's unquantized operands ('high_precision') or on its FP8 operands dequantized
('dequantized'). Checked against dgrad = dy @ W_b and wgrad = dy.T @ x_b computed here from the
operands and the recipe's quantizer reference."""
import dataclasses

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import fp8_formats, recipe
from transformer_engine.pytorch.kernels import blockwise as B
from utils import DEVICES, device_fp8_dtype, randn, tols

RECIPES = {"current": recipe.Float8CurrentScaling, "block": recipe.Float8BlockScaling}
MODES = ("high_precision", "dequantized")
IN, OUT, TOKENS = 128, 256, 64
DTYPE = torch.bfloat16


def _current_qdq(t, fp8):
    fmt, flavor = fp8_formats.format_of_dtype_name(str(fp8).replace("torch.", ""))
    scale = fp8_formats.fp8_max(fmt, flavor) / t.float().abs().amax()
    return ((t.float() * scale).to(fp8).float() / scale)


def _operand(t, kind, mode, block_dim):
    """The backward's view of a forward operand t, in the activation dtype (the reference GEMMs
    run in that dtype, as the module's do)."""
    return _operand_f32(t, kind, mode, block_dim).to(DTYPE)


def _operand_f32(t, kind, mode, block_dim):
    if mode == "high_precision":
        return t.float()
    fp8 = device_fp8_dtype(torch.float8_e4m3fn, t.device)
    if kind == "current":
        return _current_qdq(t, fp8)
    q, _ = B.quantize_blockwise_reference(t.contiguous(), fp8, block_dim, True, False)
    return B.dequantize_blockwise(q, torch.float32)


def _check(got, want, name):
    torch.testing.assert_close(got, want.to(got.dtype), **tols(DTYPE), msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(RECIPES))
@pytest.mark.parametrize("mode", MODES)
def test_linear(device, kind, mode):
    torch.manual_seed(0)
    m = te.Linear(IN, OUT, params_dtype=DTYPE, device=device)
    x = randn((TOKENS, IN), DTYPE, device, seed=1, scale=2.0).requires_grad_(True)
    dy = randn((TOKENS, OUT), DTYPE, device, seed=2)
    r = RECIPES[kind](backward_override=mode)
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy)
    # the forward is the recipe's own FP8 forward
    with te.autocast(recipe=RECIPES[kind]()):
        y_fp8 = m(x)
    torch.testing.assert_close(y, y_fp8, **tols(DTYPE))
    w_b = _operand(m.weight.detach(), kind, mode, 2)
    x_b = _operand(x.detach(), kind, mode, 1)
    _check(x.grad, dy @ w_b, "dgrad")
    _check(m.weight.grad, dy.t() @ x_b, "wgrad")
    _check(m.bias.grad, dy.float().sum(0), "bias grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(RECIPES))
@pytest.mark.parametrize("mode", MODES)
def test_layernorm_linear(device, kind, mode):
    torch.manual_seed(0)
    m = te.LayerNormLinear(IN, OUT, params_dtype=DTYPE, device=device)
    with torch.no_grad():
        m.layer_norm_weight.copy_(randn((IN,), DTYPE, device, seed=3, scale=0.5) + 1)
    x = randn((TOKENS, IN), DTYPE, device, seed=1, scale=2.0).requires_grad_(True)
    dy = randn((TOKENS, OUT), DTYPE, device, seed=2)
    with te.autocast(recipe=RECIPES[kind](backward_override=mode)):
        y = m(x)
    y.backward(dy)
    # the reference: the norm in float32 with autograd, the GEMM operands as the mode says
    xr = x.detach().float().requires_grad_(True)
    gamma = m.layer_norm_weight.detach().float().requires_grad_(True)
    ln = torch.nn.functional.layer_norm(xr, (IN,), gamma, m.layer_norm_bias.detach().float(), m.eps)
    w_b = _operand(m.weight.detach(), kind, mode, 2)
    ln_b = _operand(ln.detach().to(DTYPE), kind, mode, 1)
    ln.backward((dy @ w_b).float())
    _check(m.weight.grad, dy.t() @ ln_b, "wgrad")
    _check(x.grad, xr.grad, "dgrad")
    _check(m.layer_norm_weight.grad, gamma.grad, "gamma grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(RECIPES))
@pytest.mark.parametrize("mode", MODES)
def test_grouped_linear(device, kind, mode):
    torch.manual_seed(0)
    splits = [32, 0, 16, 48]
    m = te.GroupedLinear(len(splits), IN, OUT, params_dtype=DTYPE, device=device)
    x = randn((sum(splits), IN), DTYPE, device, seed=1, scale=2.0).requires_grad_(True)
    dy = randn((sum(splits), OUT), DTYPE, device, seed=2)
    with te.autocast(recipe=RECIPES[kind](backward_override=mode)):
        y = m(x, splits)
    y.backward(dy)
    dx_want = []
    for i, (xi, dyi) in enumerate(zip(x.detach().split(splits), dy.split(splits))):
        w = getattr(m, f"weight{i}")
        w_b = _operand(w.detach(), kind, mode, 2)
        dx_want.append(dyi @ w_b)
        if xi.shape[0]:
            _check(w.grad, dyi.t() @ _operand(xi, kind, mode, 1), f"wgrad {i}")
        else:
            assert not w.grad.any(), f"weight{i} got a gradient from no tokens"
    _check(x.grad, torch.cat(dx_want), "dgrad")


def test_refusals():
    with pytest.raises(ValueError, match="DelayedScaling: backward_override='high_precision'"):
        recipe.DelayedScaling(backward_override="high_precision")
    with pytest.raises(ValueError, match="backward_override='fp8'"):
        recipe.Float8CurrentScaling(backward_override="fp8")


def test_env_default(monkeypatch):
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "dequantized")
    assert recipe.Float8CurrentScaling().backward_override == "dequantized"
    assert recipe.Float8BlockScaling().backward_override == "dequantized"
    assert recipe.DelayedScaling().backward_override is None
    r = dataclasses.replace(recipe.Float8CurrentScaling(), backward_override=None)
    assert r.backward_override is None
