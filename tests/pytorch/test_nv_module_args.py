"""Module and recipe arguments as NVIDIA TE 2.x has them: unknown keywords are errors, options
that are not implemented are refused when set, recipe fields (current, legacy, misspelt),
normalized_shape, NV's parameter registration order, drop_path_rate up to 1, outputs in the
torch.autocast dtype, FP8-only weights with their high-precision initial values, attributes of
quantized weights through module.apply / .to, fp8_meta."""
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from utils import DEVICES, randn

BUILDERS = {
    "Linear": lambda **kw: te.Linear(32, 32, device="cpu", **kw),
    "LayerNormLinear": lambda **kw: te.LayerNormLinear(32, 32, device="cpu", **kw),
    "LayerNormMLP": lambda **kw: te.LayerNormMLP(32, 64, device="cpu", **kw),
    "LayerNorm": lambda **kw: te.LayerNorm(32, device="cpu", **kw),
    "RMSNorm": lambda **kw: te.RMSNorm(32, device="cpu", **kw),
    "DotProductAttention": lambda **kw: te.DotProductAttention(4, 8, **kw),
    "MultiheadAttention": lambda **kw: te.MultiheadAttention(32, 4, device="cpu", **kw),
    "TransformerLayer": lambda **kw: te.TransformerLayer(32, 64, 4, device="cpu", **kw),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_unknown_keyword_is_a_type_error_naming_it(name):
    with pytest.raises(TypeError, match="activaton"):
        BUILDERS[name](activaton="relu")


@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP", "MultiheadAttention",
                                  "TransformerLayer"])
def test_userbuffers_flags_accepted_off_refused_on(name):
    BUILDERS[name](ub_overlap_ag=False, ub_bulk_wgrad=False)
    with pytest.raises(NotImplementedError, match=f"{name}: ub_overlap_ag=True: comm-GEMM overlap"):
        BUILDERS[name](ub_overlap_ag=True)


def test_refused_options_name_module_and_argument():
    with pytest.raises(NotImplementedError, match="Linear: symmetric_ar_type='multimem_all_reduce'"):
        te.Linear(32, 32, device="cpu", symmetric_ar_type="multimem_all_reduce")
    with pytest.raises(NotImplementedError, match="DotProductAttention: return_max_logit=True"):
        te.DotProductAttention(4, 8, return_max_logit=True)
    with pytest.raises(NotImplementedError, match="qk_norm_type='RMSNorm'"):
        te.MultiheadAttention(32, 4, device="cpu", qk_norm_type="RMSNorm")


@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm])
def test_norm_normalized_shape_and_deprecated_hidden_size(cls):
    a = cls(24, device="cpu")
    b = cls(normalized_shape=(24,), device="cpu", dtype=torch.bfloat16)
    assert a.weight.shape == b.weight.shape == (24,) and b.weight.dtype == torch.bfloat16
    with pytest.warns(DeprecationWarning, match="hidden_size is deprecated"):
        c = cls(hidden_size=24, device="cpu")
    assert c.weight.shape == (24,)
    with pytest.raises(TypeError, match="not both"):
        cls(24, hidden_size=24, device="cpu")
    with pytest.raises(NotImplementedError, match=r"normalized_shape=\(4, 6\)"):
        cls((4, 6), device="cpu")
    with pytest.raises(NotImplementedError, match="sm_margin"):
        cls(24, device="cpu", sm_margin=8)
    x = randn((5, 24), torch.float32, "cpu", seed=3)
    torch.testing.assert_close(a(x), c(x), rtol=0, atol=0)


