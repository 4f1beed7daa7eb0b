"""MNIST-like digit classifier with te_flax.DenseGeneral, trained in BF16 and in FP8 side by side.

Data: scikit-learn's bundled 8x8 digits (no download). Model: three DenseGeneral layers with
GELU. Both runs keep FP32 master parameters and compute in BF16 (the parameters are cast for
each step); the FP8 run traces the step under te.fp8_autocast with delayed scaling, whose
metadata (amax history, scales) lives in the FP8 variable collection and is carried from step
to step with te.update_fp8_metas. Without a GPU it runs a few steps on the reference backend.

    python examples/mnist_jax.py            # full length on a GPU, quick on CPU
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import example_common as common
import transformer_engine.jax as te
import transformer_engine.jax.flax as te_flax
from transformer_engine.common import recipe

NUM_CLASSES = 10
PADDED_CLASSES = 16  # FP8 GEMMs need feature sizes that are multiples of 16
BATCH = 128
HIDDEN = 256


class DigitsMLP(flax.linen.Module):
    dtype: jnp.dtype = jnp.bfloat16

    @flax.linen.compact
    def __call__(self, x):
        x = jax.nn.gelu(te_flax.DenseGeneral(HIDDEN, dtype=self.dtype)(x))
        x = jax.nn.gelu(te_flax.DenseGeneral(HIDDEN, dtype=self.dtype)(x))
        return te_flax.DenseGeneral(PADDED_CLASSES, dtype=self.dtype)(x)[:, :NUM_CLASSES]


def to_compute(params):
    """BF16 copies of the FP32 master parameters (gradients flow back through the cast)."""
    return jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)


def main() -> int:
    has_gpu = jax.default_backend() != "cpu"
    args = common.parse_args(__doc__.splitlines()[0], full_steps=3000, quick_steps=20,
                             has_gpu=has_gpu)
    x_tr, y_tr, x_te, y_te = common.digits_split(args.seed)
    order = np.random.default_rng(args.seed).integers(0, len(x_tr), size=(args.steps, BATCH))
    fp8_recipe = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16,
                                       amax_compute_algo="max")
    model = DigitsMLP()

    def train(precision: str):
        with te.fp8_autocast(enabled=precision == "fp8", fp8_recipe=fp8_recipe):
            variables = model.init(jax.random.PRNGKey(args.seed), jnp.asarray(x_tr[:BATCH]))
            fp8_vars, params = flax.core.pop(variables, "params")
            params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params)
            schedule = optax.cosine_decay_schedule(1e-3, args.steps)
            opt = optax.adamw(schedule, weight_decay=1e-4)
            opt_state = opt.init(params)

            def loss_fn(params, fp8_vars, x, y):
                logits = model.apply({"params": to_compute(params), **fp8_vars}, x)
                return optax.softmax_cross_entropy_with_integer_labels(
                    logits.astype(jnp.float32), y).mean()

            @jax.jit
            def step(params, fp8_vars, opt_state, x, y):
                loss, (grads, fp8_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
                    params, fp8_vars, x, y)
                updates, opt_state = opt.update(grads, opt_state, params)
                # the "gradients" of the FP8 collection are its updated values
                return optax.apply_updates(params, updates), te.update_fp8_metas(fp8_grads), \
                    opt_state, loss

            @jax.jit
            def predict(params, fp8_vars, x):
                return model.apply({"params": to_compute(params), **fp8_vars}, x).argmax(-1)

            losses = []
            bar = common.progress(args.steps, f"digits {precision}", args.no_progress)
            for i in bar:
                idx = order[i]
                params, fp8_vars, opt_state, loss = step(params, fp8_vars, opt_state,
                                                         x_tr[idx], y_tr[idx])
                losses.append(float(loss))
                bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
            pred = np.asarray(predict(params, fp8_vars, x_te))
        return {"losses": losses, "metric": 100.0 * float((pred == y_te).mean())}

    results = common.run_both(train)
    return common.report("mnist_jax", "te_flax.DenseGeneral digits classifier", "accuracy %",
                         results, args, jax.devices()[0].device_kind)


if __name__ == "__main__":
    raise SystemExit(main())
