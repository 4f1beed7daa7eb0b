"""FP8 autocast: the global FP8 state, the per-module recipe state (scales, amax history) and the
batched delayed-scaling update.

Life of one training step with DelayedScaling:
  * entering the outermost `autocast` opens a step (`_Step`); every FP8 module forward in it
    registers its `RecipeState` there once and writes the amax of each tensor it casts into row 0
    of its amax history (the kernels do that on the device, no host sync);
  * leaving the outermost `autocast` reduces the forward amaxes of all registered modules over
    the group (one all-reduce for all of them) and updates every forward scale in one batched
    launch (`kernels.delayed_scaling_update`);
  * the backward passes run with the forward's recipe (saved in the autograd context, so they
    may run outside the context); when the last backward of the step finished, the backward
    amaxes are reduced and the backward scales updated the same way.
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
import warnings
from typing import List, Optional, Tuple

import torch

from ..common import fp8_formats
from ..common.recipe import DelayedScaling, Float8CurrentScaling, Format, Recipe
from . import fp8_recompute, native
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
                 "fwd_deferred")

    def __init__(self, recipe, group):
        self.recipe, self.group = recipe, group
        self.states: List[RecipeState] = []
        self.pending_backward = 0
        self.exited = False
        self.bwd_done = False
        self.fwd_deferred = False

    def backward_finished(self):
        if self.bwd_done:  # a native backward already finished the step (take_final_update)
            return
        self.pending_backward -= 1
        if self.pending_backward <= 0 and not self.bwd_done:
            self.bwd_done = True
            fwd = self._take_deferred()
            _update_delayed(self.states, self.recipe, self.group, forward=False, also_forward=fwd)
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
        if outermost and s.step is not None:
            step, s.step = s.step, None
            step.exited = True
            if not step.defer_forward_update():
                _update_delayed(step.states, step.recipe, step.group, forward=True)
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


# ----- per-module recipe state ------------------------------------------------------------------

_FLAVOR_BY_DEVICE: dict = {}


def _flavor(device: torch.device) -> str:
    """FP8 encoding of a device, cached (modules fill the cache eagerly when they are built,
    so a compiled region only reads it)."""
    if device.type != "cuda":
        return fp8_formats.OCP
    key = device.index if device.index is not None else torch.cuda.current_device()
    flavor = _FLAVOR_BY_DEVICE.get(key)
    if flavor is None:
        flavor = _FLAVOR_BY_DEVICE[key] = native.capability(device).fp8_flavor or fp8_formats.OCP
    return flavor


def recipe_fp8_dtypes(recipe, device: torch.device) -> tuple:
    """(forward, backward) torch FP8 dtypes of a recipe's format in the device's encoding."""
    flavor = _flavor(device)
    fmt = recipe.fp8_format.value
    return (getattr(torch, fp8_formats.fp8_dtype_name(fmt.fwd, flavor)),
            getattr(torch, fp8_formats.fp8_dtype_name(fmt.bwd, flavor)))


def _recipe_key(recipe) -> tuple:
    if isinstance(recipe, DelayedScaling):
        return ("delayed", recipe.fp8_format, recipe.amax_history_len)
    return ("current", recipe.fp8_format, recipe.use_power_2_scales)


class RecipeState:
    """FP8 metadata of one module for one recipe on one device.

    Slots are numbered per direction (forward: inputs and weights of the GEMMs; backward:
    gradients). `scale[i]`/`amax[i]` are 1-element views made once, so a module call creates no
    tensors for its scales. DelayedScaling: amax[i] is row 0 of the history (the kernels max
    into it) and scale[i] the scale from the last update. Float8CurrentScaling: scratch values
    recomputed before each cast."""

    def __init__(self, recipe: Recipe, device: torch.device, n_fwd: int, n_bwd: int,
                 allocate: bool = True):
        self.recipe, self.key, self.device = recipe, _recipe_key(recipe), device
        self.delayed = isinstance(recipe, DelayedScaling)
        flavor = _flavor(device)
        fmt: Format = recipe.fp8_format
        self.fwd_dtype = getattr(torch, fp8_formats.fp8_dtype_name(fmt.value.fwd, flavor))
        self.bwd_dtype = getattr(torch, fp8_formats.fp8_dtype_name(fmt.value.bwd, flavor))
        self.fwd_max = fp8_formats.fp8_max(fmt.value.fwd, flavor)
        self.bwd_max = fp8_formats.fp8_max(fmt.value.bwd, flavor)
        self.step_id = None
        self.owner = "an FP8 module"  # the module's class name, set by the module (for warnings)
        self._warned_skips = 0
        self._ptrs = None
        self._on_native = None
        self.eager_call_info = None  # module/base.py: fp8_call_info's answer for plain FP8 calls
        # kernels/linear_step.py: the native plans of the fused Linear step made on this state's
        # pointers, by problem
        self.step_plans = {}
        self._update_descs = None
        if not allocate:  # formats only (a traced current-scaling call)
            return
        hist_len = recipe.amax_history_len if self.delayed else 1
        f32 = dict(dtype=torch.float32, device=device)
        self._amax_history_fwd = torch.zeros(hist_len, n_fwd, **f32)
        self.amax_history_bwd = torch.zeros(hist_len, n_bwd, **f32)
        self._scale_fwd = torch.ones(n_fwd, **f32)
        self.scale_bwd = torch.ones(n_bwd, **f32)
        self._scale_inv_fwd = torch.ones(n_fwd, **f32)
        self.scale_inv_bwd = torch.ones(n_bwd, **f32)
        # current scaling: one int32 per direction that nvte_current_scaling_scales counts its
        # blocks in (zero between launches)
        self.counters = torch.zeros(2, dtype=torch.int32, device=device)
        # updates skipped for a non-finite amax, per tensor (see the module docstring)
        self._skipped_fwd = torch.zeros(n_fwd, dtype=torch.int32, device=device)
        self.skipped_bwd = torch.zeros(n_bwd, dtype=torch.int32, device=device)
        self.max_fwd_t = torch.full((1,), self.fwd_max, **f32)
        self.max_bwd_t = torch.full((1,), self.bwd_max, **f32)
        self._make_views()

    def __getstate__(self):
        # copies (deepcopy of a module, pickling) get their own tensors: cached raw pointers
        # and descriptors would still address the original's
        state = self.__dict__.copy()
        state["_ptrs"] = state["_update_descs"] = state["_on_native"] = None
        state["step_plans"] = {}
        return state

    # The forward scales and history as read from outside: a deferred forward update of the last
    # step runs first (see the module docstring). The module's own kernels use the pointers and
    # views below, in stream order after that update.
    @property
    def amax_history_fwd(self) -> torch.Tensor:
        if _DEFERRED:
            flush_deferred_updates()
        return self._amax_history_fwd

    @property
    def scale_fwd(self) -> torch.Tensor:
        if _DEFERRED:
            flush_deferred_updates()
        return self._scale_fwd

    @property
    def scale_inv_fwd(self) -> torch.Tensor:
        if _DEFERRED:
            flush_deferred_updates()
        return self._scale_inv_fwd

    def __setstate__(self, state):
        # a state pickled before the forward tensors became properties
        for name in ("amax_history_fwd", "scale_fwd", "scale_inv_fwd"):
            if name in state:
                state["_" + name] = state.pop(name)
        if "counters" not in state and "_scale_fwd" in state:
            state["counters"] = torch.zeros(2, dtype=torch.int32, device=state["_scale_fwd"].device)
        if "_skipped_fwd" not in state and "_scale_fwd" in state:
            dev = state["_scale_fwd"].device
            state["_skipped_fwd"] = torch.zeros(state["_scale_fwd"].numel(), dtype=torch.int32, device=dev)
            state["skipped_bwd"] = torch.zeros(state["scale_bwd"].numel(), dtype=torch.int32, device=dev)
        state.setdefault("owner", "an FP8 module")
        state.setdefault("step_plans", {})
        state.setdefault("_warned_skips", 0)
        self.__dict__.update(state)

    def _pointers(self):
        # made on first eager use, kept (kernels.scaling.state_pointers says what they are)
        if self._ptrs is None:
            from .kernels.scaling import state_pointers
            self._ptrs = state_pointers(self.scaling_groups(), self.counters)
        return self._ptrs

    def update_desc(self, forward: bool):
        """This state's group for the native batched update, or None when it has no tensors."""
        descs = self._update_descs
        if descs is None:
            from .kernels.scaling import update_descriptors
            descs = self._update_descs = update_descriptors(self.scaling_groups())
        return descs[0 if forward else 1]

    def scaling_groups(self):
        """(history, scale, scale_inv, fp8_max, skipped) of the forward and the backward, the
        tensors themselves (no pending update is run first: for their addresses and for the
        update itself)."""
        return ((self._amax_history_fwd, self._scale_fwd, self._scale_inv_fwd, self.fwd_max,
                 self._skipped_fwd),
                (self.amax_history_bwd, self.scale_bwd, self.scale_inv_bwd, self.bwd_max,
                 self.skipped_bwd))

    # -- updates skipped for a non-finite amax
    def skipped_updates(self) -> int:
        """How many scale updates of this state's tensors were skipped because the amax was NaN
        or infinite. Reading it waits for the device; it also warns (once) when not zero."""
        if _DEFERRED:
            flush_deferred_updates()
        total = int(self._skipped_fwd.sum().item() + self.skipped_bwd.sum().item())
        self._warn_skipped(total)
        return total

    def _warn_skipped(self, total: int) -> None:
        if total > 0 and self._warned_skips == 0:
            self._warned_skips = total
            warnings.warn(
                f"{self.owner}: {total} FP8 scale update(s) with {type(self.recipe).__name__} were "
                f"skipped because an amax was NaN or infinite (a step with non-finite values); the "
                f"affected tensors keep the scale of their last finite update", RuntimeWarning,
                stacklevel=3)

    def warn_if_skipped_on_cpu(self) -> None:
        """After an update on CPU tensors, where reading the counter costs no device wait."""
        if self.device.type == "cpu" and self._warned_skips == 0:
            self._warn_skipped(int(self._skipped_fwd.sum() + self.skipped_bwd.sum()))

    @property
    def ptrs_fwd(self):
        """The forward's (history, scale, scale_inv, fp8_max, counter, skipped) as raw pointers
        (fp8_max a float) for the native calls of the eager path."""
        return (self._ptrs or self._pointers())[0]

    @property
    def ptrs_bwd(self):
        """The backward's (history, scale, scale_inv, fp8_max, counter, skipped), as ptrs_fwd."""
        return (self._ptrs or self._pointers())[1]

    @property
    def native(self) -> bool:
        return native.use_native(self._scale_fwd)

    def on_native(self) -> bool:
        """`native`, asked once (the state's tensors never change device)."""
        flag = self._on_native
        if flag is None:
            flag = self._on_native = self.native
        return flag

    def _make_views(self):
        self.fwd_scale = [self._scale_fwd[i:i + 1] for i in range(self._scale_fwd.numel())]
        self.bwd_scale = [self.scale_bwd[i:i + 1] for i in range(self.scale_bwd.numel())]
        self.fwd_amax = [self._amax_history_fwd[0, i:i + 1] for i in range(self._scale_fwd.numel())]
        self.bwd_amax = [self.amax_history_bwd[0, i:i + 1] for i in range(self.scale_bwd.numel())]

    # -- current scaling: amax, then scale, on the device
    def current_scale(self, x: torch.Tensor, forward: bool, i: int, amax_group=None) -> torch.Tensor:
        """The scale of x now (amax_group: x is one rank's part of a tensor split over that
        process group, and the scale is the whole tensor's)."""
        amax = (self.fwd_amax if forward else self.bwd_amax)[i]
        scale = (self.fwd_scale if forward else self.bwd_scale)[i]
        scale_inv = (self._scale_inv_fwd if forward else self.scale_inv_bwd)[i:i + 1]
        skipped = (self._skipped_fwd if forward else self.skipped_bwd)[i:i + 1]
        compute_current_scale(x, amax, scale, scale_inv, self.fwd_max if forward else self.bwd_max,
                              self.recipe.use_power_2_scales, skipped, amax_group)
        if x.device.type == "cpu":
            self.warn_if_skipped_on_cpu()
        return scale

    # -- checkpoint I/O
    def to_dict(self) -> dict:
        if self._warned_skips == 0:
            self.skipped_updates()  # saving is a natural point to wait for the device and warn
        return {"recipe": self.key[0], "amax_history_fwd": self.amax_history_fwd.clone(),
                "amax_history_bwd": self.amax_history_bwd.clone(),
                "scale_fwd": self.scale_fwd.clone(), "scale_bwd": self.scale_bwd.clone(),
                "scale_inv_fwd": self.scale_inv_fwd.clone(), "scale_inv_bwd": self.scale_inv_bwd.clone(),
                "skipped_updates_fwd": self._skipped_fwd.clone(),
                "skipped_updates_bwd": self.skipped_bwd.clone()}

    def load_dict(self, d: dict) -> None:
        if _DEFERRED:
            flush_deferred_updates()  # an update still to come would overwrite what is loaded
        for name in ("scale_fwd", "scale_bwd", "scale_inv_fwd", "scale_inv_bwd"):
            if name in d and d[name].shape == getattr(self, name).shape:
                getattr(self, name).copy_(d[name])
        for name, dst in (("skipped_updates_fwd", self._skipped_fwd),
                          ("skipped_updates_bwd", self.skipped_bwd)):
            if name in d and d[name].shape == dst.shape:
                dst.copy_(d[name])
        for name in ("amax_history_fwd", "amax_history_bwd"):
            if name in d:
                src, dst = d[name], getattr(self, name)
                rows = min(src.shape[0], dst.shape[0])
                if src.shape[1] == dst.shape[1]:
                    dst.zero_()
                    dst[:rows].copy_(src[:rows])