def test_recipe_fields_current_legacy_and_misspelt():
    r = recipe.DelayedScaling(fp8_dpa=False, fp8_mha=False, reduce_amax=False, backward_override=None)
    assert r.reduce_amax is False
    with pytest.warns(DeprecationWarning, match="'override_linear_precision' is ignored"):
        recipe.DelayedScaling(override_linear_precision=(False, False, True))
    with pytest.warns(DeprecationWarning, match="'interval' is ignored"):
        recipe.DelayedScaling(interval=4)
    with pytest.warns(DeprecationWarning, match="'params_dtype' is ignored"):
        recipe.DelayedScaling(params_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="'amax_histroy_len'; did you mean 'amax_history_len'"):
        recipe.DelayedScaling(amax_histroy_len=16)
    with pytest.raises(TypeError, match="'use_power2_scales'; did you mean 'use_power_2_scales'"):
        recipe.Float8CurrentScaling(use_power2_scales=True)
    for field in ("fp8_dpa", "fp8_mha"):
        with pytest.raises(NotImplementedError, match=f"DelayedScaling: {field}=True"):
            recipe.DelayedScaling(**{field: True})
    assert recipe.Float8CurrentScaling(backward_override="high_precision").backward_override == "high_precision"
    with pytest.raises(ValueError, match="DelayedScaling: backward_override='dequantized'"):
        recipe.DelayedScaling(backward_override="dequantized")
    with pytest.raises(ValueError, match="backward_override='fast'"):
        recipe.Float8CurrentScaling(backward_override="fast")
    with pytest.raises(NotImplementedError, match="fp8_gemm_fprop"):
        recipe.Float8CurrentScaling(fp8_gemm_fprop=recipe.MMParams(use_split_accumulator=True))


def test_recipe_field_set_after_construction_is_checked_at_autocast():
    r = recipe.Float8CurrentScaling()
    r.backward_override = "fast"
    with pytest.raises(ValueError, match="backward_override='fast'"):
        with te.autocast(recipe=r):
            pass


@pytest.mark.parametrize("cls", [recipe.MXFP8BlockScaling, recipe.NVFP4BlockScaling])
def test_block_scaled_recipes_exist_and_are_refused_when_used(cls):
    r = cls()
    assert r.mxfp8() == (cls is recipe.MXFP8BlockScaling)
    assert r.float8_block_scaling() == (cls is recipe.Float8BlockScaling)
    assert r.nvfp4() == (cls is recipe.NVFP4BlockScaling)
    for ctx in (lambda: te.autocast(recipe=r), lambda: te.quantized_model_init(recipe=r)):
        with pytest.raises(NotImplementedError, match=f"{cls.__name__} needs"):
            with ctx():
                pass
    # the refusal left no state behind: modules built now are plain
    assert not isinstance(te.Linear(16, 16, device="cpu").weight, te.QuantizedTensor)


def test_block_scaling_recipe_is_accepted_by_autocast_and_quantized_model_init():
    r = recipe.Float8BlockScaling()
    assert r.float8_block_scaling() and not r.mxfp8() and not r.nvfp4()
    with te.autocast(recipe=r):
        pass
    with te.quantized_model_init(recipe=r):
        assert isinstance(te.Linear(128, 128, device="cpu").weight, te.Float8BlockwiseQTensor)
    assert not isinstance(te.Linear(16, 16, device="cpu").weight, te.QuantizedTensor)


def _names(m):
    return [n for n, _ in m.named_parameters()]


def test_parameter_registration_order_matches_nv():
    assert _names(te.Linear(16, 32, device="cpu", parameters_split=("a", "b"))) == [
        "a_weight", "b_weight", "a_bias", "b_bias"]
    assert _names(te.LayerNormMLP(16, 32, device="cpu")) == [
        "layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
    mha = te.MultiheadAttention(16, 2, device="cpu", input_layernorm=True)
    assert list(mha.state_dict()) == [
        "layernorm_qkv.layer_norm_weight", "layernorm_qkv.layer_norm_bias",
        "layernorm_qkv.query_weight", "layernorm_qkv.key_weight", "layernorm_qkv.value_weight",
        "layernorm_qkv.query_bias", "layernorm_qkv.key_bias", "layernorm_qkv.value_bias",
        "layernorm_qkv._extra_state", "core_attention._extra_state", "proj.weight", "proj.bias",
        "proj._extra_state"]
    cross = te.MultiheadAttention(16, 2, device="cpu", attention_type="cross", input_layernorm=True)
    assert "layernorm_query.query_weight" in cross.state_dict()
    # a state_dict saved without core_attention._extra_state still loads strictly
    sd = {k: v for k, v in mha.state_dict().items() if k != "core_attention._extra_state"}
    mha.load_state_dict(sd, strict=True)


def test_drop_path_rate_full_range():
    with pytest.raises(ValueError, match=r"drop_path_rate is 1.5; expected \[0, 1\]"):
        te.TransformerLayer(32, 64, 4, device="cpu", drop_path_rate=1.5)
    torch.manual_seed(0)
    layer = te.TransformerLayer(32, 64, 4, device="cpu", drop_path_rate=1.0, hidden_dropout=0.0,
                                attention_dropout=0.0)
    x = randn((6, 3, 32), torch.float32, "cpu", seed=2).requires_grad_()
    y = layer(x)
    # both branches dropped: the layer is the identity on its input, in training
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    layer.eval()
    assert not torch.equal(layer(x), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm",
                                  "MultiheadAttention", "TransformerLayer"])
