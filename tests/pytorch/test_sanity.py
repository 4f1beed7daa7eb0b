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
        with pytest.raises(ValueError) as info:
            with autocast(case["recipe"]):
                _call(m, module, x, None)
        msg = str(info.value)
        assert "16" in msg and module in msg, f"FP8 shape error does not name the module and the rule: {msg}"
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
        if len(outs) == 1:
            first_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    n = len(steps)
    if case["recipe"] != "delayed" and n > 1:
        # the weights did not change between microbatches: the cached FP8 weight gives the same output
        for later in outs[1:]:
            assert torch.equal(later, outs[0]), "is_first_microbatch=False changed the output"
        # and the same gradients, accumulated
        for name, g in first_grads.items():
            torch.testing.assert_close(m.get_parameter(name).grad, n * g, **tols(dtype),
                                       msg=lambda s: f"{name}.grad after {n} microbatches: {s}")

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
        with pytest.raises(ValueError, match=f"{module}.*16"):
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


# ---------------------------------------------------------------------------------------------
# Constructor and forward arguments of the reference API
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", ["none", "current"])
def test_linear_weight_passed_to_forward(device, recipe_name):
    """skip_weight_param_allocation: no parameters; weight and bias come with each call."""
    lin = te.Linear(64, 48, skip_weight_param_allocation=True, params_dtype=torch.float32, device=device)
    assert not list(lin.parameters())
    w = randn((48, 64), torch.float32, device, seed=1, scale=0.1).requires_grad_()
    b = randn((48,), torch.float32, device, seed=2).requires_grad_()
    x = randn((32, 64), torch.float32, device, seed=3)
    with autocast(recipe_name):
        out = lin(x, weight=w, bias=b)
    want = torch.nn.functional.linear(x, w, b)
    if recipe_name == "none":
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    else:
        assert ((out - want).norm() / want.norm()).item() < tols("float8_e4m3")["rtol"]
    out.sum().backward()
    assert w.grad is not None and b.grad is not None
    with pytest.raises(ValueError, match="weight"):
        lin(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [("query", "key", "value"), {"q": 32, "kv": 16}], ids=["tuple", "dict"])
def test_linear_parameters_split(device, split):
    lin = te.Linear(64, 48, parameters_split=split, params_dtype=torch.float32, device=device)
    names = list(split)
    sizes = list(split.values()) if isinstance(split, dict) else [48 // len(split)] * len(split)
    params = dict(lin.named_parameters())
    for n, rows in zip(names, sizes):
        assert tuple(params[f"{n}_weight"].shape) == (rows, 64)
        assert tuple(params[f"{n}_bias"].shape) == (rows,)
    x = randn((8, 64), torch.float32, device, seed=4)
    w = torch.cat([params[f"{n}_weight"] for n in names])
    b = torch.cat([params[f"{n}_bias"] for n in names])
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    lin(x).square().sum().backward()
    assert all(params[f"{n}_weight"].grad is not None for n in names)
    with pytest.raises(ValueError, match="parameters_split"):
        te.Linear(64, 48, parameters_split={"q": 32, "kv": 8}, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
def test_meta_device_deferred_init(device, module):
    shape = SHAPES["small"]
    m = make_module(module, shape, torch.float32, "meta")
    assert all(p.device.type == "meta" for p in m.parameters())
    m = m.to_empty(device=device)
    m.reset_parameters()
    for n, p in m.named_parameters():
        assert p.device.type == device and torch.isfinite(p).all(), n
        if n.endswith("weight") and not n.startswith("layer_norm"):
            assert p.std() > 0, f"{n} was not initialised"
    x = randn((shape.batch, shape.seq, shape.hidden), torch.float32, device, seed=6)
    assert torch.isfinite(m(x)).all()


@pytest.mark.parametrize("device", DEVICES)
def test_init_methods_are_used(device):
    lin = te.Linear(32, 16, init_method=lambda w: torch.nn.init.constant_(w, 0.25), device=device)
    assert torch.all(lin.weight == 0.25)
    mlp = te.LayerNormMLP(32, 16, init_method=lambda w: torch.nn.init.constant_(w, 0.5),
                          output_layer_init_method=lambda w: torch.nn.init.constant_(w, -0.5), device=device)
    assert torch.all(mlp.fc1_weight == 0.5) and torch.all(mlp.fc2_weight == -0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_mlp_return_bias(device):
    shape = SHAPES["small"]
    m = te.LayerNormMLP(shape.hidden, shape.ffn, return_bias=True, params_dtype=torch.float32, device=device)
    with torch.no_grad():
        m.fc2_bias.copy_(randn(m.fc2_bias.shape, torch.float32, device, seed=8))
    plain = te.LayerNormMLP(shape.hidden, shape.ffn, params_dtype=torch.float32, device=device)
    plain.load_state_dict(m.state_dict())
    x = randn((shape.batch, shape.seq, shape.hidden), torch.float32, device, seed=9)
    out, bias = m(x)
    torch.testing.assert_close(bias, m.fc2_bias)
    torch.testing.assert_close(out + bias, plain(x), **tols(torch.float32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", ["Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("recipe_name", ["none", "current"])
def test_non_contiguous_input(device, module, recipe_name):
    """A [seq, batch, hidden] view of a [batch, seq, hidden] tensor gives the same rows."""
    shape = SHAPES["small"]
    m = make_module(module, shape, torch.float32, device)
    x = randn((shape.batch, shape.seq, shape.hidden), torch.float32, device, seed=10)
    xt = x.transpose(0, 1)
    assert not xt.is_contiguous()
    with torch.no_grad(), autocast(recipe_name):
        want = m(xt.contiguous())
        got = m(xt)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
def test_torch_autocast_sets_compute_dtype(device, module):
    """Under torch.autocast the modules compute in the autocast dtype (fp32 parameters)."""
    shape = SHAPES["small"]
    m = make_module(module, shape, torch.float32, device)
    x = randn((shape.batch, shape.seq, shape.hidden), torch.float32, device, seed=11).requires_grad_()
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out = m(x)
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        want = make_module(module, shape, torch.bfloat16, device)
        want.load_state_dict({k: v.to(torch.bfloat16) if v.is_floating_point() else v
                              for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}, strict=False)
        want_out = want(x.to(torch.bfloat16))
    torch.testing.assert_close(out.float(), want_out.float(), rtol=tols(torch.bfloat16)["rtol"],
                               atol=2 * tols(torch.bfloat16)["rtol"] * want_out.abs().max().item())
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_new_and_old_names_agree(device):
    """autocast(recipe=...) is fp8_autocast(fp8_recipe=...); quantized_model_init is fp8_model_init."""
    from transformer_engine.common import recipe
    shape = SHAPES["small"]
    torch.manual_seed(3)
    m = make_module("LayerNormMLP", shape, torch.bfloat16, device)
    twin = make_module("LayerNormMLP", shape, torch.bfloat16, device)
    twin.load_state_dict(m.state_dict())
    x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=12)
    for r in (recipe.DelayedScaling(), recipe.Float8CurrentScaling()):
        for _ in range(2):
            with torch.no_grad(), te.autocast(enabled=True, recipe=r):
                new = m(x)
            with torch.no_grad(), te.fp8_autocast(enabled=True, fp8_recipe=r):
                old = twin(x)
            assert torch.equal(new, old)
    with te.quantized_model_init(enabled=True, recipe=recipe.Float8CurrentScaling()):
        q = te.Linear(shape.hidden, shape.ffn, params_dtype=torch.bfloat16, device=device)
    assert isinstance(q.weight, te.Float8Tensor)
