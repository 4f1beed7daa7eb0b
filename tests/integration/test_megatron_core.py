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
    assert is_te_min_version("2.6.0") and not is_te_min_version("2.7.0dev0")


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


@pytest.fixture
def model_parallel_of_one():
    """Megatron's model-parallel state over a one-rank gloo group (the CPU stands in for a GPU)."""
    import os
    import socket
    import torch.distributed as dist
    _import_megatron()
    from megatron.core import parallel_state
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.parametrize("fp8", [None, "hybrid"])
def test_gpt_with_te_spec_trains_on_cpu(model_parallel_of_one, fp8):
    """Megatron's GPT built from its TE layer spec runs on this library's reference backend: the
    loss of a learnable sequence task falls over a few steps, in FP32 and with FP8 (emulated)."""
    import torch
    import transformer_engine.pytorch as te
    from megatron.core.fp8_utils import get_fp8_context
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                   ffn_hidden_size=128, use_cpu_initialization=True,
                                   params_dtype=torch.float32, hidden_dropout=0.0,
                                   attention_dropout=0.0, fp8=fp8, fp8_recipe="delayed",
                                   fp8_amax_history_len=8)
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
                         vocab_size=64, max_sequence_length=32)
    te_modules = [m for m in model.modules() if isinstance(m, te.module.base.TransformerEngineBaseModule)]
    assert len(te_modules) == 8  # per layer: fused norm+QKV and the projection; norm+FC1 and FC2
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(8):
        start = torch.randint(0, 64, (4, 1), generator=g)
        seq = (start + torch.arange(33)) % 64  # counting sequences: learnable
        opt.zero_grad()
        with get_fp8_context(config):
            loss = model(seq[:, :-1], torch.arange(32).expand(4, 32), None, labels=seq[:, 1:]).float().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    if fp8:
        assert all(m.fp8_meta["fp8_checkpoint"] for m in te_modules)
        assert all(bool((m.fp8_meta["scaling_fwd"].amax_history > 0).any()) for m in te_modules)
