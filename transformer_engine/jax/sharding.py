"""MeshResource: which mesh axes carry data parallelism (dp), tensor parallelism (tp) and the
rest of NVIDIA TE's axis names, for the modules' sharding annotations. Set through
fp8_autocast(mesh_resource=...) / autocast(...) or global_shard_guard(...), read by the modules
at trace time.

Logical axis names (NVIDIA TE's ``transformer_engine.jax.sharding`` constants) name the role of
an array dimension; :func:`logical_axis_rules` maps each to the mesh axis the MeshResource in
force gives that role, in the (logical, mesh) pair form of ``flax.linen.logical_axis_rules``.

Under ``jax.jit`` over a mesh the program keeps its single-device meaning: an amax is the maximum
over the whole (global) tensor, so XLA reduces it over every mesh axis the tensor is split on,
and FP8 metadata, computed from those amaxes, is the same replicated value on every device.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional, Sequence, Tuple

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


def mesh_device_count() -> int:
    """Devices of the mesh in force (`with mesh:`, jax.set_mesh or jax.sharding.use_mesh), 0
    when none is."""
    mesh = _current_mesh()
    if mesh is None:
        return 0
    count = 1
    for size in dict(mesh.shape).values():
        count *= int(size)
    return count


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


# Logical axis names of activations and weights (NVIDIA TE's spelling)
BATCH_AXES = "nvte_batch"
SEQLEN_AXES = "nvte_seqlen"
SEQLEN_TP_AXES = "nvte_seqlen_tp"
HEAD_AXES = "nvte_head"
HIDDEN_AXES = "nvte_hidden"
HIDDEN_TP_AXES = "nvte_hidden_tp"
JOINED_AXES = "nvte_joined"
W_NO_SHARD_AXES = "nvte_w_no_shard"
W_FSDP_AXES = "nvte_w_fsdp"
W_TP_AXES = "nvte_w_tp"
W_JOINED_AXES = "nvte_w_joined"

_GLOBAL_RESOURCE = [MeshResource()]
# pushed by fp8_autocast / autocast for their block (transformer_engine.jax.fp8)
_AUTOCAST_RESOURCE = [MeshResource()]


@contextlib.contextmanager
def autocast_mesh_resource(resource: MeshResource):
    """The MeshResource an fp8_autocast names, in force for its block (internal)."""
    _AUTOCAST_RESOURCE.append(resource)
    try:
        yield
    finally:
        _AUTOCAST_RESOURCE.pop()


def mesh_resource_in_force() -> MeshResource:
    """The innermost autocast's MeshResource when it names any axis, else the guard's."""
    own = _AUTOCAST_RESOURCE[-1]
    return own if own != MeshResource() else _GLOBAL_RESOURCE[-1]


@contextlib.contextmanager
def global_shard_guard(resource: MeshResource):
    """The MeshResource the modules use inside the block when no ``fp8_autocast`` /
    ``autocast`` in force names one.

    Parameters
    ----------
    resource : MeshResource
        Which mesh axes carry data and tensor parallelism.
    """
    if not isinstance(resource, MeshResource):
        raise TypeError(f"global_shard_guard: resource must be a MeshResource, got {resource!r}")
    _GLOBAL_RESOURCE.append(resource)
    try:
        yield
    finally:
        _GLOBAL_RESOURCE.pop()


def global_mesh_resource() -> MeshResource:
    """The MeshResource of the innermost :func:`global_shard_guard` (all axes None outside)."""
    return _GLOBAL_RESOURCE[-1]


def logical_axis_rules(resource: Optional[MeshResource] = None) -> Tuple[Tuple[str, object], ...]:
    """(logical axis, mesh axis or None) pairs for the logical axis names above.

    Batch dimensions go to the data-parallel axis (and the FSDP axis, when set), heads, hidden
    dimensions marked ``_tp`` and tensor-parallel weight dimensions to the tensor-parallel axis,
    the sequence marked ``_tp`` to the sequence-parallel axis (``tpsp_resource``, else
    ``tp_resource``); the rest stays whole.

    Parameters
    ----------
    resource : MeshResource, optional
        Default: the one in force (``fp8_autocast``'s, else :func:`global_mesh_resource`).
    """
    if resource is None:
        resource = mesh_resource_in_force()
    batch = tuple(a for a in (resource.dp_resource, resource.fsdp_resource) if a is not None)
    batch_axis = batch[0] if len(batch) == 1 else (batch or None)
    tp = resource.tp_resource
    return ((BATCH_AXES, batch_axis), (SEQLEN_AXES, None),
            (SEQLEN_TP_AXES, resource.tpsp_resource or tp), (HEAD_AXES, tp), (HIDDEN_AXES, None),
            (HIDDEN_TP_AXES, tp), (JOINED_AXES, None), (W_NO_SHARD_AXES, None),
            (W_FSDP_AXES, resource.fsdp_resource), (W_TP_AXES, tp), (W_JOINED_AXES, None))


def extend_logical_axis_rules(rules: Sequence[Tuple[str, object]]) -> Tuple[Tuple[str, object], ...]:
    """``rules`` followed by :func:`logical_axis_rules` of the MeshResource in force, for
    ``flax.linen.logical_axis_rules`` / ``logical_to_mesh_sharding``.

    Parameters
    ----------
    rules : sequence of (str, str or None)
        The caller's own (logical axis, mesh axis) pairs; a logical name given there may not be
        one of this library's.
    """
    rules = tuple(tuple(r) for r in rules)
    ours = logical_axis_rules()
    names = {name for name, _ in ours}
    for r in rules:
        if len(r) != 2 or not isinstance(r[0], str):
            raise ValueError(f"extend_logical_axis_rules: each rule must be a (logical axis name, "
                             f"mesh axis) pair, got {r!r}")
        if r[0] in names:
            raise ValueError(f"extend_logical_axis_rules: logical axis {r[0]!r} is one of "
                             f"Transformer Engine's; its mesh axis comes from the MeshResource")
    return rules + ours
