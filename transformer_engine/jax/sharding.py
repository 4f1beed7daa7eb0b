"""MeshResource: which mesh axes carry data parallelism (dp), tensor parallelism (tp) and the
rest of NVIDIA TE's axis names, for the modules' sharding annotations. Set through
fp8_autocast(mesh_resource=...) / autocast(...), read by the modules at trace time."""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
from jax.sharding import PartitionSpec


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """Which axes of the device mesh carry which kind of parallelism.

    Pass it to :func:`fp8_autocast` (``mesh_resource``); the modules read it at trace time and
    add sharding constraints accordingly. A ``None`` axis means that kind of parallelism is not
    used.

    Parameters
    ----------
    dp_resource : str, optional
        Mesh axis of data parallelism (the batch dimension of activations).
    tp_resource : str, optional
        Mesh axis of tensor parallelism (kernels split by columns or rows).
    tpsp_resource : str, optional
        Mesh axis of tensor plus sequence parallelism.
    fsdp_resource : str, optional
        Mesh axis over which parameters are sharded (fully sharded data parallelism).
    pp_resource : str, optional
        Mesh axis of pipeline parallelism (recorded; pipelining is up to the caller).
    cp_resource : str, optional
        Mesh axis of context parallelism (recorded; not used by the attention yet).
    """
    dp_resource: Optional[str] = None
    tp_resource: Optional[str] = None
    tpsp_resource: Optional[str] = None
    fsdp_resource: Optional[str] = None
    pp_resource: Optional[str] = None
    cp_resource: Optional[str] = None


def _current_mesh():
    mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    mesh = mesh() if mesh is not None else None
    if mesh is not None and not getattr(mesh, "empty", True):
        return mesh
    from jax._src import mesh as mesh_lib  # the physical mesh of a `with mesh:` block
    phys = mesh_lib.thread_resources.env.physical_mesh
    return None if phys.empty else phys


def with_sharding_constraint(x, *axes):
    """x constrained to PartitionSpec(*axes) on the current mesh; a no-op without a mesh or when
    every axis is None (single device, or MeshResource not set)."""
    if all(a is None for a in axes):
        return x
    mesh = _current_mesh()
    if mesh is None:
        return x
    names = set(mesh.axis_names)
    spec = PartitionSpec(*(a if a in names else None for a in axes))
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec)
                                            if isinstance(mesh, jax.sharding.Mesh) else spec)
