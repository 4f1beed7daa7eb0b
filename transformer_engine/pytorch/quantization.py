"""FP8 autocast: the global FP8 state, the step that batches the delayed-scaling updates, the
model-init contexts and NVIDIA TE's FP8GlobalStateManager view of them (the per-module recipe
state and the update arithmetic live in recipe_state.py).

Life of one training step with DelayedScaling:
  * entering the outermost `autocast` opens a step (`_Step`); every FP8 module forward in it
    registers its `RecipeState` there once and writes the amax of each tensor it casts into row 0
    of its amax history (the kernels do that on the device, no host sync);
  * leaving the outermost `autocast` reduces the forward amaxes of all registered modules over
    the group (one all-reduce for all of them) and updates every forward scale in one batched
    launch (`kernels.delayed_scaling_update`);
  * the backward passes run with the forward's recipe (saved in the autograd context, so they
    may run outside the context); when the last backward of the step finished, the backward
    amaxes are reduced and the backward scales updated the same way (over a group on a GPU,
    on a side stream beside the rest of that backward: update_stream.py).
  * a step whose backward is still to come when the context exits (the usual training step on
    the native core, with no amax reduction group) defers its forward update: the step's last
    backward runs both updates in one launch (on a small, host-bound step each launch costs more
    than its kernel). Nothing can observe the difference: the next outermost entry and every
    read of a forward scale or history (`RecipeState.scale_fwd`, ..., `state_dict`) run a
    deferred update first, and no kernel of the step's backward reads or writes forward state.
Float8CurrentScaling needs no history: each cast computes its amax first, then the scale.

A bad step (an amax that is NaN or infinite, e.g. an overflowed gradient) leaves the scaling
alone: the non-finite amax never enters the history and the tensor keeps the scale of its last
finite update, for both recipes (NVIDIA TE lets it into the history, where it freezes the scale
for up to amax_history_len steps). Each skip is counted on the device, in an int32 per tensor
(`RecipeState.skipped_updates()`, `module.fp8_skipped_updates()`); the warning, once per module
and recipe, comes when the counter is read or the state saved (`state_dict`), or right after the
update on CPU tensors, so no step waits for the device.
"""
from __future__ import annotations

import contextlib
import functools
from typing import List, Optional, Tuple

import torch

from ..common import fp8_formats
from ..common.recipe import DelayedScaling, Float8CurrentScaling, Recipe
from . import fp8_recompute, update_stream
from .module_parts import side_stream
from .recipe_state import (  # noqa: F401  (re-exported: quantization.X is where callers look)
    _DEFERRED, RecipeState, _flavor, _native_algo_code, _native_groups, _update_delayed,
    compute_current_scale, flush_deferred_updates, recipe_fp8_dtypes, recipe_state_for,
    scale_from_amax)
from .fp8_support import (  # noqa: F401  (re-exported: NV TE's names live here)
    check_fp8_block_scaling_support, check_fp8_support, check_mxfp8_support,
    check_nvfp4_support, is_fp8_available, is_fp8_block_scaling_available, is_mxfp8_available,
    is_nvfp4_available, require_fp8_support)

__all__ = ["autocast", "fp8_autocast", "fp8_model_init", "quantized_model_init", "is_fp8_available",
           "is_mxfp8_available", "is_nvfp4_available", "is_fp8_block_scaling_available",
           "check_fp8_support", "check_mxfp8_support", "check_nvfp4_support",
           "check_fp8_block_scaling_support", "check_recipe_support", "get_default_recipe",
           "get_default_fp8_recipe", "RecipeState", "FP8GlobalState", "FP8GlobalStateManager"]


def check_recipe_support(recipe: Recipe) -> None:
    """Raises when the recipe cannot run here (see _check_recipe)."""
    _check_recipe(recipe, "check_recipe_support")


def get_default_recipe() -> Recipe:
    """DelayedScaling with the HYBRID format; the torch dtypes (OCP or FNUZ) come from the device
    when a module first runs."""
    return DelayedScaling()


get_default_fp8_recipe = get_default_recipe


# ----- global state -----------------------------------------------------------------------------

