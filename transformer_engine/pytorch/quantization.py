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
"""
from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch

from ..common import fp8_formats
from ..common.recipe import DelayedScaling, Float8CurrentScaling, Format, Recipe
from . import native

__all__ = ["autocast", "fp8_autocast", "fp8_model_init", "quantized_model_init", "is_fp8_available",
           "get_default_recipe", "RecipeState", "FP8GlobalState"]


# ----- device support ---------------------------------------------------------------------------

def is_fp8_available(device=None) -> Tuple[bool, str]:
    """(True, "") when FP8 GEMMs run natively on the device (default: the current GPU), else
    (False, why). CPU tensors always run FP8 emulated on the reference backend."""
    if device is not None and torch.device(device).type == "cpu":
        return True, "reference backend: FP8 emulated in plain torch"
    if not torch.cuda.is_available():
        return False, "no GPU visible to torch (FP8 runs emulated on CPU tensors only)"
    cap = native.capability(device)
    name = cap.device or cap.arch or "this GPU"
    if cap.backend == "reference":
        return False, f"{name}: {cap.reason}"
    if not cap.has_fp8 or not cap.fp8_gemm:
        return False, f"{name} ({cap.arch}) lacks FP8 GEMM support: {cap.reason}"
    return True, ""


_SUPPORT_CACHE: dict = {}


def check_fp8_support(device: torch.device, who: str) -> None:
    """Raises a clear error when FP8 is asked for on a GPU that cannot run it."""
    if device.type != "cuda":
        return
    key = device.index
    ok = _SUPPORT_CACHE.get(key)
    if ok is None:
        ok = _SUPPORT_CACHE[key] = is_fp8_available(device)
    if not ok[0]:
        raise NotImplementedError(f"{who}: FP8 autocast is enabled but {ok[1]}")


def get_default_recipe() -> Recipe:
    """DelayedScaling with the HYBRID format; the torch dtypes (OCP or FNUZ) come from the device
    when a module first runs."""
    return DelayedScaling()


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
    if isinstance(recipe, Recipe) and recipe.float8_block_scaling():
        return recipe  # Linear, LayerNormLinear and LayerNormMLP run it (module/_blockwise.py)
    if not isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        raise NotImplementedError(f"{who}: recipe {type(recipe).__name__} is not supported; expected "
                                  "DelayedScaling, Float8CurrentScaling or Float8BlockScaling")
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
            s.step = _Step(recipe, group) if isinstance(recipe, DelayedScaling) else None
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
    """Runs Transformer Engine modules in FP8 (enabled) or records amaxes only (calibrating).

    Nested contexts override the outer one; the delayed-scaling update of a step runs when the
    outermost context exits."""
    return _autocast_context(enabled, calibrating, recipe, amax_reduction_group)


def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Optional[Recipe] = None,
                 fp8_group=None, _graph: bool = False):
    """The older name of `autocast` (fp8_recipe -> recipe, fp8_group -> amax_reduction_group)."""
    return _autocast_context(enabled, calibrating, fp8_recipe, fp8_group)


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                         preserve_high_precision_init_val: bool = False):
    """Modules created inside keep their weights only as FP8 tensors (Float8Tensor): no
    high-precision copy. `preserve_high_precision_init_val` is accepted for API parity; the
    initial values are not kept (that is the memory this saves)."""
    s = FP8GlobalState
    saved = (s.model_init, s.model_init_recipe)
    s.model_init = bool(enabled)
    s.model_init_recipe = _check_recipe(recipe, "quantized_model_init") if enabled else None
    try:
        yield
    finally:
        s.model_init, s.model_init_recipe = saved


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False):
    """The older name of `quantized_model_init`."""
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
        self._ptrs = None
        self._on_native = None
        self.eager_call_info = None  # module/base.py: fp8_call_info's answer for plain FP8 calls
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
        self.max_fwd_t = torch.full((1,), self.fwd_max, **f32)
        self.max_bwd_t = torch.full((1,), self.bwd_max, **f32)
        self._make_views()

    def __getstate__(self):
        # copies (deepcopy of a module, pickling) get their own tensors: cached raw pointers
        # and descriptors would still address the original's
        state = self.__dict__.copy()
        state["_ptrs"] = state["_update_descs"] = state["_on_native"] = None
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
        self.__dict__.update(state)

    def _pointers(self):
        # (history, scale, scale_inv, fp8_max, counter) as raw pointers for the native fast path
        # (the tensors never move: a device change builds a new state); made on first eager use
        if self._ptrs is None:
            c = self.counters.data_ptr()
            self._ptrs = ((self._amax_history_fwd.data_ptr(), self._scale_fwd.data_ptr(),
                           self._scale_inv_fwd.data_ptr(), self.fwd_max, c),
                          (self.amax_history_bwd.data_ptr(), self.scale_bwd.data_ptr(),
                           self.scale_inv_bwd.data_ptr(), self.bwd_max, c + 4))
        return self._ptrs

    def update_desc(self, forward: bool):
        """This state's group for the native batched update, or None when it has no tensors."""
        descs = self._update_descs
        if descs is None:
            descs = self._update_descs = tuple(
                (h.data_ptr(), sc.data_ptr(), si.data_ptr(), h.shape[0], h.shape[1], float(m))
                if h.shape[1] else None
                for h, sc, si, m in ((self._amax_history_fwd, self._scale_fwd, self._scale_inv_fwd, self.fwd_max),
                                     (self.amax_history_bwd, self.scale_bwd, self.scale_inv_bwd, self.bwd_max)))
        return descs[0 if forward else 1]

    @property
    def ptrs_fwd(self):
        return self._pointers()[0]

    @property
    def ptrs_bwd(self):
        return self._pointers()[1]

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
    def current_scale(self, x: torch.Tensor, forward: bool, i: int, compute_amax=None) -> torch.Tensor:
        amax = (self.fwd_amax if forward else self.bwd_amax)[i]
        scale = (self.fwd_scale if forward else self.bwd_scale)[i]
        scale_inv = (self._scale_inv_fwd if forward else self.scale_inv_bwd)[i:i + 1]
        compute_current_scale(x, amax, scale, scale_inv, self.fwd_max if forward else self.bwd_max,
                              self.recipe.use_power_2_scales)
        return scale

    # -- checkpoint I/O
    def to_dict(self) -> dict:
        return {"recipe": self.key[0], "amax_history_fwd": self.amax_history_fwd.clone(),
                "amax_history_bwd": self.amax_history_bwd.clone(),
                "scale_fwd": self.scale_fwd.clone(), "scale_bwd": self.scale_bwd.clone(),
                "scale_inv_fwd": self.scale_inv_fwd.clone(), "scale_inv_bwd": self.scale_inv_bwd.clone()}

    def load_dict(self, d: dict) -> None:
        if _DEFERRED:
            flush_deferred_updates()  # an update still to come would overwrite what is loaded
        for name in ("scale_fwd", "scale_bwd", "scale_inv_fwd", "scale_inv_bwd"):
            if name in d and d[name].shape == getattr(self, name).shape:
                getattr(self, name).copy_(d[name])
        for name in ("amax_history_fwd", "amax_history_bwd"):
            if name in d:
                src, dst = d[name], getattr(self, name)
                rows = min(src.shape[0], dst.shape[0])
                if src.shape[1] == dst.shape[1]:
                    dst.zero_()
                    dst[:rows].copy_(src[:rows])


