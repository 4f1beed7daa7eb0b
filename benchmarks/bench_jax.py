"""JAX frontend step time (forward + backward under jit): Transformer Engine's Flax LayerNormMLP
and TransformerLayer in BF16 and FP8 (delayed scaling) against plain Flax in BF16
(nn.LayerNorm + nn.Dense, jax.nn.dot_product_attention with its cuDNN implementation), all in
this run. Prints times and ratios (plain Flax BF16 time / ours: > 1 means we are faster)."""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import transformer_engine.jax as te  # noqa: E402
import transformer_engine.jax.flax as te_flax  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

BF16 = jnp.bfloat16


class FlaxMLP(nn.Module):
    hidden: int
    inter: int

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(epsilon=1e-6, dtype=BF16, param_dtype=BF16)(x)
        h = nn.Dense(self.inter, use_bias=False, dtype=BF16, param_dtype=BF16)(h)
        h = jax.nn.gelu(h, approximate=True)
        return nn.Dense(self.hidden, use_bias=False, dtype=BF16, param_dtype=BF16)(h)


class FlaxLayer(nn.Module):
    hidden: int
    inter: int
    heads: int

    @nn.compact
    def __call__(self, x):
        b, s, _ = x.shape
        d = self.hidden // self.heads
        h = nn.LayerNorm(epsilon=1e-6, dtype=BF16, param_dtype=BF16)(x)
        qkv = nn.Dense(3 * self.hidden, use_bias=False, dtype=BF16, param_dtype=BF16)(h)
        q, k, v = (t.reshape(b, s, self.heads, d) for t in jnp.split(qkv, 3, axis=-1))
        impl = "cudnn" if jax.default_backend() == "gpu" else None
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        x = x + nn.Dense(self.hidden, use_bias=False, dtype=BF16, param_dtype=BF16)(a.reshape(b, s, -1))
        return x + FlaxMLP(self.hidden, self.inter)(x)


def step_ms(model, x, fp8_recipe=None, reps=20):
    """Median ms of one jitted value_and_grad step (FP8 metadata threaded through the step)."""
    with te.fp8_autocast(enabled=fp8_recipe is not None, fp8_recipe=fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        params = variables["params"]
        others = {k: v for k, v in variables.items() if k != "params"}

        def loss(p, o, x):
            out = model.apply({"params": p, **o}, x)
            out = out[0] if isinstance(out, tuple) else out
            return jnp.mean(out.astype(jnp.float32) ** 2)

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        for _ in range(3):
            _, (_, og) = step(params, others, x)
            others = og if others else others
            jax.block_until_ready(og)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _, (g, og) = step(params, others, x)
            jax.block_until_ready((g, og))
            times.append((time.perf_counter() - t0) * 1e3)
            others = og if others else others
    return statistics.median(times)


def main():
    args = common.parse_args(__doc__)
    reps = 5 if args.quick else 20
    delayed = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16)
    cases = []
    b, s, hidden, inter, heads = 4, 2048, 4096, 16384, 32
    x = jax.random.normal(jax.random.PRNGKey(1), (b, s, hidden), jnp.float32).astype(BF16)
    te_mlp = te_flax.LayerNormMLP(intermediate_dim=inter, activations=("gelu",), dtype=BF16,
                                  intermediate_dropout_rate=0.0)
    cases.append(("LayerNormMLP", FlaxMLP(hidden, inter), te_mlp, x))
    b2, s2, h2, i2, heads2 = 4, 2048, 2048, 8192, 16
    x2 = jax.random.normal(jax.random.PRNGKey(2), (b2, s2, h2), jnp.float32).astype(BF16)
    te_layer = te_flax.TransformerLayer(hidden_size=h2, mlp_hidden_size=i2,
                                        num_attention_heads=heads2, mlp_activations=("gelu",),
                                        hidden_dropout=0.0, attention_dropout=0.0,
                                        intermediate_dropout=0.0, enable_relative_embedding=False,
                                        self_attn_mask_type="causal", dtype=BF16)
    cases.append(("TransformerLayer", FlaxLayer(h2, i2, heads2), te_layer, x2))
    rows = []
    for label, flax_model, te_model, inp in cases:
        if not common.selected(label, args.filter):
            continue
        base = step_ms(flax_model, inp, None, reps)
        te_bf16 = step_ms(te_model, inp, None, reps)
        te_fp8 = step_ms(te_model, inp, delayed, reps)
        rows.append({"case": label, "shape": "x".join(map(str, inp.shape)),
                     "flax_bf16_ms": base, "te_bf16_ms": te_bf16, "te_fp8_ms": te_fp8,
                     "speedup_bf16": base / te_bf16, "speedup_fp8": base / te_fp8})
    common.print_table(rows, ["case", "shape", "flax_bf16_ms", "te_bf16_ms", "te_fp8_ms",
                              "speedup_bf16", "speedup_fp8"])
    record = {"jax": jax.__version__, "backend": jax.default_backend()}
    try:
        record.update(common.device_record())
    except Exception as exc:  # no CUDA torch: name the JAX device instead
        record.update({"device": str(jax.devices()[0].device_kind), "error": str(exc)})
    common.write_json(args.json, {**record, "results": rows})


if __name__ == "__main__":
    main()