class _Step:
    """The modules that ran FP8 forwards in one outermost autocast, and how many of their
    backwards are still to come."""

    __slots__ = ("recipe", "group", "states", "pending_backward", "exited", "bwd_done",
                 "fwd_deferred", "casts_done")

    def __init__(self, recipe, group):
        self.recipe, self.group = recipe, group
        self.states: List[RecipeState] = []
        self.pending_backward = 0
        self.exited = False
        self.bwd_done = False
        self.fwd_deferred = False
        # an event after the step's last forward cast (forward_casts_done), or None
        self.casts_done = None

    def backward_finished(self):
        if self.bwd_done:  # a native backward already finished the step (take_final_update)
            return
        self.pending_backward -= 1
        if self.pending_backward <= 0 and not self.bwd_done:
            self.bwd_done = True
            fwd = self._take_deferred()
            update = functools.partial(_update_delayed, self.states, self.recipe, self.group,
                                       forward=False, also_forward=fwd)
            if self.recipe.reduce_amax and self.group is not None and self.states:
                update_stream.beside_backward(update, self.states[0].device)
            else:
                update()
            self.release_if_done()

    def take_final_update(self):
        """For a backward about to finish the step on the native direct path: the step's
        remaining updates as (groups, algo code, margin) for that backward's native call to
        launch after its kernels (the step counts as finished), or None (not the last backward,
        or the update needs more than one plain launch: an amax reduction over a group, an
        algorithm without a native code, states on several devices)."""
        if self.pending_backward != 1 or self.bwd_done or not self.states:
            return None
        recipe = self.recipe
        if recipe.reduce_amax and self.group is not None:
            return None
        code = _native_algo_code(self.states, recipe)
        if code is None:
            return None
        self.pending_backward = 0
        self.bwd_done = True
        groups = _native_groups(self.states, False, self._take_deferred())
        self.release_if_done()
        return groups, code, float(recipe.margin)

    def defer_forward_update(self) -> bool:
        """At the context's exit: whether the forward update may wait for the last backward."""
        if self.pending_backward <= 0 or not self.states or not isinstance(self.recipe, DelayedScaling):
            return False
        if self.recipe.reduce_amax and self.group is not None:
            return False  # the collective stays at the exit, where every rank reaches it
        if not self.states[0].on_native():
            return False
        self.fwd_deferred = True
        _DEFERRED.append(self)
        return True

    def _take_deferred(self) -> bool:
        if not self.fwd_deferred:
            return False
        self.fwd_deferred = False
        _DEFERRED.remove(self)
        return True

    def release_if_done(self):
        """Drops the process group and the module states once both updates ran. Modules keep
        the finished step as a marker (RecipeState.step_id); a group held through it would
        outlive destroy_process_group and abort gloo at interpreter exit."""
        if self.exited and self.bwd_done:
            self.group = None
            self.states = []


class _FP8GlobalStateType:
    """The autocast context. One instance (FP8GlobalState) whose attributes are read on every
    module call; an instance rather than class attributes so torch.compile can trace the
    context's entry and exit (it records attribute writes on objects, not on classes)."""

    def __init__(self):
        self.enabled = False
        self.calibrating = False
        self.recipe: Optional[Recipe] = None
        self.group = None
        self.depth = 0
        self.step: Optional[_Step] = None
        self.model_init = False
        self.model_init_recipe: Optional[Recipe] = None
        self.model_init_keep_hp = False  # quantized_model_init(preserve_high_precision_init_val)
        # checkpoint support: modules record their forward scales and the recompute replays them
        self.recompute_phase = 0   # 0: none, 1: checkpointed forward (record), 2: recompute (replay)

    def is_fp8_enabled(self) -> bool:
        return self.enabled

    def is_first_fp8_module(self) -> bool:
        return self.depth > 0 and (self.step is None or not self.step.states)


FP8GlobalState = _FP8GlobalStateType()