def compute_current_scale(x: torch.Tensor, amax: torch.Tensor, scale: torch.Tensor,
                          scale_inv: torch.Tensor, fp8_max: float, power_2: bool) -> None:
    """scale <- fp8_max / amax(x), on the device. `amax` is zero on entry and left zero.

    Every path computes it the same way on a device, so eager, fast-path and compiled runs cast
    with the same bits: on the native core the amax kernel, then the delayed-scaling update
    kernel with a one-row history (which divides, and clears the row); elsewhere (and for
    power-of-2 scales) torch ops."""
    from . import kernels
    kernels.compute_amax(x, amax)
    if not power_2 and native.use_native(x):
        kernels.delayed_scaling_update([(amax.view(1, 1), scale.view(1), scale_inv.view(1), fp8_max)],
                                   "most_recent", 0.0)
        return
    scale.copy_(scale_from_amax(amax, torch.full_like(amax, fp8_max), power_2))
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
        if fwd:
            groups = [(s._amax_history_fwd, s._scale_fwd, s._scale_inv_fwd, s.fwd_max) for s in states]
        else:
            groups = [(s.amax_history_bwd, s.scale_bwd, s.scale_inv_bwd, s.bwd_max) for s in states]
        groups = [g for g in groups if g[0].shape[1] > 0]
        if groups:
            from .kernels import delayed_scaling_update
            delayed_scaling_update(groups, recipe.amax_compute_algo, float(recipe.margin))


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
