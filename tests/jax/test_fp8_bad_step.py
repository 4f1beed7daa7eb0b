"""FP8 scaling in the Flax modules survives a step with non-finite values, under DelayedScaling and
Float8CurrentScaling: the NaN/inf amax never enters the amax history, the tensor keeps its last
finite scale, the skip is counted in the FP8 variables (read with fp8_skipped_updates, warned
about once per op and recipe), and the steps after it are as accurate against the BF16 model as
the steps before. The train step is jitted; on a GPU it runs the custom calls, elsewhere the jnp
reference."""
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytest.importorskip("flax")

from jax_utils import rand  # noqa: E402
import transformer_engine.jax as te  # noqa: E402
import transformer_engine.jax.flax as te_flax  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402
from transformer_engine.jax import skipped_updates  # noqa: E402

TOKENS, IN, OUT = 48, 80, 64
RECIPES = [recipe.DelayedScaling(amax_history_len=8), recipe.Float8CurrentScaling()]
RECIPE_IDS = ["delayed", "current"]
INPUT, KERNEL, GRAD = 0, 1, 2


@pytest.fixture(autouse=True)
def _fresh_warnings():
    skipped_updates._WARNED.clear()  # each test sees its own first warning
    yield
    skipped_updates._WARNED.clear()


def _split(variables):
    return variables["params"], {k: v for k, v in variables.items() if k != "params"}


class _Trainer:
    """A jitted train step of one Flax module: loss = sum(y * dy) with a fixed random dy (so a
    NaN input reaches only the input's amax), SGD on the parameters, skipped when a gradient is
    not finite (what a loss-scaled optimiser does), and the FP8 state carried on."""

    def __init__(self, model, fp8_recipe, x0, lr=1e-3):
        self.model, self.recipe = model, fp8_recipe
        with te.fp8_autocast(True, fp8_recipe):
            self.params, self.fp8 = _split(model.init(jax.random.PRNGKey(0), x0))

        def loss(p, o, x, dy):
            return jnp.sum(self._out(model.apply({"params": p, **o}, x)).astype(jnp.float32) * dy)

        def step(p, o, x, dy):
            g, og = jax.grad(loss, argnums=(0, 1))(p, o, x, dy)
            finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(t)) for t in jax.tree_util.tree_leaves(g)]))
            p = jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a - lr * b.astype(a.dtype), a), p, g)
            return p, te.update_fp8_metas(og)

        self._jit_step = jax.jit(step)
        self._jit_fp8_apply = jax.jit(lambda p, o, x: self._out(model.apply({"params": p, **o}, x)))
        self._bf16_apply = jax.jit(lambda p, x: self._out(model.apply({"params": p}, x)))

    def _step(self, *args):
        with te.fp8_autocast(True, self.recipe):  # jit traces on the first call: FP8 on there
            return self._jit_step(*args)

    def _fp8_apply(self, *args):
        with te.fp8_autocast(True, self.recipe):
            return self._jit_fp8_apply(*args)

    @staticmethod
    def _out(y):
        return y[0] if isinstance(y, tuple) else y

    def step(self, x, dy_seed):
        dy = rand(self._fp8_apply(self.params, self.fp8, x).shape, "float32", dy_seed)
        self.params, self.fp8 = self._step(self.params, self.fp8, x, dy)

    def rel_err(self, x):
        """|FP8 - BF16| / |BF16| of the module's output (the same parameters, FP8 off)."""
        y8 = self._fp8_apply(self.params, self.fp8, x).astype(jnp.float32)
        y = self._bf16_apply(self.params, x).astype(jnp.float32)
        return float(jnp.linalg.norm(y8 - y) / jnp.linalg.norm(y))

    def meta(self):
        return {k: np.asarray(v) for k, v in self.fp8[te.FP8_COLLECTION].items()}


def _dense(fp8_recipe):
    model = te_flax.DenseGeneral(features=OUT, dtype=jnp.bfloat16)
    return _Trainer(model, fp8_recipe, rand((TOKENS, IN), "bfloat16", 1, 0.5))