def compute_current_scale(x: torch.Tensor, amax: torch.Tensor, scale: torch.Tensor,
                          scale_inv: torch.Tensor, fp8_max: float, power_2: bool,
                          skipped: Optional[torch.Tensor] = None, amax_group=None) -> None:
    """scale <- fp8_max / amax(x), on the device. `amax` is zero on entry and left zero. A
    non-finite amax keeps the scale as it was (the last finite one) and adds one to `skipped`
    (int32 [1], optional), as the delayed-scaling update does. With `amax_group` (a process
    group), x is this rank's part of a tensor split over the group: the amax is all-reduced
    (MAX) over it on the device before the scale is made, so every rank gets the same scale,
    that of the whole tensor, with no host synchronisation.

    Every path computes it the same way on a device, so eager, fast-path and compiled runs cast
    with the same bits: on the native core the amax kernel, then the delayed-scaling update
    kernel with a one-row history (which divides, and clears the row); elsewhere (and for
    power-of-2 scales) torch ops."""
    from . import kernels
    kernels.compute_amax(x, amax)
    if amax_group is not None:
        import torch.distributed as dist
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=amax_group)
    if not power_2 and native.use_native(x):
        group = (amax.view(1, 1), scale.view(1), scale_inv.view(1), fp8_max)
        kernels.delayed_scaling_update([group + ((skipped.view(1),) if skipped is not None else ())],
                                       "most_recent", 0.0)
        return
    finite = torch.isfinite(amax)
    scale.copy_(torch.where(finite, scale_from_amax(amax, torch.full_like(amax, fp8_max), power_2),
                            scale))
    if skipped is not None:
        skipped.add_((~finite).to(skipped.dtype))
    amax.zero_()


