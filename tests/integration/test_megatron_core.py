"""Megatron-Core on this library, without a GPU: `import megatron.core` and its Transformer Engine
extension import, Megatron reads this library's version and takes the TE 2.x paths, builds the
GPT layer spec with TE layers and this library's recipe through its own wrapper.

megatron-core ships a CPython 3.12 wheel only; where it is not importable the tests skip."""
import importlib.util
import warnings

import pytest

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed", allow_module_level=True)
if importlib.util.find_spec("triton") is None:
    pytest.skip("megatron-core imports triton, which is not installed", allow_module_level=True)

import transformer_engine  # noqa: E402


def _import_megatron():
    # a plain import: an ImportError raised because this library lacks a name must fail the test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Megatron warns about optional packages it falls back from
        import megatron.core  # noqa: F401
        from megatron.core.extensions import transformer_engine as ext
    return ext


def test_import_megatron_core_with_te_extensions():
    ext = _import_megatron()
    assert ext.HAVE_TE
    import transformer_engine.pytorch as te
    assert issubclass(ext.TELinear, te.Linear)
    assert issubclass(ext.TELayerNormColumnParallelLinear, te.LayerNormLinear)
    assert issubclass(ext.TEDotProductAttention, te.DotProductAttention)


def test_megatron_reads_this_version():
    _import_megatron()
    from megatron.core.utils import get_te_version, is_te_min_version
    assert str(get_te_version()) == transformer_engine.__version__
    assert is_te_min_version("2.3.0") and not is_te_min_version("2.6.0dev0")


def test_gpt_layer_spec_uses_te_layers():
    ext = _import_megatron()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    spec = get_gpt_layer_with_transformer_engine_spec()
    attn = spec.submodules.self_attention.submodules
    assert attn.linear_qkv is ext.TELayerNormColumnParallelLinear
    assert attn.core_attention is ext.TEDotProductAttention
    assert attn.linear_proj is ext.TERowParallelLinear


def test_megatron_fp8_recipe_wrapper():
    """Megatron's TEDelayedScaling passes override_linear_precision, a field of older TE
    releases: accepted with a DeprecationWarning, the recipe otherwise as asked."""
    ext = _import_megatron()
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformer_engine.common import recipe
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, fp8="hybrid",
                               use_cpu_initialization=True,
                               fp8_amax_history_len=16, fp8_amax_compute_algo="max")
    with pytest.warns(DeprecationWarning, match="override_linear_precision"):
        r = ext.TEDelayedScaling(config, recipe.Format.HYBRID, override_linear_precision=(False, False, False))
    assert isinstance(r, recipe.DelayedScaling)
    assert r.amax_history_len == 16 and r.fp8_format is recipe.Format.HYBRID
