"""LayerNormMLP options: checkpoint=True (the backward recomputes the forward) gives the same
results as without it, activation_params reach clamped_swiglu, bad options are clear errors."""
import pytest
import torch

import transformer_engine.pytorch as te
from module_cases import autocast
from utils import DEVICES, randn


def _pair(device, dtype, **kw):
    torch.manual_seed(3)
    a = te.LayerNormMLP(32, 64, params_dtype=dtype, device=device, **kw)
    b = te.LayerNormMLP(32, 64, params_dtype=dtype, device=device, checkpoint=True, **kw)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu", "glu", "clamped_swiglu"])
def test_checkpoint_matches_plain(device, recipe, activation):
    dtype = torch.bfloat16
    plain, ckpt = _pair(device, dtype, activation=activation)
    for step in range(2):  # the second step runs on scales the first one updated
        x = randn((48, 32), dtype, device, seed=step, scale=2.0)
        g = randn((48, 32), dtype, device, seed=step + 9)
        outs = []
        for m in (plain, ckpt):
            xi = x.clone().requires_grad_(True)
            with autocast(recipe):
                y = m(xi)
            y.backward(g)
            outs.append((y.detach(), xi.grad))
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0, atol=0)
        for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed"])
def test_checkpoint_input_without_grad(device, recipe):
    """An input that does not require grad (a first layer, or dgrad skipped): the recompute still
    runs and the parameter gradients equal those without checkpointing."""
    plain, ckpt = _pair(device, torch.bfloat16)
    x = randn((48, 32), torch.bfloat16, device, seed=5, scale=2.0)
    g = randn((48, 32), torch.bfloat16, device, seed=6)
    for m in (plain, ckpt):
        with autocast(recipe):
            y = m(x)
        assert y.requires_grad
        y.backward(g)
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert p.grad is not None, n
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=n)


@pytest.mark.parametrize("device", DEVICES)
def test_clamped_swiglu_params_reach_the_kernel(device):
    torch.manual_seed(0)
    tight = te.LayerNormMLP(32, 64, activation="clamped_swiglu",
                            activation_params={"limit": 0.25, "alpha": 1.0}, device=device)
    loose = te.LayerNormMLP(32, 64, activation="clamped_swiglu", device=device)
    loose.load_state_dict(tight.state_dict())
    assert tight.fc1_weight.shape == (128, 32)
    x = randn((16, 32), torch.float32, device, scale=3.0)
    assert not torch.allclose(tight(x), loose(x))


def test_bad_options():
    with pytest.raises(ValueError, match="LayerNormMLP: activation_params has \\['beta'\\]"):
        te.LayerNormMLP(32, 64, activation="clamped_swiglu", activation_params={"beta": 2.0},
                        device="cpu")
    with pytest.raises(ValueError, match="only activation='clamped_swiglu' takes parameters"):
        te.LayerNormMLP(32, 64, activation="gelu", activation_params={"limit": 2.0}, device="cpu")
    with pytest.raises(ValueError, match="LayerNormMLP: activation_params limit=-1.0"):
        te.LayerNormMLP(32, 64, activation="clamped_swiglu", activation_params={"limit": -1.0},
                        device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
@pytest.mark.parametrize("trainable", ["fc1_bias", "fc2_bias", "both_biases", "layer_norm_bias"])
def test_partly_frozen_backward_matches_full(device, recipe, trainable):
    """Only some parameters train (the weights and the input frozen): the backward runs without
    the gradients nobody asked for and gives the trainable ones what the full backward gives
    them (FC1's bias gradient still needs FC2's dgrad; the norm's bias, the whole chain)."""
    dtype = torch.bfloat16
    names = {"fc1_bias": ["fc1_bias"], "fc2_bias": ["fc2_bias"],
             "both_biases": ["fc1_bias", "fc2_bias"], "layer_norm_bias": ["layer_norm_bias"]}[trainable]
    torch.manual_seed(3)
    full = te.LayerNormMLP(32, 64, params_dtype=dtype, device=device)
    part = te.LayerNormMLP(32, 64, params_dtype=dtype, device=device)
    part.load_state_dict(full.state_dict())
    with torch.no_grad():
        for m in (full, part):  # non-zero biases, so that each shapes the result
            for n in ("fc1_bias", "fc2_bias", "layer_norm_bias"):
                getattr(m, n).copy_(randn(getattr(m, n).shape, dtype, device, seed=len(n)))
    for n, p in part.named_parameters():
        p.requires_grad_(n in names)
    x = randn((48, 32), dtype, device, seed=5, scale=2.0)
    g = randn((48, 32), dtype, device, seed=6)
    for step, m in enumerate((full, part)):
        with autocast(recipe):
            y = m(x.clone().requires_grad_(m is full))
        y.backward(g)
    for n in names:
        got, want = getattr(part, n).grad, getattr(full, n).grad
        assert got is not None, n
        # the same kernels up to how the bias gradient is summed (with or without the cast's
        # transpose): within the dtype's rounding
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2, msg=n)
    for n, p in part.named_parameters():
        if n not in names:
            assert p.grad is None, n
