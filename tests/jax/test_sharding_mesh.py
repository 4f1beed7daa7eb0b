"""JAX sharding: the logical axis rules of transformer_engine.jax.sharding, global_shard_guard,
and the Flax modules under a 2x2 (dp x tp) mesh of four CPU devices matching one device in FP8
(mesh_cases.py, in a subprocess: the device count must be set before jax starts, and the rest
of the suite keeps its single device)."""
import os
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import transformer_engine.jax as te  # noqa: E402
import transformer_engine.jax.flax as te_flax  # noqa: E402
from transformer_engine.jax import sharding as tes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_logical_axis_rules_follow_the_mesh_resource():
    with tes.global_shard_guard(te.MeshResource(dp_resource="data", tp_resource="model")):
        rules = dict(tes.logical_axis_rules())
        assert rules[tes.BATCH_AXES] == "data" and rules[tes.W_TP_AXES] == "model"
        assert rules[tes.HIDDEN_TP_AXES] == "model" and rules[tes.HEAD_AXES] == "model"
        assert rules[tes.SEQLEN_TP_AXES] == "model" and rules[tes.HIDDEN_AXES] is None
        # an autocast that names its own resource wins over the guard
        with te.fp8_autocast(False, mesh_resource=te.MeshResource(dp_resource="d2", fsdp_resource="f")):
            inner = dict(tes.logical_axis_rules())
        assert inner[tes.BATCH_AXES] == ("d2", "f") and inner[tes.W_FSDP_AXES] == "f"
        assert inner[tes.W_TP_AXES] is None
        extended = te_flax.extend_logical_axis_rules([("my_batch", "data")])
        assert extended[0] == ("my_batch", "data") and (tes.W_TP_AXES, "model") in extended
    assert tes.global_mesh_resource() == te.MeshResource()


def test_logical_axis_rules_refuse_bad_input():
    with pytest.raises(TypeError, match="global_shard_guard: resource"):
        with tes.global_shard_guard({"dp_resource": "dp"}):
            pass
    with pytest.raises(ValueError, match="extend_logical_axis_rules: logical axis 'nvte_batch'"):
        te_flax.extend_logical_axis_rules([(tes.BATCH_AXES, "dp")])
    with pytest.raises(ValueError, match="extend_logical_axis_rules: each rule"):
        te_flax.extend_logical_axis_rules([("a", "b", "c")])


def test_flax_modules_on_a_dp_tp_mesh_match_one_device_in_fp8():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-W", "ignore", os.path.join(HERE, "mesh_cases.py"),
                           "--mesh", "2x2"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "match one device" in proc.stdout


def test_custom_calls_step_aside_under_a_multi_device_mesh(monkeypatch):
    """The custom calls have no partitioning rule, so under a mesh of several devices the jnp
    ops run (XLA partitions them and reduces the amaxes across devices); a one-device mesh or
    none keeps them."""
    import numpy as np
    from jax.sharding import Mesh
    from transformer_engine.jax.primitives import registry
    assert tes.mesh_device_count() == 0
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    set_mesh = getattr(jax, "set_mesh", None)  # `with mesh:` is deprecated where this exists
    with (set_mesh(mesh) if set_mesh is not None else mesh):
        assert tes.mesh_device_count() == 1
    monkeypatch.setattr(registry.jax, "default_backend", lambda: "gpu")

    class TwoByTwo:
        shape = {"dp": 2, "tp": 2}
    monkeypatch.setattr(tes, "_current_mesh", lambda: TwoByTwo())
    assert tes.mesh_device_count() == 4
    why = registry.why_reference("gemm")
    assert "mesh of 4 devices" in why and not registry.use_custom_call("gemm")
    monkeypatch.setattr(tes, "_current_mesh", lambda: None)
    assert "mesh" not in registry.why_reference("gemm")