def _check_recipe(recipe, who):
    if recipe is None:
        return get_default_recipe()
    if not isinstance(recipe, Recipe):
        raise TypeError(f"{who}: recipe must be a transformer_engine.common.recipe.Recipe, got "
                        f"{type(recipe).__name__}")
    if hasattr(recipe, "unsupported_reason"):
        raise NotImplementedError(f"{who}: {recipe.unsupported_reason()}")
    if recipe.float8_block_scaling():
        # Linear, LayerNormLinear and LayerNormMLP run it (module_parts/blockwise.py)
        recipe.__post_init__()
        return recipe
    if not isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        raise NotImplementedError(f"{who}: recipe {type(recipe).__name__} is not supported; expected "
                                  "DelayedScaling, Float8CurrentScaling or Float8BlockScaling")
    # fields may have been set on the object after construction: validate them again
    recipe.__post_init__()
    if isinstance(recipe, DelayedScaling) and recipe.scaling_factor_compute_algo is not None:
        raise NotImplementedError(f"{who}: DelayedScaling.scaling_factor_compute_algo is not supported")
    return recipe


class _AutocastContext(contextlib.ContextDecorator):
    """The autocast context: sets FP8GlobalState on entry, restores it on exit; the outermost
    one opens a step on entry and runs the step's forward update on exit. A class rather than a
    generator context manager: entered and left on every training step, and the generator
    protocol costs several times the work done here. Usable as a decorator (a fresh context per
    call)."""

    def __init__(self, enabled, calibrating, recipe, amax_reduction_group):
        self._args = (enabled, calibrating, recipe, amax_reduction_group)
        self._saved = []

    def _recreate_cm(self):
        return _AutocastContext(*self._args)

    def __enter__(self):
        enabled, calibrating, recipe, group = self._args
        if enabled or calibrating:
            recipe = _check_recipe(recipe, "autocast")
        s = FP8GlobalState
        outermost = s.depth == 0
        self._saved.append((s.enabled, s.calibrating, s.recipe, s.group, outermost))
        if outermost:
            if _DEFERRED:
                flush_deferred_updates()
            # only delayed scaling has a step to finish (its batched update); other recipes keep
            # no step (host time on every training step)
            # a recompute (checkpoint phase 2) belongs to the checkpointed forward's step, which
            # its modules deliver their backward to
            s.step = (_Step(recipe, group) if isinstance(recipe, DelayedScaling)
                      and s.recompute_phase != 2 else None)
        s.enabled, s.calibrating = bool(enabled), bool(calibrating)
        s.recipe, s.group = recipe, group
        s.depth += 1
        return None

    def __exit__(self, exc_type, exc, tb):
        s = FP8GlobalState
        s.depth -= 1
        s.enabled, s.calibrating, s.recipe, s.group, outermost = self._saved.pop()
        if outermost:
            # the forward's transposes made beside it are joined here, so that a graph capture
            # of the forward ends joined (module_parts/side_stream.py)
            side_stream.join()
        if outermost and s.step is not None:
            step, s.step = s.step, None
            step.exited = True
            if not step.defer_forward_update():
                update = functools.partial(_update_delayed, step.states, step.recipe, step.group,
                                           forward=True)
                if step.casts_done is not None and step.states:
                    update_stream.after_event(update, step.casts_done, step.states[0].device)
                else:
                    update()
            if step.pending_backward <= 0 and step.states and not step.bwd_done:
                step.bwd_done = True  # nothing will run backward (inference): no backward update
            step.release_if_done()
        return False


def _autocast_context(enabled, calibrating, recipe, amax_reduction_group):
    return _AutocastContext(enabled, calibrating, recipe, amax_reduction_group)


