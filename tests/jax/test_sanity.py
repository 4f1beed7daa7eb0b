"""The JAX frontend's plumbing: which path runs, the NVTE_JAX_CUSTOM_CALLS switch, clear
errors for bad input, jit and vmap, the autocast, and the issue's example (loss decreases)."""
import os
import runpy

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytest.importorskip("flax")

from jax_utils import ON_GPU, rand  # noqa: E402
import transformer_engine.jax as te  # noqa: E402
from transformer_engine.common import config, recipe  # noqa: E402
from transformer_engine.jax.primitives import cast as pcast, normalization as pnorm  # noqa: E402
from transformer_engine.jax.primitives.registry import why_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("value,name,expected", [
    ("", "gemm", True), ("0", "gemm", False), ("1", "softmax", True),
    ("gemm,layernorm", "gemm", True), ("gemm,layernorm", "softmax", False),
    ("-gemm", "gemm", False), ("-gemm", "layernorm", True)])
def test_custom_call_switch(monkeypatch, value, name, expected):
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", value)
    assert config.jax_custom_call_enabled(name) is expected


@pytest.mark.parametrize("value", ["gemm,-softmax", "bogus", "2"])
def test_custom_call_switch_rejects(monkeypatch, value):
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", value)
    with pytest.raises(ValueError, match="NVTE_JAX_CUSTOM_CALLS"):
        config.jax_custom_call_enabled("gemm")


def test_custom_calls_used_on_gpu(monkeypatch):
    monkeypatch.delenv("NVTE_JAX_CUSTOM_CALLS", raising=False)
    if not ON_GPU:
        assert why_reference("gemm") != ""
        pytest.skip("CPU: the jnp references run (custom calls need the GPU)")
    assert why_reference("gemm") == ""
    hlo = jax.jit(lambda x: pcast.quantize(x, 2.0, jnp.float8_e4m3fn)).lower(
        rand((32, 32), "float32", 0)).as_text()
    assert "te_quantize_ffi" in hlo
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "-quantize")
    hlo = jax.jit(lambda x: pcast.quantize(x, 3.0, jnp.float8_e4m3fn)).lower(
        rand((32, 32), "float32", 0)).as_text()
    assert "te_quantize_ffi" not in hlo


def test_bad_input_raises_clear_errors():
    x = rand((8, 16), "float32", 1)
    with pytest.raises(ValueError, match="layernorm_fwd: gamma"):
        pnorm.norm_fwd(x, jnp.ones(15), jnp.zeros(16))
    with pytest.raises(ValueError, match="quantize: x has dtype int32"):
        pcast.quantize(x.astype(jnp.int32), 1.0, jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="dense: x"):
        te.dense(x, jnp.ones((15, 4)))
    with pytest.raises(ValueError, match="layernorm_mlp: activations"):
        te.activation(x, ("tanh",))
    with pytest.raises(NotImplementedError, match="fp8_autocast"):
        with te.fp8_autocast(True, recipe.Recipe()):
            pass


def test_vmap_runs_each_element():
    x = rand((3, 16, 32), "bfloat16", 2)
    g, b = jnp.ones(32, jnp.bfloat16), jnp.zeros(32, jnp.bfloat16)
    got = jax.vmap(lambda v: pnorm.layernorm(v, g, b, 1e-5, False, "layernorm"))(x)
    want = jnp.stack([pnorm.layernorm(v, g, b, 1e-5, False, "layernorm") for v in x])
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # per-tensor amax stays per element under vmap
    amax = jax.vmap(lambda v: pcast.quantize(v, 1.0, jnp.float8_e4m3fn)[2])(x)
    np.testing.assert_array_equal(np.asarray(amax).ravel(),
                                  np.abs(np.asarray(x, np.float32)).max(axis=(1, 2)))


def test_autocast_state_and_alias():
    assert not te.is_fp8_enabled()
    r = recipe.Float8CurrentScaling()
    with te.autocast(enabled=True, recipe=r):
        assert te.is_fp8_enabled() and te.get_fp8_recipe() is r
    assert not te.is_fp8_enabled()


def test_fp8_dtypes_follow_device_flavor():
    from transformer_engine.common.capabilities import native_device_capability
    from transformer_engine.jax.fp8 import current_fp8_config
    with te.fp8_autocast(True, recipe.DelayedScaling()):
        cfg = current_fp8_config()
    flavor = native_device_capability().fp8_flavor
    assert jnp.dtype(cfg.fwd_dtype).name.endswith("fnuz") == (flavor == "fnuz")
    from transformer_engine.common import fp8_formats
    assert cfg.fwd_max == fp8_formats.fp8_max("e4m3", flavor)


def test_update_fp8_metas_selects_collection():
    tree = {"params": {"a": 1}, te.FP8_COLLECTION: {"m": 2}}
    assert te.update_fp8_metas(tree) == {te.FP8_COLLECTION: {"m": 2}}


def test_quickstart_example_loss_decreases(capsys):
    runpy.run_path(os.path.join(ROOT, "examples", "jax_quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "loss decreased" in out, out
