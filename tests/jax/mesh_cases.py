"""Flax modules under a jax.sharding.Mesh with a data- and a tensor-parallel axis, against one
device. Run as a script in its own process (the parent sets XLA_FLAGS so that the CPU shows four
devices, which must happen before jax is imported); it exits non-zero with the reason when a
check fails. Used by test_sharding_mesh.py (CPU, mesh 2x2) and, on two GPUs, by
tests/distributed/test_jax_mesh_gpu.py (meshes 1x2 and 2x1).

A LayerNormMLP + DenseGeneral block takes three SGD steps under FP8 delayed scaling. Parameters
and inputs are placed by the logical axis rules of transformer_engine.jax.sharding (batch over
dp, the MLP's inner dimension over tp). Losses, outputs, gradients and the FP8 metadata must
match the single-device run; the metadata must be replicated on every device, and the compiled
step must reduce amaxes with a maximum across devices. Where the single-device run takes the native custom calls (one
GPU) and the meshed run the partitioned jnp ops, the two are different implementations and are
held to FP8-rounding bounds (NATIVE) rather than to those of the same ops (SAME_OPS)."""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import transformer_engine.jax as te
import transformer_engine.jax.flax as te_flax
from transformer_engine.jax import sharding as tes
from transformer_engine.common import recipe
from transformer_engine.jax.primitives.registry import why_reference

BATCH, SEQ, HIDDEN, FFN, STEPS, LR = 8, 16, 64, 96, 3, 0.5


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        y, _ = te_flax.LayerNormMLP(intermediate_dim=FFN, activations=("gelu",),
                                    intermediate_dropout_rate=0.0, use_bias=True)(x, deterministic=True)
        return te_flax.DenseGeneral(features=HIDDEN)(y)


# logical axes of each parameter: the MLP's inner dimension split over tp (column-parallel wi,
# row-parallel wo), the rest whole
PARAM_AXES = {
    "LayerNormMLP_0": {"scale": P(tes.HIDDEN_AXES), "ln_bias": P(tes.HIDDEN_AXES),
                       "wi_kernel": P(tes.HIDDEN_AXES, tes.JOINED_AXES, tes.W_TP_AXES),
                       "wi_bias": P(tes.JOINED_AXES, tes.W_TP_AXES),
                       "wo_kernel": P(tes.W_TP_AXES, tes.HIDDEN_AXES), "wo_bias": P(tes.HIDDEN_AXES)},
    "DenseGeneral_0": {"kernel": P(tes.W_FSDP_AXES, tes.W_NO_SHARD_AXES), "bias": P(tes.HIDDEN_AXES)},
}
INPUT_AXES = P(tes.BATCH_AXES, tes.SEQLEN_AXES, tes.HIDDEN_AXES)


def _data(seed, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((BATCH, SEQ, HIDDEN)) * scale,
                       jnp.float32)


def train(model, params, fp8, place):
    def loss_fn(p, f, x, t):
        y = model.apply({"params": p, **f}, x)
        return jnp.mean((y - t) ** 2), y

    step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))
    record = []
    for k in range(STEPS):
        x, t = place(_data(10 + k)), place(_data(20 + k, 0.5))
        (loss, y), (g, gf) = step(params, fp8, x, t)
        fp8 = te.update_fp8_metas(gf)
        record.append((loss, y, g, fp8))
        params = jax.tree_util.tree_map(lambda a, b: a - LR * b, params, g)
    hlo = step.lower(params, fp8, x, t).compile().as_text()
    return record, hlo


def _close(what, got, want, rtol, atol):
    got, want = np.asarray(got), np.asarray(want)
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        err = np.max(np.abs(got - want) / (atol + rtol * np.abs(want)))
        sys.exit(f"{what}: differs from one device ({err:.3g} times the tolerance)")


