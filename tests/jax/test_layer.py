"""Flax modules against reference Flax modules with the same parameters (forward and grads),
TransformerLayer configurations (native vs the jnp reference path, FP8 runs), and sharded vs
unsharded equality on a CPU mesh of 4 devices (a subprocess, so the device count is set before
JAX starts)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
flax = pytest.importorskip("flax")
nn = flax.linen

from jax_utils import assert_close, rand  # noqa: E402
import transformer_engine.jax as te  # noqa: E402
import transformer_engine.jax.flax as te_flax  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def grads(model, params, x, extra=None):
    def loss(p, x):
        out = model.apply({"params": p, **(extra or {})}, x)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(jnp.sin(out.astype(jnp.float32)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("use_bias", [False, True])
def test_dense_general_vs_flax(dtype, use_bias):
    x = rand((3, 37, 48), dtype, 1)
    ours = te_flax.DenseGeneral(features=40, use_bias=use_bias, dtype=getattr(jnp, dtype))
    ref = nn.DenseGeneral(features=40, use_bias=use_bias, dtype=getattr(jnp, dtype),
                          param_dtype=getattr(jnp, dtype))
    params = ours.init(jax.random.PRNGKey(0), x)["params"]
    params = {**params, "bias": rand((40,), dtype, 2)} if use_bias else params
    y = ours.apply({"params": params}, x)
    with jax.default_matmul_precision("highest"):  # XLA's GPU default for float32 is TF32
        y_ref = ref.apply({"params": params}, x)
        vr, (gpr, gxr) = grads(ref, params, x)
    assert_close(y, y_ref, dtype, "y", scale=2, of_max=True)
    v, (gp, gx) = grads(ours, params, x)
    assert_close(gx, gxr, dtype, "dx", scale=4, of_max=True)
    assert_close(gp["kernel"], gpr["kernel"], dtype, "dkernel", scale=4, of_max=True)


@pytest.mark.parametrize("layernorm_type", ["layernorm", "rmsnorm"])
def test_layernorm_vs_flax(layernorm_type):
    x = rand((4, 33, 64), "float32", 3, 2.0, 0.3)
    ours = te_flax.LayerNorm(layernorm_type=layernorm_type, epsilon=1e-6)
    ref = nn.LayerNorm(epsilon=1e-6) if layernorm_type == "layernorm" else nn.RMSNorm(epsilon=1e-6)
    params = ours.init(jax.random.PRNGKey(0), x)["params"]
    params = {"scale": rand((64,), "float32", 4, 0.2, 1.0),
              **({"ln_bias": rand((64,), "float32", 5)} if layernorm_type == "layernorm" else {})}
    ref_params = {"scale": params["scale"], **({"bias": params["ln_bias"]} if "ln_bias" in params else {})}
    assert_close(ours.apply({"params": params}, x), ref.apply({"params": ref_params}, x), "float32",
                 "z", scale=4)


@pytest.mark.parametrize("activations", [("gelu",), ("silu", "linear"), ("relu",)])
def test_layernorm_mlp_vs_reference(activations):
    x = rand((2, 32, 64), "float32", 6)
    ours = te_flax.LayerNormMLP(intermediate_dim=96, activations=activations, use_bias=True,
                                intermediate_dropout_rate=0.0)
    params = ours.init(jax.random.PRNGKey(0), x)["params"]

    def reference(p, x):
        mu = x.mean(-1, keepdims=True)
        h = (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6)
        h = h * p["scale"] + p["ln_bias"]
        y = jnp.einsum("bsh,hai->bsai", h, p["wi_kernel"]) + p["wi_bias"]
        act = {"gelu": lambda v: jax.nn.gelu(v, approximate=True), "silu": jax.nn.silu,
               "relu": jax.nn.relu, "linear": lambda v: v}
        a = act[activations[0]](y[:, :, 0])
        if len(activations) == 2:
            a = a * y[:, :, 1]
        return a @ p["wo_kernel"] + p["wo_bias"]

    y, _ = ours.apply({"params": params}, x, deterministic=True)
    with jax.default_matmul_precision("highest"):
        want = reference(params, x)
    assert_close(y, want, "float32", "y", scale=8, of_max=True)


CONFIGS = [
    dict(),
    dict(layernorm_type="rmsnorm", zero_centered_gamma=True, mlp_activations=("silu", "linear")),
    dict(num_gqa_groups=2, enable_rotary_pos_emb=True, enable_relative_embedding=False),
    dict(window_size=(8, 0), self_attn_mask_type="causal", use_bias=True),
    dict(apply_residual_connection_post_layernorm=True, output_layernorm=True),
    dict(transpose_batch_sequence=True),
    dict(layer_type="decoder"),
]


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_transformer_layer_configs(cfg, monkeypatch):
    kwargs = dict(CONFIGS[cfg])
    decoder = kwargs.pop("layer_type", None) == "decoder"
    layer = te_flax.TransformerLayer(
        hidden_size=64, mlp_hidden_size=128, num_attention_heads=4, hidden_dropout=0.0,
        attention_dropout=0.0, intermediate_dropout=0.0, dtype=jnp.bfloat16,
        layer_type=te_flax.TransformerLayerType.DECODER if decoder else te_flax.TransformerLayerType.ENCODER,
        **kwargs)
    x = rand((2, 32, 64), "bfloat16", 7)
    enc = rand((2, 32, 64), "bfloat16", 8) if decoder else None
    variables = layer.init(jax.random.PRNGKey(0), x, enc, deterministic=True)

    def run():
        def loss(p):
            return jnp.mean(layer.apply({"params": p}, x, enc, deterministic=True).astype(jnp.float32) ** 2)
        return jax.jit(jax.value_and_grad(loss))(variables["params"])

    v, g = run()
    assert np.isfinite(float(v))
    assert all(np.isfinite(np.asarray(t, np.float32)).all() for t in jax.tree_util.tree_leaves(g))
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "0")  # the jnp reference path
    v_ref, g_ref = run()
    assert_close(v, v_ref, "bfloat16", "loss", scale=4)


@pytest.mark.parametrize("fp8_recipe", [recipe.DelayedScaling(amax_history_len=8),
                                        recipe.Float8CurrentScaling()])
def test_fp8_layernorm_mlp_close_to_bf16(fp8_recipe):
    x = rand((4, 32, 64), "float32", 9)
    model = te_flax.LayerNormMLP(intermediate_dim=128, activations=("gelu",),
                                 intermediate_dropout_rate=0.0)

    def loss(p, o):
        return jnp.mean(model.apply({"params": p, **o}, x)[0] ** 2)

    with te.fp8_autocast(True, fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        others = {k: v for k, v in variables.items() if k != "params"}
        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        for _ in range(3):  # delayed scaling converges after a step
            v8, (g8, og) = step(variables["params"], others)
            others = og
        y8 = model.apply({"params": variables["params"], **others}, x)[0]
    v, g = jax.value_and_grad(loss)(variables["params"], {})
    y = model.apply({"params": variables["params"]}, x)[0]
    assert_close(y8, y, "float8_e4m3", "y", of_max=True)
    assert_close(v8, v, "float8_e4m3", "loss")
    assert_close(g8["wo_kernel"], g["wo_kernel"], "float8_e5m2", "dwo", of_max=True)


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import transformer_engine.jax as te
    import transformer_engine.jax.flax as te_flax
    assert jax.device_count() == 4
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("dp", "tp"))
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16, 64))
    model = te_flax.LayerNormMLP(intermediate_dim=128, activations=("gelu",),
                                 intermediate_dropout_rate=0.0)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    def loss(p, x):
        return jnp.mean(model.apply({"params": p}, x, deterministic=True)[0] ** 2)
    step = jax.jit(jax.value_and_grad(loss))
    v0, g0 = step(params, x)
    with te.fp8_autocast(False, mesh_resource=te.MeshResource(dp_resource="dp", tp_resource="tp")):
        with mesh:
            xs = jax.device_put(x, NamedSharding(mesh, P("dp")))
            v1, g1 = jax.jit(jax.value_and_grad(loss))(params, xs)
    np.testing.assert_allclose(float(v0), float(v1), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # data parallel on the primitives alone
    from transformer_engine.jax.primitives.normalization import layernorm
    f = jax.jit(lambda x: layernorm(x, jnp.ones(64), jnp.zeros(64)))
    with mesh:
        y1 = f(jax.device_put(x, NamedSharding(mesh, P("dp"))))
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(y1), rtol=1e-6)
    print("SHARDED OK")
""")


