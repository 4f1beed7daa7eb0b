"""The JAX quickstart of issue 8, as written there (the training loop after it is ours: it
applies the gradients and the updated FP8 metadata, and prints the loss, which decreases)."""
import flax, jax, jax.numpy as jnp
import transformer_engine.jax as te
import transformer_engine.jax.flax as te_flax
from transformer_engine.common import recipe
inp = jax.random.normal(jax.random.PRNGKey(1), [32, 128, 1024], jnp.float32)
with te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)):
    model = te_flax.DenseGeneral(features=1024)
    def loss_fn(params, other_vars, inp):
        return jnp.mean(model.apply({'params': params, **other_vars}, inp))
    variables = model.init(jax.random.PRNGKey(0), inp)
    other_variables, params = flax.core.pop(variables, 'params')
    fwd_bwd_fn = jax.value_and_grad(loss_fn, argnums=(0, 1))
    for _ in range(10):
        loss, (param_grads, other_grads) = fwd_bwd_fn(params, other_variables, inp)

    # Beyond the text: train a few steps (SGD; FP8 metadata from the step's "gradients").
    step = jax.jit(fwd_bwd_fn)
    losses = []
    for _ in range(10):
        loss, (param_grads, other_grads) = step(params, other_variables, inp)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, param_grads)
        other_variables = te.update_fp8_metas(other_grads)
        losses.append(float(loss))
print("losses:", " ".join(f"{v:.5f}" for v in losses))
print("loss decreased" if losses[-1] < losses[0] else "loss did NOT decrease")
