"""FP8 autocast for JAX: the recipe in force, the device's FP8 dtypes and maxima (never
hard-coded: OCP on NVIDIA and the reference backend, FNUZ on MI300), and the functional FP8
metadata of the dense-like ops.

Per dense-like op the Flax modules keep their FP8 state in the variable collection
FP8_COLLECTION, three values for (input, kernel, output gradient) each:
  * delayed scaling: `amax_history` [history_len, 3], `scale` [3] and `skipped_updates` [3];
  * current scaling: `scale` [3] (the last finite scale of each tensor) and `skipped_updates` [3].
The step is functional: the ops' custom VJPs return, as the "gradient" of those variables, their
updated values (this step's amaxes recorded, the history rolled and the scales recomputed on the
device by the delayed-scaling primitive). So after `grads = jax.grad(loss)(params, fp8_vars)`,
the new FP8 variables are the gradients of the FP8 collection: `fp8_vars = update_fp8_metas(grads)`.
A module applied more than once in one step receives the sum of its updates (not supported).
Current scaling casts each tensor with fp8_max / amax of its own values.

A step whose amax is NaN or infinite leaves the scaling alone, for both recipes: that amax never
enters the history and the tensor keeps the scale of its last finite step
(kernels.delayed_scaling_update, the custom call and the PyTorch frontend agree bit for bit). Each
such step adds one to the tensor's `skipped_updates` (float32, because it travels as a gradient;
exact up to 2**24), read with `transformer_engine.jax.fp8_skipped_updates`. Without state
(the functional ops called with no `fp8_meta` under current scaling) such a tensor is cast with
scale 1 and nothing is counted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Optional

import jax.numpy as jnp

from ..common import fp8_formats, recipe as recipe_mod
from ..common.capabilities import native_device_capability
from .kernels.cast import fp8_dtype as _fp8_dtype
from .sharding import MeshResource, autocast_mesh_resource, mesh_resource_in_force

FP8_COLLECTION = "fp8_metas"
NUM_META = 3  # input, kernel, output gradient
INPUT, KERNEL, GRAD = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class _AutocastState:
    enabled: bool = False
    recipe: Optional[recipe_mod.Recipe] = None
    mesh_resource: MeshResource = MeshResource()


_STATE = [_AutocastState()]


@functools.lru_cache(maxsize=None)
def _flavor() -> str:
    cap = native_device_capability()
    if cap.fp8_flavor is None:
        raise NotImplementedError(f"fp8_autocast: this device has no FP8 support ({cap.reason})")
    return cap.fp8_flavor


@contextlib.contextmanager
def fp8_autocast(enabled: bool = False, fp8_recipe: Optional[recipe_mod.Recipe] = None,
                 mesh_resource: Optional[MeshResource] = None):
    """FP8 for the Transformer Engine modules and functional ops traced inside the context.

    The state is read when a function is traced, so ``jax.jit`` the step inside the context.
    Under delayed scaling the modules keep their amax history and scales in the
    ``FP8_COLLECTION`` variable collection; after ``grads = jax.grad(loss)(params, fp8_vars)`` the
    updated values are the gradients of that collection (see :func:`update_fp8_metas`). FP8 runs
    through XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on the CPU
    (emulated, the same numerics).
    Entering with ``enabled=True`` on a GPU without FP8 raises NotImplementedError.

    Parameters
    ----------
    enabled : bool, default False
        Whether FP8 is used inside the context.
    fp8_recipe : DelayedScaling or Float8CurrentScaling, optional
        How tensors are scaled into FP8 (default ``DelayedScaling()`` when enabled). Other recipes
        raise NotImplementedError.
    mesh_resource : MeshResource, optional
        Which mesh axes carry data and tensor parallelism for the modules traced inside (default:
        none).
    """
    if fp8_recipe is None and enabled:
        fp8_recipe = recipe_mod.DelayedScaling()
    if enabled:
        if not isinstance(fp8_recipe, (recipe_mod.DelayedScaling, recipe_mod.Float8CurrentScaling)):
            raise NotImplementedError(f"fp8_autocast: recipe {type(fp8_recipe).__name__} is not "
                                      f"supported by the JAX frontend; use DelayedScaling or "
                                      f"Float8CurrentScaling")
        _flavor()
    if mesh_resource is not None and not isinstance(mesh_resource, MeshResource):
        raise TypeError(f"fp8_autocast: mesh_resource must be a MeshResource, got {mesh_resource!r}")
    _STATE.append(_AutocastState(bool(enabled), fp8_recipe if enabled else None,
                                 mesh_resource or MeshResource()))
    try:
        with autocast_mesh_resource(mesh_resource or MeshResource()):
            yield
    finally:
        _STATE.pop()


def autocast(enabled: bool = False, recipe: Optional[recipe_mod.Recipe] = None,
             mesh_resource: Optional[MeshResource] = None):
    """FP8 for the Transformer Engine modules and functional ops traced inside the context.

    The state is read when a function is traced, so ``jax.jit`` the step inside the context.
    Under delayed scaling the modules keep their amax history and scales in the
    ``FP8_COLLECTION`` variable collection; after ``grads = jax.grad(loss)(params, fp8_vars)`` the
    updated values are the gradients of that collection (see :func:`update_fp8_metas`). FP8 runs
    through XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on the CPU
    (emulated, the same numerics).
    Entering with ``enabled=True`` on a GPU without FP8 raises NotImplementedError.

    The newer name of :func:`fp8_autocast`, with the argument ``recipe``.

    Parameters
    ----------
    enabled : bool, default False
        Whether FP8 is used inside the context.
    recipe : DelayedScaling or Float8CurrentScaling, optional
        How tensors are scaled into FP8 (default ``DelayedScaling()`` when enabled). Other recipes
        raise NotImplementedError.
    mesh_resource : MeshResource, optional
        Which mesh axes carry data and tensor parallelism for the modules traced inside (default:
        none).
    """
    return fp8_autocast(enabled, recipe, mesh_resource)


def is_fp8_enabled() -> bool:
    """Whether FP8 is enabled by the innermost :func:`fp8_autocast` in force (at trace time)."""
    return _STATE[-1].enabled


def get_fp8_recipe() -> Optional[recipe_mod.Recipe]:
    """The recipe of the innermost :func:`fp8_autocast` in force, or None outside FP8."""
    return _STATE[-1].recipe


def get_mesh_resource() -> MeshResource:
    """The MeshResource of the innermost autocast that names one, else the one of
    :func:`~transformer_engine.jax.sharding.global_shard_guard`."""
    return mesh_resource_in_force()


@dataclasses.dataclass(frozen=True)
class FP8Config:
    """Static (hashable) description of how one op casts to FP8."""
    fwd_dtype: object
    bwd_dtype: object
    fwd_max: float
    bwd_max: float
    delayed: bool
    margin: float = 0.0
    amax_compute_algo: object = "max"
    power_2_scales: bool = False


def current_fp8_config() -> Optional[FP8Config]:
    """FP8Config of the autocast in force, None outside FP8."""
    state = _STATE[-1]
    if not state.enabled:
        return None
    r = state.recipe
    flavor = _flavor()
    fmt = r.fp8_format.value
    common = dict(fwd_dtype=_fp8_dtype(fmt.fwd, flavor), bwd_dtype=_fp8_dtype(fmt.bwd, flavor),
                  fwd_max=fp8_formats.fp8_max(fmt.fwd, flavor),
                  bwd_max=fp8_formats.fp8_max(fmt.bwd, flavor))
    if isinstance(r, recipe_mod.DelayedScaling):
        return FP8Config(delayed=True, margin=float(r.margin), amax_compute_algo=r.amax_compute_algo,
                         **common)
    return FP8Config(delayed=False, power_2_scales=r.use_power_2_scales, **common)


def init_fp8_meta(history_len: int):
    """(amax_history [L, 3], scale [3], skipped_updates [3]) initial values."""
    return (jnp.zeros((history_len, NUM_META), jnp.float32), jnp.ones((NUM_META,), jnp.float32),
            init_skipped_updates())


def init_skipped_updates():
    """The per-tensor count of scale updates skipped for a non-finite amax, initially zero.
    float32: the count is returned as the "gradient" of its variable (see the module docstring),
    and integer inputs of a custom VJP get no gradient."""
    return jnp.zeros((NUM_META,), jnp.float32)


def current_scale(x, fp8_max, power_2_scales=False, last_scale=None):
    """fp8_max / max|x| (1 where x is all zero), a power of two below it if asked. Where the amax
    is NaN or infinite: `last_scale` (the tensor's last finite scale), or 1 without one."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32))) if x.size else jnp.float32(0)
    s = jnp.float32(fp8_max) / amax
    s = jnp.where((amax > 0) & jnp.isfinite(s), s, jnp.float32(1))
    if power_2_scales:
        s = jnp.exp2(jnp.floor(jnp.log2(s)))
    if last_scale is None:
        return s
    return jnp.where(jnp.isfinite(amax), s, jnp.asarray(last_scale, jnp.float32))


def counted_skips(skipped, amaxes):
    """`skipped` [3] plus one for each of the step's amaxes [3] that is NaN or infinite (None
    stays None: no state, nothing counted)."""
    if skipped is None:
        return None
    return skipped + (~jnp.isfinite(amaxes)).astype(skipped.dtype)


def updated_fp8_meta(cfg: FP8Config, amax_history, scale, amaxes, skipped=None):
    """New (amax_history, scale, skipped) after a step whose (input, kernel, grad) amaxes are
    `amaxes` [3]: recorded in row 0, then the delayed-scaling update (on the device, batched per
    format), which leaves a tensor with a non-finite amax alone and counts it in `skipped`
    (None when the op keeps no count)."""
    from .primitives.cast import delayed_scaling_update
    hist = amax_history.at[0].set(amaxes.astype(jnp.float32))
    fwd_h, fwd_s, _ = delayed_scaling_update(hist[:, :GRAD], scale[:GRAD], cfg.fwd_max,
                                             cfg.amax_compute_algo, cfg.margin)
    bwd_h, bwd_s, _ = delayed_scaling_update(hist[:, GRAD:], scale[GRAD:], cfg.bwd_max,
                                             cfg.amax_compute_algo, cfg.margin)
    return (jnp.concatenate([fwd_h, bwd_h], axis=1), jnp.concatenate([fwd_s, bwd_s]),
            counted_skips(skipped, amaxes))


def update_fp8_metas(tree):
    """The FP8 variables to use in the next step.

    In this frontend the FP8 ops' custom gradients already carry the updated amax history and
    scales as the "gradients" of the ``FP8_COLLECTION`` variables, so the update is a selection
    of that collection.

    Parameters
    ----------
    tree : dict
        The gradients of a step with respect to the non-parameter variables (or the variables
        themselves).

    Returns
    -------
    dict
        ``{FP8_COLLECTION: ...}``, or ``{}`` when the tree holds no FP8 variables.
    """
    if isinstance(tree, dict) and FP8_COLLECTION in tree:
        return {FP8_COLLECTION: tree[FP8_COLLECTION]}
    return {}