def autocast(enabled: bool = True, calibrating: bool = False, recipe: Optional[Recipe] = None,
             amax_reduction_group=None, _graph: bool = False):
    """Run Transformer Engine modules in FP8 inside the context.

    The modules called inside (:class:`Linear`, :class:`LayerNormLinear`, :class:`LayerNormMLP`
    and the attention and transformer layers built on them) cast their GEMM inputs to FP8 as the
    recipe says. Contexts nest; the inner one wins. With delayed scaling, the amax history and
    scale update of a step runs once, on the device, when the outermost context exits (after the
    backward pass when one follows). FP8 runs on NVIDIA sm_89 and newer (Ada, Hopper; OCP
    E4M3/E5M2), on AMD gfx942 (MI300, FNUZ formats) and gfx950 (OCP), and emulated on the reference
    backend (CPU or any device without the native library). On a GPU without FP8 (e.g. NVIDIA
    Ampere) entering
    a module raises NotImplementedError; see :func:`is_fp8_available`.

    Parameters
    ----------
    enabled : bool, default True
        Whether FP8 is used inside the context.
    calibrating : bool, default False
        With ``enabled=False``, record the amaxes of the tensors the modules would cast (to
        initialise FP8 scales from a high-precision run) while computing in high precision.
    recipe : DelayedScaling, Float8CurrentScaling or Float8BlockScaling, optional
        How tensors are scaled into FP8 (default :func:`get_default_recipe`: delayed scaling with
        the HYBRID format). The MXFP8 and NVFP4 recipes raise NotImplementedError here, as does
        DelayedScaling with a ``scaling_factor_compute_algo``.
    amax_reduction_group : torch.distributed.ProcessGroup, optional
        With delayed scaling and ``recipe.reduce_amax``, amaxes are reduced (maximum) over this
        group before the scales are updated, so that all ranks use the same scales.

    Examples
    --------
    >>> with te.autocast(enabled=True, recipe=recipe.DelayedScaling()):
    ...     out = model(inp)
    >>> out.sum().backward()
    """
    return _autocast_context(enabled, calibrating, recipe, amax_reduction_group)


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Optional[Recipe] = None,
                 fp8_group=None, _graph: bool = False):
    """Run Transformer Engine modules in FP8 inside the context.

    The modules called inside (:class:`Linear`, :class:`LayerNormLinear`, :class:`LayerNormMLP`
    and the attention and transformer layers built on them) cast their GEMM inputs to FP8 as the
    recipe says. Contexts nest; the inner one wins. With delayed scaling, the amax history and
    scale update of a step runs once, on the device, when the outermost context exits (after the
    backward pass when one follows). FP8 runs on NVIDIA sm_89 and newer (Ada, Hopper; OCP
    E4M3/E5M2), on AMD gfx942 (MI300, FNUZ formats) and gfx950 (OCP), and emulated on the reference
    backend (CPU or any device without the native library). On a GPU without FP8 (e.g. NVIDIA
    Ampere) entering
    a module raises NotImplementedError; see :func:`is_fp8_available`.

    This is the older name of :func:`autocast`, with the older argument names.

    Parameters
    ----------
    enabled : bool, default True
        Whether FP8 is used inside the context.
    calibrating : bool, default False
        With ``enabled=False``, record the amaxes of the tensors the modules would cast (to
        initialise FP8 scales from a high-precision run) while computing in high precision.
    fp8_recipe : DelayedScaling or Float8CurrentScaling, optional
        How tensors are scaled into FP8 (default :func:`get_default_recipe`: delayed scaling with
        the HYBRID format). The MXFP8, Float8BlockScaling and NVFP4 recipes raise
        NotImplementedError here, as does DelayedScaling with a ``scaling_factor_compute_algo``.
    fp8_group : torch.distributed.ProcessGroup, optional
        The amax reduction group (``amax_reduction_group`` of :func:`autocast`).
    """
    return _autocast_context(enabled, calibrating, fp8_recipe, fp8_group)


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                         preserve_high_precision_init_val: bool = False):
    """Create modules whose weights are stored only in FP8.

    Weights of :class:`Linear`, :class:`LayerNormLinear` and :class:`LayerNormMLP` created inside
    the context are :class:`Float8Tensor` parameters with no high-precision copy, which halves (or
    quarters) their memory. They are cast once at creation: under Float8CurrentScaling with their
    own amax; under DelayedScaling with the scale a module's delayed-scaling state starts from
    (1), as a module with high-precision weights casts them in its first FP8 step, so that the
    two give the same first step; the module's state then records the weight's amax and
    ``quantize_`` uses the module's scale. In-place updates (e.g. by the optimizer) requantise
    them with a fresh per-tensor scale. Works on every backend with FP8 support.

    Parameters
    ----------
    enabled : bool, default True
        Whether weights created inside are stored in FP8.
    recipe : DelayedScaling, Float8CurrentScaling or Float8BlockScaling, optional
        How tensors are scaled into FP8 (default :func:`get_default_recipe`: delayed scaling with
        the HYBRID format). Under Float8BlockScaling the weights are
        :class:`Float8BlockwiseQTensor` (128x128 tiles, kept row-wise and transposed) and the
        model runs under that recipe or outside FP8. The MXFP8 and NVFP4 recipes raise
        NotImplementedError here, as does DelayedScaling with a ``scaling_factor_compute_algo``.
    preserve_high_precision_init_val : bool, default False
        Also keep each FP8 weight's initial high-precision value, on the CPU:
        ``weight.get_high_precision_init_val()`` returns it and
        ``weight.clear_high_precision_init_val()`` frees it (e.g. once an optimizer's master
        weights were made from it).
    """
    s = FP8GlobalState
    checked = _check_recipe(recipe, "quantized_model_init") if enabled else None  # before any change
    saved = (s.model_init, s.model_init_recipe, s.model_init_keep_hp)
    s.model_init = bool(enabled)
    s.model_init_recipe = checked
    s.model_init_keep_hp = bool(enabled and preserve_high_precision_init_val)
    try:
        yield
    finally:
        s.model_init, s.model_init_recipe, s.model_init_keep_hp = saved


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False):
    """Create modules whose weights are stored only in FP8 (the older :func:`quantized_model_init`).

    Parameters
    ----------
    enabled : bool, default True
        Whether weights created inside are stored in FP8.
    recipe : DelayedScaling, Float8CurrentScaling or Float8BlockScaling, optional
        How tensors are scaled into FP8 (default :func:`get_default_recipe`: delayed scaling with
        the HYBRID format). The MXFP8 and NVFP4 recipes raise NotImplementedError here, as does
        DelayedScaling with a ``scaling_factor_compute_algo``.
    preserve_high_precision_init_val : bool, default False
        As for :func:`quantized_model_init`.
    """
    with quantized_model_init(enabled, recipe, preserve_high_precision_init_val):
        yield


