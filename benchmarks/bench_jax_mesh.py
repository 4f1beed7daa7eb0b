"""JAX on a device mesh: one training step (forward + backward) of a Flax LayerNormMLP +
DenseGeneral block on one GPU against the same global batch over two GPUs, data-parallel (mesh
2x1) and tensor-parallel (mesh 1x2, the MLP's inner dimension split), in BF16 and FP8 (delayed
scaling). The peer, measured in the same run: the same block in plain flax.linen (nn.LayerNorm,
nn.Dense) in BF16 on each mesh.

Under a mesh of several devices the native custom calls step aside and XLA partitions the jnp
ops (NVTE_JAX_CUSTOM_CALLS). Those ops run on one device too (single_te_jnp_*: the custom calls
turned off), which shows the meshed path's per-device speed on any one GPU; "jnp_fp8_gemms"
counts the FP8 cuBLASLt GEMMs XLA made of the FP8 step's dots (its GEMM rewriter turns a dot of
FP8 operands widened to bf16 into one). With one device only the single rows run.

Shape: tokens 4096 (batch 2 x sequence 2048), hidden 4096, ffn 16384. A step is timed as the
median of ROUNDS windows of CALLS back-to-back jitted steps (block_until_ready at each end).

  python benchmarks/bench_jax_mesh.py [--json out.json] [--quick]
  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
      python benchmarks/bench_jax_mesh.py --small     (a smoke run of the script on the CPU)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import transformer_engine.jax as te
import transformer_engine.jax.flax as te_flax
from transformer_engine.jax import sharding as tes
from transformer_engine.common import recipe

MESHES = {"single": (1, 1), "dp2": (2, 1), "tp2": (1, 2)}


class TEBlock(nn.Module):
    ffn: int

    @nn.compact
    def __call__(self, x):
        y, _ = te_flax.LayerNormMLP(intermediate_dim=self.ffn, activations=("gelu",),
                                    intermediate_dropout_rate=0.0, dtype=jnp.bfloat16)(x, deterministic=True)
        return te_flax.DenseGeneral(features=x.shape[-1], dtype=jnp.bfloat16)(y)


class FlaxBlock(nn.Module):
    ffn: int

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        h = nn.gelu(nn.Dense(self.ffn, dtype=jnp.bfloat16, name="wi")(h))
        h = nn.Dense(x.shape[-1], dtype=jnp.bfloat16, name="wo")(h)
        return nn.Dense(x.shape[-1], dtype=jnp.bfloat16)(h)


def _shardings(params, mesh, tp):
    """The MLP's first kernel split by columns and its second by rows over tp; the rest whole."""
    def spec(path, leaf):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        if tp > 1 and ("wi_kernel" in name or ("wi" in name and "kernel" in name)):
            return NamedSharding(mesh, P(*([None] * (leaf.ndim - 1)), "tp"))
        if tp > 1 and ("wi_bias" in name or ("wi" in name and "bias" in name)):
            return NamedSharding(mesh, P(*([None] * (leaf.ndim - 1)), "tp"))
        if tp > 1 and ("wo_kernel" in name or ("wo" in name and "kernel" in name)):
            return NamedSharding(mesh, P("tp", None))
        return NamedSharding(mesh, P())
    return jax.tree_util.tree_map_with_path(spec, params)