def scale_from_amax(amax: torch.Tensor, fp8_max_t: torch.Tensor, power_2: bool) -> torch.Tensor:
    """fp8_max / amax, or 1 where amax is 0 or not finite; rounded down to a power of two when
    asked. Division of tensors (not scalar / tensor: torch turns that into a reciprocal)."""
    scale = fp8_max_t / amax
    ok = (amax > 0) & torch.isfinite(scale)
    scale = torch.where(ok, scale, torch.ones_like(scale))
    if power_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def recipe_state_for(module_state: Optional[RecipeState], recipe: Recipe, device: torch.device,
                     n_fwd: int, n_bwd: int) -> RecipeState:
    """The module's state for this recipe: reused when only the recipe object changed (a new
    DelayedScaling() each step keeps its history), rebuilt when its kind or device changed."""
    if module_state is not None and module_state.device == device:
        if module_state.recipe is recipe:
            return module_state
        if module_state.key == _recipe_key(recipe):
            module_state.recipe = recipe
            return module_state
    return RecipeState(recipe, device, n_fwd, n_bwd)


def register_forward(state: RecipeState, expect_backward: bool = True) -> Optional[_Step]:
    """Called by a module's FP8/calibrating forward: joins the step's batched update (delayed
    scaling) and counts one backward to wait for. Returns the step for the backward."""
    step = FP8GlobalState.step
    if step is None or not state.delayed:
        return None
    if state.step_id is not step:
        state.step_id = step
        step.states.append(state)
    if expect_backward:
        step.pending_backward += 1
    return step