def _close_norm(what, got, want, rel):
    """|got - want| <= rel * |want| in the L2 norm: for two implementations whose FP8 casts may
    round an element to neighbouring FP8 values (a few percent apart), which an elementwise
    bound would count as a failure."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    if not err <= rel:
        sys.exit(f"{what}: differs from one device (relative L2 error {err:.3g}, allowed {rel:g})")


# Bounds when the single-device run and the meshed run execute the same jnp ops (the CPU, or
# NVTE_JAX_CUSTOM_CALLS=0): the same casts, sums in another order only. On one GPU the native
# custom calls run instead (the meshed run partitions the jnp ops), so the two are different
# implementations: their accumulations differ and an FP8 cast may land one FP8 step apart.
SAME_OPS = {"loss": (1e-4, 1e-6), "output": (2e-3, 2e-3), "grad": (1e-2, 1e-4), "meta": 1e-5}
NATIVE = {"loss": 1e-3, "output": 1e-2, "grad": 2e-2, "meta": 5e-3}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mesh", default="2x2", help="dp x tp")
    args = ap.parse_args()
    dp, tp = (int(v) for v in args.mesh.split("x"))
    r = recipe.DelayedScaling(amax_history_len=4)
    model = Block()
    with te.fp8_autocast(True, r):
        variables = model.init(jax.random.PRNGKey(0), _data(1))
    params = variables["params"]
    fp8 = {k: v for k, v in variables.items() if k != "params"}

    with te.fp8_autocast(True, r):
        single, _ = train(model, params, fp8, lambda a: a)
    native = why_reference("gemm") == ""  # the single-device run took the custom calls

    if len(jax.devices()) < dp * tp:
        sys.exit(f"mesh {args.mesh} needs {dp * tp} devices; {len(jax.devices())} visible")
    devices = np.asarray(jax.devices()[:dp * tp]).reshape(dp, tp)
    mesh = Mesh(devices, ("dp", "tp"))
    resource = te.MeshResource(dp_resource="dp", tp_resource="tp")
    with mesh, tes.global_shard_guard(resource), te.fp8_autocast(True, r):
        rules = te_flax.extend_logical_axis_rules(())
        shardings = nn.logical_to_mesh_sharding(PARAM_AXES, mesh, rules)
        in_sharding = nn.logical_to_mesh_sharding(INPUT_AXES, mesh, rules)
        sharded_params = jax.device_put(params, shardings)
        sharded_fp8 = jax.device_put(fp8, NamedSharding(mesh, P()))
        split, hlo = train(model, sharded_params, sharded_fp8,
                           lambda a: jax.device_put(a, in_sharding))

    wi = split[0][2]["LayerNormMLP_0"]["wi_kernel"]
    if tp > 1 and wi.sharding.shard_shape(wi.shape)[-1] != FFN // tp:
        sys.exit(f"wi_kernel's gradient is not split over tp: {wi.sharding}")
    for k, ((loss1, y1, g1, f1), (loss2, y2, g2, f2)) in enumerate(zip(single, split)):
        # same scales (global amaxes), so the FP8 casts agree; sums split over devices differ
        # in order only
        if native:
            _close(f"step {k} loss", loss2, loss1, NATIVE["loss"], 0)
            _close_norm(f"step {k} output", y2, y1, NATIVE["output"])
        else:
            _close(f"step {k} loss", loss2, loss1, *SAME_OPS["loss"])
            _close(f"step {k} output", y2, y1, *SAME_OPS["output"])
        for path, a in jax.tree_util.tree_leaves_with_path(g1):
            b = g2
            for key in path:
                b = b[key.key]
            if native:
                _close_norm(f"step {k} grad {jax.tree_util.keystr(path)}", b, a, NATIVE["grad"])
            else:
                _close(f"step {k} grad {jax.tree_util.keystr(path)}", b, a, *SAME_OPS["grad"])
        for path, a in jax.tree_util.tree_leaves_with_path(f1):
            b = f2
            for key in path:
                b = b[key.key]
            if not b.sharding.is_fully_replicated:
                sys.exit(f"FP8 metadata {jax.tree_util.keystr(path)} is not replicated: {b.sharding}")
            _close(f"step {k} FP8 metadata {jax.tree_util.keystr(path)}", b, a,
                   NATIVE["meta"] if native else SAME_OPS["meta"], 0)
    if dp * tp > 1 and not any("all-reduce" in line and "maximum" in line.lower()
                               for line in _reductions(hlo)):
        sys.exit("the compiled step has no max all-reduce (amaxes not reduced across devices)")
    n_max = sum("maximum" in line.lower() for line in _reductions(hlo))
    print(f"mesh {args.mesh}: {STEPS} FP8 steps match one device ({n_max} max all-reduces in the step)")


def _reductions(hlo: str):
    """Lines of all-reduces with the name of their reduction computation resolved."""
    comps, out = {}, []
    name = None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            name = line.split()[0] if not line.startswith("ENTRY") else "ENTRY"
            comps[name] = []
        elif name is not None:
            comps[name].append(line)
    for line in hlo.splitlines():
        # the GPU backend makes its all-reduces async: all-reduce-start / all-reduce-done
        if ("all-reduce(" in line or "all-reduce-start(" in line) and "to_apply=" in line:
            target = line.split("to_apply=")[1].split(",")[0].split()[0].rstrip("}")
            body = " ".join(comps.get(target, []) + comps.get("%" + target, []))
            out.append(line + " " + body)
    return out


if __name__ == "__main__":
    main()
