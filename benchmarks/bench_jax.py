"""JAX frontend step time (forward + backward under jit): Transformer Engine's Flax LayerNormMLP
and TransformerLayer in BF16 and FP8 (delayed scaling) against plain Flax in BF16
(nn.LayerNorm + nn.Dense, jax.nn.dot_product_attention with its cuDNN implementation), all in
this run. Prints times and ratios (plain Flax BF16 time / ours: > 1 means we are faster).

--variants: TransformerLayer in BF16 again with single XLA FFI custom calls turned off
(NVTE_JAX_CUSTOM_CALLS=-gemm, -layernorm, -attention, and 0 for all), so the run shows which
native call gains or costs against XLA's own ops inside the compiled step.

--filter attention: transformer_engine.jax.fused_attn forced to each native backend (the XLA FFI
custom call: te_cudnn, te_portable) and as dispatched by default (te_default) against
jax.nn.dot_product_attention(implementation="cudnn"), forward and backward (= fwd+bwd - fwd),
bf16 bshd, causal and not; ratios are the peer's time / ours."""
from __future__ import annotations

import contextlib
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


_SWITCHES = {"cudnn": "NVTE_FUSED_ATTN", "portable": "NVTE_FLASH_ATTN", "sdpa": "NVTE_SDPA_ATTN",
             "unfused": "NVTE_UNFUSED_ATTN"}
ATTN_SHAPES = [(4, 2048, 16, 128), (4, 4096, 32, 128), (1, 16384, 32, 128)]  # b, s, h, d


@contextlib.contextmanager
def _forced(backend):
    """The attention switches forcing `backend` (None: the defaults) for the block."""
    from transformer_engine.jax.primitives import attention_selection
    values = ({} if backend is None else
              {var: "1" if name == backend else "0" for name, var in _SWITCHES.items()})
    with common.env_vars(values):
        attention_selection.clear_backend_cache()
        yield attention_selection


def _compiled_with(backend, fn, *args):
    """fn jitted and compiled under _forced(backend): the dispatcher decides at trace time, so
    the compiled call keeps that choice."""
    with _forced(backend):
        return jax.jit(fn).lower(*args).compile()


def _declined(backend, q, k, v, mask):
    """Why the dispatcher would not run `backend` here ('' when it would)."""
    if backend is None:
        return ""
    from transformer_engine.jax.attention import attention_config
    with _forced(backend) as selection:
        cfg = attention_config(q, k, v, qkv_format="bshd", mask_type=mask, window_size=None,
                               dropout_p=0.0, has_bias=False, has_mask_tensor=False)
        report = selection.get_attention_backend(cfg)
    return "" if report.chosen == backend else "; ".join(report.reasons(backend)) or report.note


def _median_ms(compiled, args, reps):
    for _ in range(3):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def attention_rows(reps, pattern):
    rows = []
    for b, s, h, d in ATTN_SHAPES:
        for causal in (False, True):
            label = f"attention {b}x{s}x{h}x{d} {'causal' if causal else 'full'}"
            if not common.selected(label, pattern):
                continue
            keys = jax.random.split(jax.random.PRNGKey(s + h), 4)
            q, k, v, do = (jax.random.normal(key, (b, s, h, d), jnp.float32).astype(BF16) for key in keys)
            mask = "causal" if causal else "no_mask"
            fns = {"te_cudnn": ("cudnn", lambda q, k, v: te.fused_attn(q, k, v, attn_mask_type=mask)),
                   "te_portable": ("portable", lambda q, k, v: te.fused_attn(q, k, v, attn_mask_type=mask)),
                   "te_default": (None, lambda q, k, v: te.fused_attn(q, k, v, attn_mask_type=mask)),
                   "jax_cudnn": (None, lambda q, k, v: jax.nn.dot_product_attention(
                       q, k, v, is_causal=causal, implementation="cudnn"))}
            row = {"case": label}
            flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
            for name, (backend, fn) in fns.items():
                def fwd_bwd(q, k, v, do, fn=fn):
                    out, vjp = jax.vjp(fn, q, k, v)
                    return vjp(do)
                why = _declined(backend, q, k, v, mask)
                if why:  # never time a fallback under this backend's name
                    row[f"{name}_error"] = f"declined: {why}"
                    print(f"    {label} {name}: not timed ({why})", flush=True)
                    continue
                try:
                    t_fwd = _median_ms(_compiled_with(backend, fn, q, k, v), (q, k, v), reps)
                    t_all = _median_ms(_compiled_with(backend, fwd_bwd, q, k, v, do), (q, k, v, do), reps)
                except Exception as exc:  # a backend not built or declining: reported, not timed
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    print(f"    {label} {name}: not timed ({row[f'{name}_error']})", flush=True)
                    continue
                row[f"{name}_fwd_ms"], row[f"{name}_bwd_ms"] = t_fwd, max(t_all - t_fwd, 1e-6)
                row[f"{name}_fwd_tflops"] = flops / (t_fwd * 1e-3) / 1e12
            for name in ("te_cudnn", "te_portable", "te_default"):
                for part in ("fwd", "bwd"):
                    if f"{name}_{part}_ms" in row and f"jax_cudnn_{part}_ms" in row:
                        row[f"{name}_{part}_vs_jax_cudnn"] = row[f"jax_cudnn_{part}_ms"] / row[f"{name}_{part}_ms"]
            print("    " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if "_vs_" in k), flush=True)
            rows.append(row)
    return rows


def main():
    args = common.parse_args(__doc__, {"variants": "TransformerLayer BF16 with single custom calls off"})
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
        if args.variants and label == "TransformerLayer":
            for off in ("-gemm", "-layernorm", "-attention", "0"):
                with common.env_vars({"NVTE_JAX_CUSTOM_CALLS": off}):
                    ms = step_ms(te_model, inp, None, reps)
                rows[-1][f"te_bf16_custom_calls[{off}]_ms"] = ms
                print(f"  {label} bf16 NVTE_JAX_CUSTOM_CALLS={off}: {ms:.3f} ms "
                      f"({base / ms:.3f}x plain Flax)", flush=True)
    common.print_table(rows, ["case", "shape", "flax_bf16_ms", "te_bf16_ms", "te_fp8_ms",
                              "speedup_bf16", "speedup_fp8"])
    attn = attention_rows(reps, args.filter)
    if attn:
        common.print_table(attn, ["case"] + sorted({k for r in attn for k in r if "_vs_" in k}))
    rows += attn
    record = {"jax": jax.__version__, "backend": jax.default_backend()}
    try:
        record.update(common.device_record())
    except Exception as exc:  # no CUDA torch: name the JAX device instead
        record.update({"device": str(jax.devices()[0].device_kind), "error": str(exc)})
    common.write_json(args.json, {**record, "results": rows})


if __name__ == "__main__":
    main()