# ----- the batched update -----------------------------------------------------------------------

def _reduce_amax(histories: List[torch.Tensor], group) -> None:
    """All-reduce (MAX) row 0 of every history in one collective."""
    import torch.distributed as dist
    if group is None or not dist.is_available() or not dist.is_initialized():
        return
    if dist.get_world_size(group) == 1:
        return
    flat = torch.cat([h[0] for h in histories])
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    offset = 0
    for h in histories:
        n = h.shape[1]
        h[0].copy_(flat[offset:offset + n])
        offset += n


def _native_algo_code(states: List[RecipeState], recipe) -> Optional[int]:
    """The algorithm code of the native batched update when one launch can update these
    states (a named algorithm, all on the native core of one device), else None."""
    algo = recipe.amax_compute_algo
    code = _ALGO_CODE.get(algo) if isinstance(algo, str) else None
    first = states[0]
    if code is None or not first.on_native():
        return None
    if len(states) > 1 and any(s.device != first.device for s in states):
        return None
    return code


def _native_groups(states: List[RecipeState], forward: bool, also_forward: bool = False) -> list:
    """The native update groups of the states (forward or backward; with also_forward, the
    backward's and the forward's together), descriptors cached per state."""
    desc = []
    for direction in ((False, True) if also_forward else (forward,)):
        for st in states:
            d = st.update_desc(direction)
            if d is not None:
                desc.append(d)
    return desc


