"""Flax modules under a jax.sharding.Mesh with a data- and a tensor-parallel axis, against one
device. Run as a script in its own process (the parent sets XLA_FLAGS so that the CPU shows four
devices, which must happen before jax is imported); it exits non-zero with the reason when a
check fails. Used by test_sharding_mesh.py (CPU, mesh 2x2) and, on two GPUs, by
tests/distributed/test_jax_mesh_gpu.py (meshes 1x2 and 2x1).

A LayerNormMLP + DenseGeneral block takes three SGD steps under FP8 delayed scaling. Parameters
and inputs are placed by the logical axis rules of transformer_engine.jax.sharding (batch over
dp, the MLP's inner dimension over tp). The meshed run partitions the jnp ops, so it must match a
single-device run of the same ops tightly (losses, outputs, gradients, FP8 metadata, step after
step); the metadata must be replicated on every device, and the compiled step must reduce amaxes
with a maximum across devices. Where one device runs the native custom calls instead (a GPU),
each meshed step is also replayed from the native run's parameters and FP8 state and held to
FP8-rounding bounds (NATIVE) against that native step: two implementations whose accumulations
differ, so an FP8 cast may land one step apart, which a free-running comparison would compound
through the SGD updates."""
from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

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


def train(model, params, fp8, place, place_state=None, starts=None):
    """STEPS SGD steps: record[k] = (loss, output, grads, new FP8 variables, (params, fp8) the
    step started from). With `starts` (another run's record) each step starts from that run's
    state instead of this run's previous step, placed by `place_state`."""
    def loss_fn(p, f, x, t):
        y = model.apply({"params": p, **f}, x)
        return jnp.mean((y - t) ** 2), y

    step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))
    record = []
    for k in range(STEPS):
        if starts is not None:
            params, fp8 = place_state(*starts[k][4])
        x, t = place(_data(10 + k)), place(_data(20 + k, 0.5))
        (loss, y), (g, gf) = step(params, fp8, x, t)
        record.append((loss, y, g, te.update_fp8_metas(gf), (params, fp8)))
        fp8 = record[-1][3]
        params = jax.tree_util.tree_map(lambda a, b: a - LR * b, params, g)
    hlo = step.lower(params, fp8, x, t).compile().as_text()
    return record, hlo


def _jnp_ops():
    """The jnp ops on every device (the custom calls off), for the single-device run that the
    meshed run must match tightly."""
    return mock.patch.dict(os.environ, {"NVTE_JAX_CUSTOM_CALLS": "0"})


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


# SAME_OPS: the meshed run against a single-device run of the same jnp ops: the same casts, sums
# in another order only. NATIVE: a replayed meshed step against one device's native step, two
# implementations: the native FP8 GEMMs accumulate in the tensor cores' own order and precision,
# so a cast downstream may land one FP8 step apart (E4M3's relative step is 6.25-12.5 %, the
# gradients' E5M2 12.5-25 %); bounded by relative L2 norm, well inside one step.
SAME_OPS = {"loss": (1e-4, 1e-6), "output": (2e-3, 2e-3), "grad": (1e-2, 1e-4), "meta": 1e-5}
NATIVE = {"loss": 1e-3, "output": 2e-2, "grad": 5e-2, "meta": 5e-3}


def _leaves(tree, like):
    for path, a in jax.tree_util.tree_leaves_with_path(like):
        b = tree
        for key in path:
            b = b[key.key]
        yield jax.tree_util.keystr(path), b, a


def _compare(split, single, against, bounds):
    """Every step's loss, output, gradients and new FP8 metadata of the meshed run against
    `single`: elementwise under SAME_OPS, by relative L2 norm under NATIVE."""
    native = bounds is NATIVE
    for k, ((loss1, y1, g1, f1, _), (loss2, y2, g2, f2, _)) in enumerate(zip(single, split)):
        tag = f"step {k} ({against})"
        if native:
            _close(f"{tag} loss", loss2, loss1, bounds["loss"], 0)
            _close_norm(f"{tag} output", y2, y1, bounds["output"])
        else:
            _close(f"{tag} loss", loss2, loss1, *bounds["loss"])
            _close(f"{tag} output", y2, y1, *bounds["output"])
        for name, b, a in _leaves(g2, g1):
            if native:
                _close_norm(f"{tag} grad {name}", b, a, bounds["grad"])
            else:
                _close(f"{tag} grad {name}", b, a, *bounds["grad"])
        for name, b, a in _leaves(f2, f1):
            if not b.sharding.is_fully_replicated:
                sys.exit(f"FP8 metadata {name} is not replicated: {b.sharding}")
            _close(f"{tag} FP8 metadata {name}", b, a, bounds["meta"], 0)


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

    native = why_reference("gemm") == ""  # one device runs the custom calls
    with te.fp8_autocast(True, r):
        single_native = train(model, params, fp8, lambda a: a)[0] if native else None
        with _jnp_ops():
            single, _ = train(model, params, fp8, lambda a: a)

    if len(jax.devices()) < dp * tp:
        sys.exit(f"mesh {args.mesh} needs {dp * tp} devices; {len(jax.devices())} visible")
    devices = np.asarray(jax.devices()[:dp * tp]).reshape(dp, tp)
    mesh = Mesh(devices, ("dp", "tp"))
    resource = te.MeshResource(dp_resource="dp", tp_resource="tp")
    with mesh, tes.global_shard_guard(resource), te.fp8_autocast(True, r):
        rules = te_flax.extend_logical_axis_rules(())
        shardings = nn.logical_to_mesh_sharding(PARAM_AXES, mesh, rules)
        in_sharding = nn.logical_to_mesh_sharding(INPUT_AXES, mesh, rules)

        def place_state(p, f):
            return jax.device_put(p, shardings), jax.device_put(f, NamedSharding(mesh, P()))

        def place(a):
            return jax.device_put(a, in_sharding)

        split, hlo = train(model, *place_state(params, fp8), place)
        replayed = (train(model, params, fp8, place, place_state, starts=single_native)[0]
                    if native else None)

    wi = split[0][2]["LayerNormMLP_0"]["wi_kernel"]
    if tp > 1 and wi.sharding.shard_shape(wi.shape)[-1] != FFN // tp:
        sys.exit(f"wi_kernel's gradient is not split over tp: {wi.sharding}")
    _compare(split, single, "one device", SAME_OPS)
    if native:
        _compare(replayed, single_native, "one device's native step", NATIVE)
    if dp * tp > 1 and not any("all-reduce" in line and "maximum" in line.lower()
                               for line in _reductions(hlo)):
        sys.exit("the compiled step has no max all-reduce (amaxes not reduced across devices)")
    n_max = sum("maximum" in line.lower() for line in _reductions(hlo))
    also = ", each replayed step matches one device's native step" if native else ""
    print(f"mesh {args.mesh}: {STEPS} FP8 steps match one device{also} ({n_max} max all-reduces "
          f"in the step)")


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