def test_sharded_matches_unsharded_on_cpu_mesh():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                          env=env, timeout=600)
    assert "SHARDED OK" in proc.stdout, proc.stdout + proc.stderr


def test_jit_with_named_sharding_on_default_devices():
    devs = np.array(jax.devices())
    mesh = jax.sharding.Mesh(devs, ("dp",))
    x = rand((len(devs) * 4, 32, 64), "bfloat16", 10)
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp")))
    g, b = jnp.ones(64, jnp.bfloat16), jnp.zeros(64, jnp.bfloat16)
    f = jax.jit(lambda v: te.layernorm(v, g, b))
    assert_close(f(xs), f(x), "bfloat16", "sharded")


@pytest.mark.parametrize("use_bias", [False, True])
def test_fused_gelu_mlp_matches_composed(use_bias):
    """GELU in the GEMM epilogues (fwd GeluAux, bwd DGelu[BGrad]) vs dense + activation + dense."""
    x = rand((2, 48, 64), "bfloat16", 11)
    g, b = rand((64,), "bfloat16", 12, 0.1, 1.0), rand((64,), "bfloat16", 13, 0.1)
    k1, k2 = rand((64, 96), "bfloat16", 14, 0.1), rand((96, 64), "bfloat16", 15, 0.1)
    b1 = rand((96,), "bfloat16", 16, 0.1) if use_bias else None
    b2 = rand((64,), "bfloat16", 17, 0.1) if use_bias else None

    def loss(fn):
        def f(x, k1, k2, b1, b2):
            y = te.layernorm_mlp(x, g, b, (k1, k2), (b1, b2), activation_type=("gelu",),
                                 intermediate_fn=fn)
            return jnp.mean(y.astype(jnp.float32) ** 2)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4)))(x, k1, k2, b1, b2)

    (v, gf), (vc, gc) = loss(None), loss(lambda a: a)
    assert_close(v, vc, "bfloat16", "loss")
    for a, c, what in zip(gf, gc, ("dx", "dk1", "dk2", "db1", "db2")):
        if a is not None:
            assert_close(a, c, "bfloat16", what, scale=2, of_max=True)