def register_forward(state: RecipeState, expect_backward: bool = True) -> Optional[_Step]:
    """Called by a module's FP8/calibrating forward: joins the step's batched update (delayed
    scaling) and counts one backward to wait for. Returns the step for the backward."""
    step = FP8GlobalState.step
    if step is None or not state.delayed:
        return None
    if state.step_id is not step:
        state.step_id = step
        step.states.append(state)
    step.casts_done = None  # this forward's casts come after any marked so far
    if expect_backward:
        step.pending_backward += 1
    return step


def _reduces_on_gpu(step: Optional[_Step], device: torch.device) -> bool:
    """Whether the step reduces its amaxes over a group on a GPU, outside a traced graph: the
    steps whose updates may start after a last cast (forward_casts_done, backward_casts_done)."""
    return (step is not None and step.group is not None and step.recipe.reduce_amax
            and device.type == "cuda" and not torch.compiler.is_compiling())


def forward_casts_done(step: Optional[_Step], device: torch.device) -> None:
    """Called by a module's FP8 forward (`step`: its FP8CallInfo's) once it launched its last
    cast: when no other module's forward registers with the step before the autocast exits, the
    step's forward amax reduction and scale update start from that point, beside the module's
    last GEMM, instead of at the exit (update_stream.after_event). Only steps that reduce their
    amaxes over a group on a GPU take it."""
    if not (update_stream.forward_after_last_cast and _reduces_on_gpu(step, device)):
        return
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    step.casts_done = event


def backward_casts_done(step: Optional[_Step], device: torch.device) -> bool:
    """Called by a module's FP8 backward once it launched its last cast, before its GEMMs:
    counts the backward as finished for the step (`_Step.backward_finished`), so that the
    step's last backward starts the amax reduction and scale update from this point, beside its
    GEMMs, rather than after them, where the end of the step waited for it. Returns whether it
    counted (the caller then does not call backward_finished). Only steps that reduce their
    amaxes over a group on a GPU take it (update_stream.beside_backward)."""
    if not (update_stream.backward_after_last_cast and _reduces_on_gpu(step, device)):
        return False
    step.backward_finished()
    update_stream.runs["backward_after_cast"] += 1
    return True


# ----- NVIDIA TE's class-method view of the autocast state ---------------------------------------

