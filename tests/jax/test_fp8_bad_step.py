"""Delayed scaling in the Flax modules survives a step with a NaN input: the NaN never enters
the amax history, the scales stay the last finite ones, and the next steps are as accurate as
before (on the custom calls where a GPU is present, the jnp reference elsewhere)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
pytest.importorskip("flax")

from jax_utils import rand  # noqa: E402
import transformer_engine.jax as te  # noqa: E402
import transformer_engine.jax.flax as te_flax  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402


def test_dense_general_survives_a_nan_step():
    model = te_flax.DenseGeneral(features=48, use_bias=True)
    r = recipe.DelayedScaling(amax_history_len=8)

    def loss(p, o, x):
        return jnp.mean(model.apply({"params": p, **o}, x) ** 2)

    with te.fp8_autocast(True, r):
        x0 = rand((32, 64), "float32", 1, 0.5)
        variables = model.init(jax.random.PRNGKey(0), x0)
        params = variables["params"]
        fp8 = {k: v for k, v in variables.items() if k != "params"}
        step = jax.jit(jax.value_and_grad(loss, argnums=(1,)))
        apply = jax.jit(lambda o, x: model.apply({"params": params, **o}, x))

        def rel_err(o, x):
            ref = x @ params["kernel"] + params["bias"]
            return float(jnp.linalg.norm(apply(o, x) - ref) / jnp.linalg.norm(ref))

        for k in range(3):
            _, (fp8,) = step(params, fp8, rand((32, 64), "float32", 10 + k, 0.5))
        baseline = rel_err(fp8, rand((32, 64), "float32", 50, 0.5))
        meta = fp8[te.FP8_COLLECTION]
        before = {k: np.asarray(v) for k, v in meta.items()}

        bad = rand((32, 64), "float32", 20, 0.5).at[3, 5].set(jnp.nan)
        _, (fp8,) = step(params, fp8, bad)
        meta = fp8[te.FP8_COLLECTION]
        for name, value in meta.items():
            value = np.asarray(value)
            assert np.isfinite(value).all(), name
            if name.endswith("_scale"):
                assert value[0] == before[name][0], name  # the input's scale is kept
            else:
                assert np.array_equal(value[1:, 0], before[name][1:, 0]), name  # not rolled

        for k in range(2):  # inputs 16x larger: one step later the error is back to normal
            _, (fp8,) = step(params, fp8, rand((32, 64), "float32", 30 + k, 8.0))
        after = rel_err(fp8, rand((32, 64), "float32", 51, 8.0))
    assert after < 2 * baseline + 1e-3, (baseline, after)