def _update_delayed(states: List[RecipeState], recipe, group, forward: bool,
                    also_forward: bool = False) -> None:
    """The batched update of one direction's scales (with also_forward, a backward update that
    also runs a deferred forward update, in the same launch when it can)."""
    if not states or not isinstance(recipe, DelayedScaling):
        return
    directions = (False, True) if also_forward else (forward,)
    if recipe.reduce_amax and group is not None:
        _reduce_amax([s._amax_history_fwd if fwd else s.amax_history_bwd
                      for fwd in directions for s in states], group)
    code = _native_algo_code(states, recipe)
    if code is not None:
        # the common case: one launch through the binding, descriptors cached per module (this
        # runs once or twice per training step: kept free of per-call imports and property lookups)
        desc = _native_groups(states, forward, also_forward)
        if desc:
            native.native_for_torch().delayed_scaling_update(
                desc, code, float(recipe.margin), native.stream_handle(states[0].device.index))
        return
    for fwd in directions:
        groups = [s.scaling_groups()[0 if fwd else 1] for s in states]
        groups = [g for g in groups if g[0].shape[1] > 0]
        if groups:
            from .kernels import delayed_scaling_update
            delayed_scaling_update(groups, recipe.amax_compute_algo, float(recipe.margin))
    for s in states:
        s.warn_if_skipped_on_cpu()


# Steps whose forward update waits for their last backward (see the module docstring).
_DEFERRED: List[_Step] = []


def flush_deferred_updates() -> None:
    """Runs every deferred forward update now (before anything reads forward scales)."""
    while _DEFERRED:
        step = _DEFERRED.pop()
        step.fwd_deferred = False
        _update_delayed(step.states, step.recipe, step.group, forward=True)
        step.release_if_done()


_ALGO_CODE = {"max": 0, "most_recent": 1}


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
