"""The per-module FP8 recipe state (scales, amax history, skipped-update counters) and the
batched delayed-scaling update that `quantization`'s step runs over every registered state.

The life of a step and the handling of a bad step are told in quantization.py's docstring;
this module holds the state and the arithmetic, and depends on no autocast state (a deferred
forward update waits in `_DEFERRED` until a read of a forward scale or the step's last
backward runs it)."""
from __future__ import annotations

import contextlib
import warnings
from typing import List, Optional

import torch

from ..common import fp8_formats
from ..common.recipe import DelayedScaling, Format, Recipe
from . import native

# ----- per-module recipe state ------------------------------------------------------------------

_FLAVOR_BY_DEVICE: dict = {}


def _flavor(device: torch.device) -> str:
    """FP8 encoding of a device, cached (modules fill the cache eagerly when they are built,
    so a compiled region only reads it)."""
    if device.type == "cpu":
        flavor = _FLAVOR_BY_DEVICE.get("cpu")
        if flavor is None:
            # the emulated AMD build's CPU tensors are its device's memory: that arch's encoding
            emulated = native.emulated_device(device)
            flavor = _FLAVOR_BY_DEVICE["cpu"] = (
                native.capability(device).fp8_flavor if emulated else None) or fp8_formats.OCP
        return flavor
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
            device = states[0].device
            # the launch goes to the current device: made the states' own, which a model on a GPU
            # that is not current does not have (module_parts/input_check.call_checked); the
            # emulated AMD build's states are CPU tensors
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                native.native_for_torch().delayed_scaling_update(
                    desc, code, float(recipe.margin), native.stream_handle(device.index))
        return
    for fwd in directions:
        groups = [s.scaling_groups()[0 if fwd else 1] for s in states]
        groups = [g for g in groups if g[0].shape[1] > 0]
        if groups:
            from .kernels import delayed_scaling_update
            delayed_scaling_update(groups, recipe.amax_compute_algo, float(recipe.margin))
    for s in states:
        s.warn_if_skipped_on_cpu()


# Steps (quantization._Step) whose forward update waits for their last backward (see
# quantization's docstring).
_DEFERRED: list = []


def flush_deferred_updates() -> None:
    """Runs every deferred forward update now (before anything reads forward scales)."""
    while _DEFERRED:
        step = _DEFERRED.pop()
        step.fwd_deferred = False
        _update_delayed(step.states, step.recipe, step.group, forward=True)
        step.release_if_done()


_ALGO_CODE = {"max": 0, "most_recent": 1}