def test_outputs_in_autocast_dtype(device, name):
    torch.manual_seed(0)
    m = BUILDERS[name]().to(device)
    x = randn((8, 2, 32), torch.float32, device, seed=4)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = m(x)
    y = y[0] if isinstance(y, tuple) else y
    assert y.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_weights_keep_high_precision_init_val_and_attributes(device):
    torch.manual_seed(0)
    with te.quantized_model_init(preserve_high_precision_init_val=True):
        m = te.LayerNormMLP(32, 64, device=device)
    w = m.fc1_weight
    assert isinstance(w, te.QuantizedTensor) and isinstance(w, torch.nn.Parameter)
    hp = w.get_high_precision_init_val()
    assert hp.device.type == "cpu" and hp.shape == w.shape
    # the FP8 weight is its quantizer's cast of that value, bit for bit (the default recipe,
    # DelayedScaling: the scale a module's delayed-scaling state starts from)
    again = w._get_quantizer().make_empty(shape=w.shape, dtype=w.dtype, device=w.device)
    w._get_quantizer().update_quantized(hp.to(w.device), again)
    assert torch.equal(again.dequantize(dtype=w.dtype), w.dequantize())
    w.custom_tag = "kept"
    m.apply(lambda mod: None)
    m.to(device)
    m.to(torch.bfloat16)
    w2 = m.fc1_weight
    assert isinstance(w2, te.Float8Tensor) and w2.dtype == torch.bfloat16
    assert w2.custom_tag == "kept" and w2.get_high_precision_init_val() is not None
    w2.clear_high_precision_init_val()
    assert w2.get_high_precision_init_val() is None
    with te.quantized_model_init():
        plain = te.Linear(16, 16, device=device)
    assert plain.weight.get_high_precision_init_val() is None


def test_fp8_meta_reports_module_state():
    m = te.Linear(32, 32, device="cpu")
    assert m.fp8_meta["fp8_checkpoint"] is False and "scaling_fwd" not in m.fp8_meta
    r = recipe.DelayedScaling(amax_history_len=3)
    with te.fp8_autocast(fp8_recipe=r):
        m(randn((16, 32), torch.float32, "cpu", seed=1)).sum().backward()
    meta = m.fp8_meta
    assert meta["recipe"] is r and meta["fp8_checkpoint"]
    assert meta["scaling_fwd"].amax_history.shape == (3, 2)
    assert bool((meta["scaling_fwd"].amax_history > 0).any())
    assert torch.equal(meta["scaling_fwd"].scale, m._fp8_state.scale_fwd)


def test_grouped_linear_single_parameter_options_refused_on():
    te.GroupedLinear(2, 32, 32, device="cpu", single_grouped_weight=False, single_grouped_bias=False,
                     use_grouped_tensor=False)
    for kw in ({"single_grouped_weight": True}, {"single_grouped_bias": True},
               {"use_grouped_tensor": True}, {"ub_overlap_rs": True}):
        with pytest.raises(NotImplementedError, match=f"GroupedLinear: {next(iter(kw))}=True"):
            te.GroupedLinear(2, 32, 32, device="cpu", **kw)
