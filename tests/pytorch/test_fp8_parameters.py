"""Models built under quantized_model_init (FP8-only weights) against the same models with
high-precision weights under the same recipe: NVIDIA TE's GPT check (a TransformerLayer with
dropout, one training step, its tolerance) and, per module, the same bits in the first step.

Under DelayedScaling a module with high-precision weights casts them in its first step with the
scale its state starts from (1), so FP8-only weights are made with that scale; the module state
then records their amax, so both make the same scale update."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe
from utils import DEVICES, randn, stable_seed

RECIPES = {"delayed": te_recipe.DelayedScaling, "current": te_recipe.Float8CurrentScaling,
           "block": te_recipe.Float8BlockScaling}
# NVIDIA TE's test_gpt_fp8_parameters tolerance
GPT_TOLS = dict(rtol=0.125, atol=0.0675)


def _gpt_step(fp8_params, recipe, dtype, bs, device):
    """One forward and backward of a TransformerLayer built and run as NVIDIA TE's test does:
    the RNG reset first (same weights, same dropout masks in both builds)."""
    torch.manual_seed(1234)
    if device == "cuda":
        torch.cuda.manual_seed(1234)
    heads, head_dim, seq, layers, sigma = 4, 32, 32, 12, 0.023
    hidden = heads * head_dim
    with te.quantized_model_init(enabled=fp8_params, recipe=recipe):
        block = te.TransformerLayer(
            hidden, 4 * hidden, heads, layernorm_epsilon=1e-5,
            init_method=lambda w: torch.nn.init.normal_(w, 0.0, sigma),
            output_layer_init_method=lambda w: torch.nn.init.normal_(
                w, 0.0, sigma / math.sqrt(2.0 * layers)),
            hidden_dropout=0.1, attention_dropout=0.1, kv_channels=head_dim,
            apply_residual_connection_post_layernorm=False, output_layernorm=False,
            params_dtype=dtype, fuse_qkv_params=True, device=device)
    x = torch.randn((seq, bs, hidden), dtype=dtype, device=device, requires_grad=True)
    mask = torch.triu(torch.ones(seq, seq, device=device), diagonal=1).bool()
    with te.autocast(enabled=True, recipe=recipe):
        out = block(x, attention_mask=mask)
    out.sum().backward()
    names = ["output", "input grad"] + [n for n, p in block.named_parameters() if p.requires_grad]
    tensors = [out, x.grad] + [p.grad for p in block.parameters() if p.requires_grad]
    return names, tensors, block


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bs", [1, 2])
def test_gpt_fp8_parameters(device, recipe_name, dtype, bs):
    recipe = RECIPES[recipe_name]()
    names, ref, ref_block = _gpt_step(False, recipe, dtype, bs, device)
    _, got, block = _gpt_step(True, recipe, dtype, bs, device)
    assert any(isinstance(p, te.QuantizedTensor) for p in block.parameters())
    for name, r, g in zip(names, ref, got):
        assert g is not None, f"{name}: no gradient with FP8 parameters"
        torch.testing.assert_close(g, r, **GPT_TOLS, msg=f"{recipe_name}: {name} differs")
    if recipe_name == "delayed":
        # the weights' amax reached the module states: the same scales for the next step
        for (name, m), m_ref in zip(block.named_modules(), ref_block.modules()):
            if getattr(m, "_fp8_state", None) is None:
                continue
            hist, hist_ref = m._fp8_state.amax_history_fwd, m_ref._fp8_state.amax_history_fwd
            torch.testing.assert_close(hist[:, 1::2], hist_ref[:, 1::2], rtol=0, atol=0,
                                       msg=f"{name}: weight amax history")
            torch.testing.assert_close(m._fp8_state.scale_fwd[1::2],
                                       m_ref._fp8_state.scale_fwd[1::2], rtol=0, atol=0,
                                       msg=f"{name}: weight scales after the step")


def _module(name, dtype, device):
    if name == "Linear":
        return te.Linear(64, 96, params_dtype=dtype, device=device)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(64, 96, params_dtype=dtype, device=device)
    return te.LayerNormMLP(64, 96, params_dtype=dtype, device=device)


def _assert_same_step(pair, x, dy, recipe, who):
    """One step of each of the two modules (high-precision, FP8-only weights) on the same input
    and output gradient: output, input gradient and parameter gradients are the same bits."""
    results = []
    for m in pair:
        xi = x.clone().requires_grad_(True)
        with te.autocast(recipe=recipe):
            y = m(xi)
        y.backward(dy)
        results.append([y, xi.grad] + [p.grad for p in m.parameters()])
    for i, (r, g) in enumerate(zip(*results)):
        torch.testing.assert_close(g, r, rtol=0, atol=0, msg=f"{who}: tensor {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_delayed_scaling_first_step_same_bits(device, name, dtype):
    """The same initial values, FP8-only or high precision: under DelayedScaling the first step's
    output and gradients are the same bits."""
    recipe = te_recipe.DelayedScaling()
    mods = []
    for fp8_params in (False, True):
        torch.manual_seed(stable_seed(name))
        with te.quantized_model_init(enabled=fp8_params, recipe=recipe):
            mods.append(_module(name, dtype, device))
    x = randn((48, 64), dtype, device, seed=stable_seed(name, 1))
    dy = randn((48, 64 if name == "LayerNormMLP" else 96), dtype, device, seed=stable_seed(name, 2))
    _assert_same_step(mods, x, dy, recipe, name)


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_uses_the_module_scale_after_a_step(device):
    """After a step, quantize_ on an FP8-only weight made under DelayedScaling casts with the
    module's updated scale for it and records the new value's amax in the module's history."""
    recipe = te_recipe.DelayedScaling(amax_history_len=4)
    torch.manual_seed(11)
    with te.quantized_model_init(recipe=recipe):
        m = te.Linear(32, 48, device=device)
    w = m.weight
    assert torch.equal(w._scale_inv, torch.ones_like(w._scale_inv))  # the state's initial scale
    with te.autocast(recipe=recipe):
        m(randn((16, 32), torch.float32, device, seed=12)).sum().backward()
    rs = m._fp8_state
    scale = rs.scale_fwd[1].clone()
    assert scale.item() != 1.0  # the update saw the weight's amax
    new = randn((48, 32), torch.float32, device, seed=13, scale=0.05)
    w.quantize_(new)
    torch.testing.assert_close(w._scale_inv, torch.reciprocal(scale).reshape(w._scale_inv.shape),
                               rtol=0, atol=0)
    assert rs.amax_history_fwd[0, 1].item() >= new.abs().max().item()


@pytest.mark.parametrize("device", DEVICES)
def test_fusible_ops_linear_delayed_scaling_first_step_same_bits(device):
    """te.ops.Linear follows the same rule as the modules."""
    recipe = te_recipe.DelayedScaling()
    dtype = torch.bfloat16
    ops_list = []
    for fp8_params in (False, True):
        torch.manual_seed(21)
        with te.quantized_model_init(enabled=fp8_params, recipe=recipe):
            ops_list.append(te.ops.Linear(64, 48, device=device, dtype=dtype))
    assert isinstance(ops_list[1].weight, te.Float8Tensor)
    x = randn((32, 64), dtype, device, seed=22)
    dy = randn((32, 48), dtype, device, seed=23)
    _assert_same_step(ops_list, x, dy, recipe, "ops.Linear")
