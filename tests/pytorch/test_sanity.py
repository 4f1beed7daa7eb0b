"""Sanity of every module of the public API: forward + backward run and give outputs and gradients
of the right shape, dtype and finiteness, over dtype x recipe x normalization x activation x bias x
skip_wgrad/skip_dgrad x microbatching x zero_centered_gamma x shapes (an odd one, zero tokens).
FP8 at dims that are not multiples of 16 must raise a clear error instead.

The product is bounded on CPU (reference backend, FP8 emulated) and fuller on the native GPU; see
module_cases.py. Numerical agreement with a reference model is test_numerics.py's job.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from module_cases import (  # noqa: E402
    DTYPES, GATED, GEMM_MODULES, SHAPES, Shape, autocast, fp8_refused, make_module, parametrize_cases)
from utils import DEVICES, randn, tols  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402

FP8_SHAPE_ERRORS = (ValueError, RuntimeError)


def _out_features(module, shape):
    return shape.ffn if module in ("Linear", "LayerNormLinear") else shape.hidden


def _call(m, module, x, first):
    if module in GEMM_MODULES and first is not None:
        return m(x, is_first_microbatch=first)
    return m(x)


def _check_finite(what, t):
    assert torch.isfinite(t.float()).all(), f"{what} has non-finite values"


@pytest.mark.parametrize("device,module,case", parametrize_cases())
def test_forward_backward(device, module, case):
    dtype = DTYPES[case["dtype"]]
    shape = SHAPES[case["shape"]]
    torch.manual_seed(1234)
    options = {k: case[k] for k in ("bias", "normalization", "activation", "zero_centered_gamma") if k in case}
    m = make_module(module, shape, dtype, device, **options)
    if case["skip"] == "wgrad":
        for p in m.parameters():
            p.requires_grad_(False)
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=7)
    x.requires_grad_(case["skip"] != "dgrad")

    if fp8_refused(module, case):
        with pytest.raises(FP8_SHAPE_ERRORS) as info:
            with autocast(case["recipe"]):
                _call(m, module, x, None)
        assert "16" in str(info.value), f"FP8 shape error does not say what was expected: {info.value}"
        return

    steps = [True, False, False] if case.get("microbatch") else [None]
    dy = randn((shape.batch, shape.seq, _out_features(module, shape)), dtype, device, seed=8)
    outs = []
    for first in steps:
        with autocast(case["recipe"]):
            out = _call(m, module, x, first)
        assert isinstance(out, torch.Tensor), f"{module} returned {type(out).__name__}, expected a tensor"
        assert tuple(out.shape) == tuple(dy.shape), f"output shape {tuple(out.shape)} != {tuple(dy.shape)}"
        assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
        assert out.device.type == device
        _check_finite("output", out)
        out.backward(dy)
        outs.append(out.detach())

    n = len(steps)
    if case["recipe"] != "delayed" and n > 1:
        # the weights did not change between microbatches: the cached FP8 weight gives the same output
        for later in outs[1:]:
            assert torch.equal(later, outs[0]), "is_first_microbatch=False changed the output"

    if case["skip"] == "dgrad":
        assert x.grad is None
    else:
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == dtype
        _check_finite("input grad", x.grad)
    for name, p in m.named_parameters():
        if case["skip"] == "wgrad":
            assert p.grad is None, f"{name} got a gradient although it does not require one"
            continue
        assert p.grad is not None, f"{name} has no gradient"
        assert p.grad.shape == p.shape, f"{name}.grad shape {tuple(p.grad.shape)} != {tuple(p.shape)}"
        _check_finite(f"{name}.grad", p.grad)
        if shape.tokens == 0:
            assert not p.grad.any(), f"{name}.grad is not zero for a batch without tokens"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_refuses_dims_not_multiple_of_16(device, module, recipe):
    """Only one dim is off each time (hidden 72, ffn 40, tokens 3*5): each must be refused."""
    for shape in (Shape("h", 2, 16, 72, 64), Shape("f", 2, 16, 64, 40), Shape("t", 3, 5, 64, 64)):
        m = make_module(module, shape, torch.bfloat16, device)
        x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=3)
        with pytest.raises(FP8_SHAPE_ERRORS, match="16"):
            with autocast(recipe):
                m(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", sorted(GATED))
def test_gated_mlp_weight_shape(device, activation):
    """Gated activations double FC1's output features (the gate half)."""
    shape = SHAPES["small"]
    m = make_module("LayerNormMLP", shape, torch.float32, device, activation=activation)
    assert tuple(m.fc1_weight.shape) == (2 * shape.ffn, shape.hidden)
    assert tuple(m.fc2_weight.shape) == (shape.hidden, shape.ffn)


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias_and_layernorm_output(device):
    shape = SHAPES["small"]
    dtype = torch.float32
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=5)

    lin = te.Linear(shape.hidden, shape.ffn, return_bias=True, params_dtype=dtype, device=device)
    out, bias = lin(x)
    assert bias is lin.bias or torch.equal(bias, lin.bias)
    plain = te.Linear(shape.hidden, shape.ffn, params_dtype=dtype, device=device)
    with torch.no_grad():
        plain.weight.copy_(lin.weight)
        plain.bias.copy_(lin.bias)
    torch.testing.assert_close(out + bias, plain(x), **tols(dtype))

    for cls, kwargs in ((te.LayerNormLinear, dict(in_features=shape.hidden, out_features=shape.ffn)),
                        (te.LayerNormMLP, dict(hidden_size=shape.hidden, ffn_hidden_size=shape.ffn))):
        m = cls(**kwargs, return_layernorm_output=True, params_dtype=dtype, device=device)
        out, ln_out = m(x)
        assert ln_out.shape == x.shape
        want = torch.nn.functional.layer_norm(x, (shape.hidden,), m.layer_norm_weight, m.layer_norm_bias, 1e-5)
        torch.testing.assert_close(ln_out, want, rtol=1e-5, atol=1e-5)
        (out.sum() + ln_out.sum()).backward()
        assert m.layer_norm_weight.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_raise_clearly(device):
    with pytest.raises(ValueError, match="activation"):
        te.LayerNormMLP(64, 96, activation="not_an_activation", device=device)
    with pytest.raises(ValueError, match="normalization"):
        te.LayerNormLinear(64, 96, normalization="BatchNorm", device=device)
    lin = te.Linear(64, 96, device=device)
    with pytest.raises((ValueError, RuntimeError), match="64"):
        lin(randn((4, 63), torch.float32, device))