class FP8GlobalStateManager:
    """Class methods over the process-wide FP8 state (no instances)."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        """Whether an enabled FP8 autocast is active.

        Returns
        -------
        bool
            True inside ``autocast(enabled=True)`` (or ``fp8_autocast``).
        """
        return FP8GlobalState.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        """Whether the active autocast calibrates: modules run in high precision while the
        amaxes of their FP8 tensors are recorded for later FP8 runs.

        Returns
        -------
        bool
            True inside ``autocast(calibrating=True)``.
        """
        return FP8GlobalState.calibrating

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        """Whether modules built now keep FP8-only weights (inside quantized_model_init)."""
        return FP8GlobalState.model_init

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        """Whether modules built now keep a high-precision copy of their FP8 weights' initial
        values (``quantized_model_init(preserve_high_precision_init_val=True)``), read back with
        ``Float8Tensor.get_high_precision_init_val``.

        Returns
        -------
        bool
            True inside such a ``quantized_model_init`` context.
        """
        return FP8GlobalState.model_init_keep_hp

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        """Whether FP8 is on while the current CUDA stream is being captured into a graph."""
        return (FP8GlobalState.enabled and torch.cuda.is_available()
                and torch.cuda.is_current_stream_capturing())

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True inside an autocast until the first FP8 module of its outermost context ran."""
        return FP8GlobalState.is_first_fp8_module()

    @classmethod
    def get_fp8_recipe(cls):
        """The recipe of the current autocast, else the default recipe."""
        s = FP8GlobalState
        return s.recipe if s.recipe is not None else get_default_recipe()

    @classmethod
    def get_fp8_group(cls):
        """The amax reduction group of the active autocast.

        Returns
        -------
        torch.distributed.ProcessGroup or None
            The group the delayed-scaling amaxes are reduced over; None outside an autocast or
            when the autocast was given no group (the default group is then used).
        """
        return FP8GlobalState.group

    @classmethod
    def get_autocast_state(cls) -> Tuple:
        """A snapshot of the process-wide autocast state, to restore later with
        :meth:`set_autocast_state` (activation recomputation does this).

        Returns
        -------
        tuple
            Opaque: whether FP8 is on, whether it calibrates, the recipe, the amax reduction
            group, the nesting depth, the pending delayed-scaling step and the recomputation
            phase. Only meant to be passed back to :meth:`set_autocast_state`.
        """
        s = FP8GlobalState
        return (s.enabled, s.calibrating, s.recipe, s.group, s.depth, s.step, s.recompute_phase)

    @classmethod
    def set_autocast_state(cls, state: Tuple) -> None:
        """Restores a snapshot taken by :meth:`get_autocast_state`.

        Parameters
        ----------
        state : tuple
            The value :meth:`get_autocast_state` returned, unchanged.
        """
        s = FP8GlobalState
        (s.enabled, s.calibrating, s.recipe, s.group, s.depth, s.step, s.recompute_phase) = state

    @classmethod
    def reset(cls) -> None:
        """Back to no autocast and no model-init context; pending updates are run first."""
        flush_deferred_updates()
        s = FP8GlobalState
        s.enabled = s.calibrating = False
        s.recipe = s.group = s.step = None
        s.depth = 0
        s.recompute_phase = 0
        s.model_init, s.model_init_recipe, s.model_init_keep_hp = False, None, False

    @staticmethod
    def copy_forward_fp8_meta_tensors_for_recompute(fp8_meta: dict) -> None:
        """Opens the record of a checkpointed forward's FP8 scales, which its recompute will
        replay (see ``fp8_recompute``); sets ``fp8_meta["global_fp8_buffer_pos_fwd_recompute"]``.
        A module calls it itself for each checkpointed forward under delayed scaling.

        Parameters
        ----------
        fp8_meta : dict
            A module's ``fp8_meta`` (TypeError for any other dict).
        """
        module = fp8_recompute.owner_of(
            fp8_meta, "FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute")
        fp8_meta[fp8_recompute.RECOMPUTE_POS_KEY] = fp8_recompute.open_record(module)

    @staticmethod
    def get_old_fp8_meta_tensors_for_recompute(fp8_meta: dict) -> None:
        """Makes the oldest stashed record of the module's forward scales the one its next
        (recomputing) call replays. A module calls it itself at the start of each recompute.

        Parameters
        ----------
        fp8_meta : dict
            A module's ``fp8_meta`` (TypeError for any other dict).
        """
        fp8_recompute.start_replay(fp8_recompute.owner_of(
            fp8_meta, "FP8GlobalStateManager.get_old_fp8_meta_tensors_for_recompute"))

    @staticmethod
    def restore_fp8_meta_tensors(fp8_meta: dict) -> None:
        """Ends a recompute's replay: the module's next call uses its current scales. (The
        replay never overwrites the module's scale tensors, so there is nothing to copy back.)

        Parameters
        ----------
        fp8_meta : dict
            A module's ``fp8_meta`` (TypeError for any other dict).
        """
        fp8_recompute.take_replay(fp8_recompute.owner_of(
            fp8_meta, "FP8GlobalStateManager.restore_fp8_meta_tensors"))

    @classmethod
    def is_fp8_available(cls) -> Tuple[bool, str]:
        """Whether the current GPU runs FP8 GEMMs natively (NVIDIA sm_89 and newer, AMD
        gfx942 and gfx950). CPU tensors always run FP8 on the emulated reference backend; see
        :func:`is_fp8_available` for a query about a given device.

        Returns
        -------
        tuple of (bool, str)
            The answer and, when it is False, the reason.
        """
        return check_fp8_support()

    @classmethod
    def is_mxfp8_available(cls) -> Tuple[bool, str]:
        """Whether the MXFP8 recipe can run: on no device of this library (it is not
        implemented), so the answer is always False with the reason.

        Returns
        -------
        tuple of (bool, str)
            ``(False, reason)``.
        """
        return check_mxfp8_support()

    @classmethod
    def is_fp8_block_scaling_available(cls) -> Tuple[bool, str]:
        """Whether the :class:`~transformer_engine.common.recipe.Float8BlockScaling` recipe can
        run here.

        Returns
        -------
        tuple of (bool, str)
            The answer and, when it is False, the reason.
        """
        return check_fp8_block_scaling_support()

    @classmethod
    def is_nvfp4_available(cls) -> Tuple[bool, str]:
        """Whether the NVFP4 recipe can run: on no device of this library (it is not
        implemented), so the answer is always False with the reason.

        Returns
        -------
        tuple of (bool, str)
            ``(False, reason)``.
        """
        return check_nvfp4_support()

    @staticmethod
    def get_fp8_torch_dtype(recipe, fprop_tensor: bool = True,
                            device: Optional[torch.device] = None) -> torch.dtype:
        """The torch FP8 dtype a recipe casts to on a device.

        Parameters
        ----------
        recipe : Recipe
            The recipe; its ``fp8_format`` names the forward and backward formats.
        fprop_tensor : bool, default True
            True for forward tensors (activations, weights), False for gradients.
        device : torch.device, optional
            The device whose FP8 flavour decides the dtype: ``torch.float8_e4m3fn`` /
            ``torch.float8_e5m2`` (OCP: NVIDIA, AMD gfx950, the CPU) or the ``fnuz`` dtypes
            (AMD gfx942). Default: the current GPU, else the CPU.

        Returns
        -------
        torch.dtype
        """
        return get_fp8_torch_dtype(recipe, fprop_tensor, device)


def get_fp8_torch_dtype(recipe, fprop_tensor: bool = True,
                        device: Optional[torch.device] = None) -> torch.dtype:
    """The torch FP8 dtype a recipe uses for forward (fprop_tensor) or backward tensors on a
    device (default: the current GPU, else OCP)."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    fmt = recipe.fp8_format.value
    return getattr(torch, fp8_formats.fp8_dtype_name(fmt.fwd if fprop_tensor else fmt.bwd,
                                                     _flavor(torch.device(device))))


def get_fp8_max(recipe, fprop_tensor: bool = True, device: Optional[torch.device] = None) -> float:
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    fmt = recipe.fp8_format.value
    return fp8_formats.fp8_max(fmt.fwd if fprop_tensor else fmt.bwd, _flavor(torch.device(device)))
