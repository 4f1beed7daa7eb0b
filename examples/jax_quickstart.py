"""JAX quickstart: a te_flax.DenseGeneral layer under fp8_autocast, trained for a few steps.

The loss is the mean squared error against the outputs of a fixed random linear map, so it is
bounded below by zero and falls as the layer learns that map. Delayed-scaling FP8 metadata (the
FP8 variable collection) is carried from step to step with te.update_fp8_metas.
"""
import flax
import jax
import jax.numpy as jnp

import transformer_engine.jax as te
import transformer_engine.jax.flax as te_flax
from transformer_engine.common import recipe

HIDDEN = 1024
# The mean over 4M outputs makes each kernel gradient small; plain gradient descent on this
# quadratic is stable below a step of HIDDEN and contracts the error by ~20% a step at 100.
LEARNING_RATE = 100.0
inp = jax.random.normal(jax.random.PRNGKey(1), [32, 128, HIDDEN], jnp.float32)
true_map = jax.random.normal(jax.random.PRNGKey(2), [HIDDEN, HIDDEN], jnp.float32) / HIDDEN ** 0.5
target = inp @ true_map

with te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)):
    model = te_flax.DenseGeneral(features=HIDDEN)

    def loss_fn(params, other_vars, inp, target):
        out = model.apply({'params': params, **other_vars}, inp)
        return jnp.mean((out - target) ** 2)

    variables = model.init(jax.random.PRNGKey(0), inp)
    other_variables, params = flax.core.pop(variables, 'params')
    fwd_bwd_fn = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))

    losses = []
    for _ in range(20):
        loss, (param_grads, other_grads) = fwd_bwd_fn(params, other_variables, inp, target)
        params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, param_grads)
        # the "gradients" of the FP8 collection are its updated amax history and scales
        other_variables = te.update_fp8_metas(other_grads)
        losses.append(float(loss))

print("mean squared error per step:", " ".join(f"{v:.4f}" for v in losses))
assert losses[-1] < 0.1 * losses[0], "the loss did not fall"
print(f"loss decreased from {losses[0]:.4f} to {losses[-1]:.4f}")