def _fp8_gemms(model, fp8_recipe, tokens, hidden) -> int:
    """FP8 cuBLASLt GEMMs in the compiled one-device step (the custom-call target XLA gives them)."""
    x = jnp.zeros((2, tokens // 2, hidden), jnp.bfloat16)
    with te.fp8_autocast(True, fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        params = variables["params"]
        state = {k: v for k, v in variables.items() if k != "params"}

        def loss(p, s, x):
            return jnp.mean(model.apply({"params": p, **s}, x).astype(jnp.float32) ** 2)
        text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, state, x).compile().as_text()
    return text.count('custom_call_target="__cublas$lt$matmul$f8"')


def _time_step(model, fp8_recipe, mesh_shape, tokens, hidden, rounds, calls):
    dp, tp = mesh_shape
    mesh = Mesh(np.asarray(jax.devices()[:dp * tp]).reshape(dp, tp), ("dp", "tp"))
    resource = te.MeshResource(dp_resource="dp" if dp > 1 else None, tp_resource="tp" if tp > 1 else None)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, tokens // 2, hidden)), jnp.bfloat16)
    with mesh, tes.global_shard_guard(resource), te.fp8_autocast(fp8_recipe is not None, fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        params = jax.device_put(variables["params"], _shardings(variables["params"], mesh, tp))
        state = jax.device_put({k: v for k, v in variables.items() if k != "params"},
                               NamedSharding(mesh, P()))
        x = jax.device_put(x, NamedSharding(mesh, P("dp" if dp > 1 else None)))

        def loss(p, s, x):
            return jnp.mean(model.apply({"params": p, **s}, x).astype(jnp.float32) ** 2)

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        for _ in range(3):
            jax.block_until_ready(step(params, state, x))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                out = step(params, state, x)
            jax.block_until_ready(out)
            times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run on the CPU)")
    args = ap.parse_args()
    tokens, hidden, ffn = (64, 64, 128) if args.small else (4096, 4096, 16384)
    rounds, calls = (3, 2) if args.quick or args.small else (10, 5)
    meshes = {n: sh for n, sh in MESHES.items() if sh[0] * sh[1] <= len(jax.devices())}
    if len(meshes) < len(MESHES):
        print(f"{len(jax.devices())} device(s): the meshes of two devices are left out",
              file=sys.stderr)
    rows = {}
    for mesh_name, shape in meshes.items():
        rows[f"{mesh_name}_te_bf16"] = _time_step(TEBlock(ffn), None, shape, tokens, hidden, rounds, calls)
        rows[f"{mesh_name}_te_fp8"] = _time_step(TEBlock(ffn), recipe.DelayedScaling(), shape, tokens,
                                                 hidden, rounds, calls)
        rows[f"{mesh_name}_flax_bf16"] = _time_step(FlaxBlock(ffn), None, shape, tokens, hidden,
                                                    rounds, calls)
    # the meshed path's ops on one device: the custom calls off (read when a step is traced)
    previous = os.environ.get("NVTE_JAX_CUSTOM_CALLS")
    os.environ["NVTE_JAX_CUSTOM_CALLS"] = "0"
    try:
        rows["single_te_jnp_bf16"] = _time_step(TEBlock(ffn), None, (1, 1), tokens, hidden, rounds,
                                                calls)
        rows["single_te_jnp_fp8"] = _time_step(TEBlock(ffn), recipe.DelayedScaling(), (1, 1), tokens,
                                               hidden, rounds, calls)
        jnp_fp8_gemms = _fp8_gemms(TEBlock(ffn), recipe.DelayedScaling(), tokens, hidden)
    finally:
        if previous is None:
            del os.environ["NVTE_JAX_CUSTOM_CALLS"]
        else:
            os.environ["NVTE_JAX_CUSTOM_CALLS"] = previous
    ratios = {"single_jnp_fp8_vs_bf16": rows["single_te_jnp_bf16"] / rows["single_te_jnp_fp8"],
              "single_te_jnp_bf16_vs_flax": rows["single_flax_bf16"] / rows["single_te_jnp_bf16"]}
    for mesh_name in meshes:
        ratios[f"{mesh_name}_fp8_vs_bf16"] = rows[f"{mesh_name}_te_bf16"] / rows[f"{mesh_name}_te_fp8"]
        ratios[f"{mesh_name}_te_bf16_vs_flax"] = rows[f"{mesh_name}_flax_bf16"] / rows[f"{mesh_name}_te_bf16"]
    for mesh_name in set(meshes) - {"single"}:
        for kind in ("te_bf16", "te_fp8"):
            ratios[f"{mesh_name}_{kind}_scaling_vs_single"] = rows[f"single_{kind}"] / rows[f"{mesh_name}_{kind}"]
    print("ms per step:", {k: round(v, 3) for k, v in rows.items()})
    print("ratios:", {k: round(v, 3) for k, v in ratios.items()})
    print("FP8 cuBLASLt GEMMs in the one-device jnp FP8 step:", jnp_fp8_gemms)
    if args.json:
        dev = jax.devices()[0]
        with open(args.json, "w") as fh:
            json.dump({"device": getattr(dev, "device_kind", str(dev)), "devices": len(jax.devices()),
                       "date": datetime.date.today().isoformat(), "jax": jax.__version__,
                       "shape": dict(tokens=tokens, hidden=hidden, ffn=ffn), "ms": rows,
                       "ratios": ratios, "jnp_fp8_gemms": jnp_fp8_gemms}, fh, indent=1)


if __name__ == "__main__":
    main()