@pytest.mark.parametrize("fp8_recipe", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_dense_general_survives_a_bad_input_step(fp8_recipe, bad):
    t = _dense(fp8_recipe)
    for k in range(3):
        t.step(rand((TOKENS, IN), "bfloat16", 10 + k, 0.5), 100 + k)
    baseline = t.rel_err(rand((TOKENS, IN), "bfloat16", 50, 0.5))
    before = t.meta()
    assert before["kernel_skipped_updates"].tolist() == [0, 0, 0]

    kernel_amax = np.float32(jnp.max(jnp.abs(t.params["kernel"].astype(jnp.float32))))
    x_bad = rand((TOKENS, IN), "bfloat16", 20, 0.5).at[TOKENS - 1, IN // 2 + 1].set(bad)
    t.step(x_bad, 103)
    meta = t.meta()
    for name, value in meta.items():
        assert np.isfinite(value).all(), name
    assert meta["kernel_skipped_updates"].tolist() == [1, 0, 0]
    assert meta["kernel_scale"][INPUT] == before["kernel_scale"][INPUT]  # the last finite scale
    if "kernel_amax_history" in meta:  # delayed: the input's column is not rolled, the others are
        hist, old = meta["kernel_amax_history"], before["kernel_amax_history"]
        assert np.array_equal(hist[1:, INPUT], old[1:, INPUT]) and hist[0, INPUT] == 0
        assert hist[-1, KERNEL] == kernel_amax
        assert hist[-1, GRAD] > 0

    with pytest.warns(RuntimeWarning, match=f"kernel: 1 FP8 scale update.*{type(fp8_recipe).__name__}"
                                            f".*NaN or infinite"):
        counts = te.fp8_skipped_updates(t.fp8)
    assert set(counts) == {"kernel"} and counts["kernel"].dtype == jnp.int32
    assert counts["kernel"].tolist() == [1, 0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read again: warned only once
        assert te.fp8_skipped_updates(t.fp8)["kernel"].tolist() == [1, 0, 0]
        in_jit = jax.jit(te.fp8_skipped_updates)(t.fp8)  # traced: no host read, no warning
    assert in_jit["kernel"].tolist() == [1, 0, 0]

    # inputs 16x larger from now on: one step later the error is back to normal
    for k in range(2):
        t.step(rand((TOKENS, IN), "bfloat16", 30 + k, 8.0), 110 + k)
    after = t.rel_err(rand((TOKENS, IN), "bfloat16", 51, 8.0))
    assert after < 2 * baseline + 1e-3, (baseline, after)
    assert t.meta()["kernel_skipped_updates"].tolist() == [1, 0, 0]


@pytest.mark.parametrize("fp8_recipe", RECIPES, ids=RECIPE_IDS)
def test_bad_output_gradient_keeps_the_gradient_scale(fp8_recipe):
    t = _dense(fp8_recipe)
    for k in range(2):
        t.step(rand((TOKENS, IN), "bfloat16", 10 + k), 100 + k)
    before = t.meta()
    x = rand((TOKENS, IN), "bfloat16", 12)
    dy = rand((TOKENS, OUT), "float32", 13).at[3, 7].set(jnp.inf)
    t.params, t.fp8 = t._step(t.params, t.fp8, x, dy)
    meta = t.meta()
    assert meta["kernel_skipped_updates"].tolist() == [0, 0, 1]
    assert meta["kernel_scale"][GRAD] == before["kernel_scale"][GRAD]
    assert all(np.isfinite(v).all() for v in meta.values())


@pytest.mark.parametrize("fp8_recipe", RECIPES, ids=RECIPE_IDS)
def test_layernorm_mlp_counts_each_gemm(fp8_recipe):
    """A NaN token through LayerNormMLP: both GEMMs see it (the norm spreads it over its row), each
    counted under its own path; the state stays finite and the next step is accurate again."""
    model = te_flax.LayerNormMLP(intermediate_dim=48, activations=("gelu",), dtype=jnp.bfloat16,
                                 intermediate_dropout_rate=0.0)
    t = _Trainer(model, fp8_recipe, rand((2, 16, IN), "bfloat16", 1))
    t.step(rand((2, 16, IN), "bfloat16", 2), 3)
    baseline = t.rel_err(rand((2, 16, IN), "bfloat16", 4))
    t.step(rand((2, 16, IN), "bfloat16", 5).at[1, 9, 3].set(jnp.nan), 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = te.fp8_skipped_updates(t.fp8)
    assert sorted(str(w.message).split(":")[0] for w in caught) == ["wi", "wo"]  # one per op
    assert set(counts) == {"wi", "wo"}
    assert counts["wi"][INPUT] == 1 and counts["wo"][INPUT] == 1
    assert counts["wi"][KERNEL] == 0 and counts["wo"][KERNEL] == 0
    assert all(np.isfinite(v).all() for v in t.meta().values())
    t.step(rand((2, 16, IN), "bfloat16", 7), 8)
    assert t.rel_err(rand((2, 16, IN), "bfloat16", 9)) < 2 * baseline + 1e-3


def test_transformer_layer_reports_every_op_by_path():
    layer = te_flax.TransformerLayer(hidden_size=32, mlp_hidden_size=64, num_attention_heads=2,
                                     hidden_dropout=0.0, attention_dropout=0.0,
                                     intermediate_dropout=0.0, dtype=jnp.float32)
    x = rand((2, 16, 32), "float32", 1)
    with te.fp8_autocast(True, RECIPES[0]):
        fp8 = _split(layer.init(jax.random.PRNGKey(0), x, deterministic=True))[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all zero: no warning
        counts = te.fp8_skipped_updates(fp8)
    assert len(counts) >= 4 and all(c.tolist() == [0, 0, 0] for c in counts.values())
    assert any(p.endswith("/wi") for p in counts) and any("/" in p for p in counts), sorted(counts)
    collection = fp8[te.FP8_COLLECTION]
    for path in counts:  # each path names the op's variables inside the collection
        *mods, op = path.split("/")
        node = collection
        for m in mods:
            node = node[m]
        assert f"{op}_skipped_updates" in node and f"{op}_scale" in node


def test_high_precision_step_hands_the_state_on():
    """A batch whose token count does not fit an FP8 GEMM (37) runs in high precision: the FP8
    state, skip counts included, comes out of the step unchanged (not zeroed)."""
    t = _dense(RECIPES[0])
    t.step(rand((TOKENS, IN), "bfloat16", 2).at[0, 0].set(jnp.nan), 3)
    before = t.meta()
    t.step(rand((37, IN), "bfloat16", 4), 5)
    after = t.meta()
    assert after["kernel_skipped_updates"].tolist() == [1, 0, 0]
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_current_scaling_applies_without_state():
    """Variables without the FP8 collection (e.g. params only) still apply under current
    scaling: the casts are stateless and nothing is counted."""
    model = te_flax.DenseGeneral(features=OUT)
    x = rand((TOKENS, IN), "float32", 1)
    with te.fp8_autocast(True, RECIPES[1]):
        params = model.init(jax.random.PRNGKey(0), x)["params"]
        y = jax.jit(lambda p, x: model.apply({"params": p}, x))(params, x)
    ref = x @ params["kernel"] + params["bias"]
    assert float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref)) < 0.1
    assert te.fp8_skipped_updates({"params": params}) == {}


def test_in_step_warning_under_the_debug_flag(monkeypatch):
    monkeypatch.setenv("NVTE_JAX_WARN_SKIPPED_UPDATES", "1")
    t = _dense(RECIPES[1])
    t.step(rand((TOKENS, IN), "bfloat16", 2).at[5, 5].set(jnp.nan), 3)
    with pytest.warns(RuntimeWarning, match="kernel: 1 FP8 scale update.*Float8CurrentScaling"):
        t.step(rand((TOKENS, IN), "bfloat16", 4), 5)  # the step sees the count and warns
        jax.effects_barrier()


def test_bad_arguments_name_the_function():
    with pytest.raises(TypeError, match="fp8_skipped_updates: variables must be a dict"):
        te.fp8_skipped_updates(3)
    with te.fp8_autocast(True, RECIPES[0]):
        with pytest.raises(ValueError, match="dense: fp8_meta must be a tuple"):
            te.dense(rand((16, 16), "float32", 1), rand((16, 16), "float32", 2),
                     fp8_meta=jnp.ones(3))
        with pytest.raises(ValueError, match="dense: delayed scaling needs fp8_meta"):
            te.dense(rand((16, 16), "float32", 1), rand((16, 16), "float32", 2))
