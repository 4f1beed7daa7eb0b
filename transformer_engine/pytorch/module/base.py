"""What every Transformer Engine module shares: its FP8 recipe state (made on first FP8 use,
saved in state_dict as extra state), weight creation (meta device, FP8-only weights under
quantized_model_init), and the default initialisation."""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .. import fp8_recompute, quantization as q
from ..library.cast import cast, transposed
from ..quantization import FP8GlobalState
from ..tensor import Float8BlockwiseQTensor, Float8Tensor, delayed_weight
from ..module_parts import weight_cast_beside
from ..module_parts.input_check import call_checked
from ..module_parts.wgrad import DelayedWeightGrad, get_dummy_wgrad  # noqa: F401  (NVIDIA TE's path)


def default_init_method(std: float = 0.023) -> Callable:
    def init(w):
        return torch.nn.init.normal_(w, mean=0.0, std=std)
    return init


def default_device(device):
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class FP8CallInfo:
    """What one module call needs to know about FP8, gathered once per call."""
    __slots__ = ("fp8", "calibrating", "rs", "step", "replay", "record")

    def __init__(self, fp8, calibrating, rs, step, replay, record):
        self.fp8, self.calibrating, self.rs, self.step = fp8, calibrating, rs, step
        self.replay, self.record = replay, record


_NO_FP8 = FP8CallInfo(False, False, None, None, None, None)


class TransformerEngineBaseModule(DelayedWeightGrad, torch.nn.Module):
    """Base class of :class:`Linear`, :class:`LayerNormLinear` and :class:`LayerNormMLP`.

    It holds the module's FP8 state (amax history and scales, created on the first FP8 call and
    saved in ``state_dict`` as extra state), creates the weights (on the meta device, or as FP8-only
    :class:`Float8Tensor` weights under :func:`quantized_model_init`) and supplies the default
    initialisation. ``fp8_slots`` is the number of FP8 casts a call makes in the forward and in the
    backward pass. The delayed weight-gradient API (``delay_wgrad_compute``, ``backward_dw``)
    comes from ``DelayedWeightGrad``.
    """
    fp8_slots = (0, 0)

    def __init__(self):
        super().__init__()
        self._fp8_state: Optional[q.RecipeState] = None
        self._pending_fp8_extra_state = None
        self._fp8_weight_cache = None
        self._fp8_checkpoint_stash = None  # see fp8_recompute.py
        self._fp8_replay = None
        self._fp8_recompute_steps = []
        self.primary_weights_in_fp8 = FP8GlobalState.model_init
        self._model_init_recipe = FP8GlobalState.model_init_recipe
        self._keep_hp_init_val = FP8GlobalState.model_init_keep_hp

    @property
    def fp8_meta(self) -> dict:
        """NVIDIA TE's view of the module's FP8 metadata, made on each read from the module's
        recipe state: "recipe", "fp8_group" (the current autocast's), "fp8_checkpoint" (whether
        the module has FP8 state to save), "global_fp8_buffer_pos_fwd_recompute" (once a
        checkpointed forward under delayed scaling stashed its scales for the recompute; see
        fp8_recompute.py) and,
        once FP8 ran, "scaling_fwd" / "scaling_bwd" with `scale`, `scale_inv` and
        `amax_history` (the module's own tensors, [history, slots])."""
        rs = self._fp8_state
        # the same dict on every read (FP8GlobalStateManager's recompute methods take it and
        # write into it), its entries refreshed here
        meta = fp8_recompute.meta_of(self)
        meta.update(recipe=rs.recipe if rs is not None else FP8GlobalState.recipe,
                    fp8_group=FP8GlobalState.group, fp8_checkpoint=rs is not None,
                    num_gemms=max(1, self.fp8_slots[0] // 2))
        if rs is not None:
            from types import SimpleNamespace
            meta["scaling_fwd"] = SimpleNamespace(scale=rs.scale_fwd, scale_inv=rs.scale_inv_fwd,
                                                  amax_history=rs.amax_history_fwd)
            meta["scaling_bwd"] = SimpleNamespace(scale=rs.scale_bwd, scale_inv=rs.scale_inv_bwd,
                                                  amax_history=rs.amax_history_bwd)
        return meta

    def _remember_device(self, device: torch.device) -> None:
        if device.type in ("cuda", "cpu"):
            q._flavor(device)  # cache the FP8 flavour now, outside any compiled region

    def __call__(self, *args, **kwargs):
        """Runs the module (``torch.nn.Module.__call__``: hooks, then :meth:`forward`) after
        checking its input.

        Parameters
        ----------
        *args : tuple
            Passed to :meth:`forward`; the first must be a float32, float16 or bfloat16 tensor
            (else ValueError naming the module).
        **kwargs : dict
            Passed to :meth:`forward`; ````inp```` may be given here by keyword instead.

        Returns
        -------
        What :meth:`forward` returns.
        """
        return call_checked(self, "inp", torch.nn.Module.__call__, args, kwargs)

    # -- FP8 per call
    def fp8_call_info(self, device: torch.device) -> FP8CallInfo:
        """The FP8 settings for one call of the module on ``device``.

        Reads the autocast in force, creates or refreshes the module's FP8 state for its recipe and
        registers the step with delayed scaling. Called by ``forward``; users need not call it.

        Parameters
        ----------
        device : torch.device
            The device of the call's input.

        Raises
        ------
        RuntimeError
            When FP8 is enabled but the device has no FP8 support.
        NotImplementedError
            For delayed scaling under ``torch.compile`` (use Float8CurrentScaling there).
        """
        s = FP8GlobalState
        if not (s.enabled or s.calibrating):
            return _NO_FP8
        if s.enabled:
            if s.recipe.float8_block_scaling():
                raise NotImplementedError(
                    f"{type(self).__name__}: Float8BlockScaling is supported by Linear, "
                    "LayerNormLinear, LayerNormMLP and GroupedLinear only")
            q.require_fp8_support(device, type(self).__name__)
            if s.recipe.delayed() and torch.compiler.is_compiling():
                raise NotImplementedError(
                    f"{type(self).__name__}: DelayedScaling is not supported under torch.compile "
                    "(its amax history and scale updates are side effects outside the graph); use "
                    "recipe.Float8CurrentScaling() or run the module eagerly")
        rs = self._fp8_state
        if rs is None or rs.recipe is not s.recipe or rs.device != device:
            if torch.compiler.is_compiling():
                # traced current scaling keeps no state: a tensor-free description is enough,
                # and creating module state inside the graph would be a side effect
                return FP8CallInfo(s.enabled, False, q.RecipeState(s.recipe, device, 0, 0, False),
                                   None, None, None)
            if any(isinstance(p, Float8BlockwiseQTensor) for p in self.parameters()):
                raise NotImplementedError(
                    f"{type(self).__name__}: weights quantized in 128x128 tiles (quantized_model_init "
                    f"under Float8BlockScaling) run under Float8BlockScaling or outside FP8; "
                    f"the active recipe is {type(s.recipe).__name__}")
            # the state outlives this call: made as normal tensors even under inference_mode,
            # so that a later training step can update it in place
            with torch.inference_mode(False):
                rs = self._fp8_state = q.recipe_state_for(rs, s.recipe, device, *self.fp8_slots)
            rs.owner = type(self).__name__
            if self._pending_fp8_extra_state is not None:
                rs.load_dict(self._pending_fp8_extra_state)
                self._pending_fp8_extra_state = None
        phase = s.recompute_phase
        replay = record = None
        if phase and s.enabled:  # checkpointing: record (1) or replay (2) this call's scales
            # through NVIDIA TE's FP8GlobalStateManager methods (looked up on each call), so
            # that code wrapping them sees each stash and restore; delayed scaling stashes
            # through it (fp8_meta then holds the position), the other recipes directly
            if phase == 1:
                if s.recipe.delayed():
                    q.FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute(
                        self.fp8_meta)
                else:
                    fp8_recompute.open_record(self)
                record = fp8_recompute.last_record(self)
            else:
                q.FP8GlobalStateManager.get_old_fp8_meta_tensors_for_recompute(self.fp8_meta)
                replay = fp8_recompute.take_replay(self)
        # a checkpointed forward (phase 1) counts the backward that its recompute (phase 2)
        # will deliver, to the forward's step: recorded here, as a recompute may run under an
        # autocast of its own (activation_recompute_forward), which opens no step
        if phase == 2 and s.enabled and self._fp8_recompute_steps:
            step = self._fp8_recompute_steps.pop(0)
        else:
            step = q.register_forward(rs, expect_backward=phase != 2)
            if phase == 1 and s.enabled:
                self._fp8_recompute_steps.append(step)
        if step is None and replay is None and record is None and s.enabled:
            # a plain FP8 call without a step (current scaling): the same answer every time,
            # made once per state (host time on every call)
            info = rs.eager_call_info
            if info is None:
                info = rs.eager_call_info = FP8CallInfo(True, False, rs, None, None, None)
            return info
        return FP8CallInfo(s.enabled, s.calibrating and not s.enabled, rs, step, replay, record)

    # -- weights
    def make_weight(self, shape, dtype, device, init: Optional[Callable]) -> torch.nn.Parameter:
        """Create a weight parameter.

        Parameters
        ----------
        shape : tuple of int
            The weight's shape.
        dtype : torch.dtype
            The weight's dtype.
        device : torch.device
            Where to create it; ``'meta'`` defers initialisation to ``reset_parameters()``.
        init : callable or None
            Called on the new tensor to initialise it in place; ``None`` leaves it uninitialised.

        Returns
        -------
        torch.nn.Parameter
            The weight, stored as a :class:`Float8Tensor` under :func:`quantized_model_init`.
        """
        self._remember_device(device)
        w = torch.empty(shape, dtype=dtype, device=device)
        if device.type != "meta" and init is not None:
            init(w)
        if self.primary_weights_in_fp8 and device.type != "meta":
            hp = w.detach().to("cpu", copy=True) if self._keep_hp_init_val else None
            w = self._to_fp8_weight(w)
            if hp is not None:
                w._high_precision_init_val = hp
        return torch.nn.Parameter(w)

    def _init_weight(self, w, init_method=None):
        """init_method (default: the module's) on w, under the TP RNG tracker when given."""
        init = init_method or self.init_method
        tracker = getattr(self, "get_rng_state_tracker", None)
        if tracker is not None and w.is_cuda:
            with tracker().fork(getattr(self, "rng_tracker_name", None) or "model-parallel-rng"):
                init(w)
        else:
            init(w)

    def _quantize_deferred_weights(self) -> None:
        """After deferred init (device='meta', to_empty, reset_parameters) under
        quantized_model_init: store the GEMM weights as Float8Tensors, as an eager init would."""
        if not self.primary_weights_in_fp8:
            return
        for name, p in list(self.named_parameters(recurse=False)):
            if name.endswith("weight") and not name.startswith("layer_norm") and not isinstance(p, Float8Tensor):
                setattr(self, name, torch.nn.Parameter(self._to_fp8_weight(p.detach()),
                                                       requires_grad=p.requires_grad))

    def _to_fp8_weight(self, w: torch.Tensor) -> Float8Tensor:
        recipe = self._model_init_recipe or q.get_default_recipe()
        if recipe.float8_block_scaling():
            return Float8BlockwiseQTensor.quantize_tiles(
                w, q.recipe_fp8_dtypes(recipe, w.device)[0], w.dtype,
                recipe.fp8_quant_fwd_weight.power_2_scale)
        return delayed_weight.quantize_new_weight(w, q.RecipeState(recipe, w.device, 1, 0))

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._fp8_weight_cache = None
        rs = self._fp8_state
        if rs is not None:
            p = next(iter(self.parameters()), None)
            if p is not None and p.device != rs.device and p.device.type != "meta":
                saved = rs.to_dict()
                self._fp8_state = q.RecipeState(rs.recipe, p.device, *self.fp8_slots)
                self._fp8_state.owner = rs.owner
                self._fp8_state.load_dict({k: v.to(p.device) for k, v in saved.items()
                                           if isinstance(v, torch.Tensor)})
        return out

    def fp8_skipped_updates(self) -> int:
        """How many FP8 scale updates of this module were skipped because an amax was NaN or
        infinite (0 before any FP8 step). Reading it waits for the device; the first non-zero
        answer also warns. See `transformer_engine.pytorch.quantization`."""
        rs = self._fp8_state
        return 0 if rs is None or not hasattr(rs, "_skipped_fwd") else rs.skipped_updates()

    # -- checkpoints: FP8 metadata as extra state; checkpoints without it still load
    def get_extra_state(self):
        """The FP8 metadata (amax history, scales, step counters) saved in ``state_dict``."""
        if self._fp8_state is None:
            return self._pending_fp8_extra_state
        return self._fp8_state.to_dict()

    def set_extra_state(self, state):
        """Restore the FP8 metadata saved by ``get_extra_state``.

        Parameters
        ----------
        state : dict or None
            The saved metadata. An empty or missing state (a checkpoint from before FP8 was used, or
            from another library) is accepted and leaves the state as it is.
        """
        if not state:
            return
        if isinstance(state, dict) and self._fp8_state is not None:
            dev = self._fp8_state.device
            self._fp8_state.load_dict({k: v.to(dev) for k, v in state.items() if isinstance(v, torch.Tensor)})
        elif isinstance(state, dict):
            self._pending_fp8_extra_state = state

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)  # saved before FP8 was used, or by another library

    def activation_dtype(self, inp: torch.Tensor) -> torch.dtype:
        # is_cuda first: inp.device builds a device object per call (host time on every call)
        """The dtype the module computes in for input ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            The call's input; its dtype is used unless ``torch.autocast`` is active on its device,
            in
            which case the autocast dtype is.
        """
        kind = "cuda" if inp.is_cuda else inp.device.type
        if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
        return inp.dtype


def hp_weight(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A weight in the activation dtype (dequantised when it is a Float8Tensor)."""
    if isinstance(w, Float8Tensor):
        return w.dequantize(dtype)
    return w if w.dtype == dtype else w.to(dtype)


def tokens_of(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def get_workspace() -> torch.Tensor:
    """The GEMM workspace of the current GPU and stream (the buffer every GEMM of this library on
    that stream uses); an empty tensor on the reference backend, whose GEMM needs none."""
    from .. import native
    if torch.cuda.is_available() and native.native_for_torch() is not None:
        from ..kernels.gemm import gemm_workspace
        return gemm_workspace(torch.device("cuda", torch.cuda.current_device()))
    return torch.empty(0, dtype=torch.uint8)


def fp8_weight(module, weight, fi, slot: int, need_transpose: bool, is_first_microbatch, nc=None):
    """(data, data_t, scale_inv) of a weight in FP8: the Float8Tensor's own data, the cast made
    beside the core attention for this forward (module_parts/weight_cast_beside.py), the
    per-step cache (is_first_microbatch=False reuses what the first microbatch cast), or a
    fresh cast."""
    if isinstance(weight, Float8Tensor):
        if fi.rs.delayed:
            delayed_weight.follow_module_state(weight, fi.rs, slot)
        return weight._data, (weight.transpose_fp8() if need_transpose else None), weight._scale_inv
    if is_first_microbatch is None and module is not None:
        made = weight_cast_beside.take(module, weight, fi, slot, need_transpose)
        if made is not None:
            return made
    cache = module._fp8_weight_cache if module is not None else None
    if is_first_microbatch is False and cache is not None and slot in cache:
        data, data_t, scale_inv = cache[slot]
        if need_transpose and data_t is None:
            data_t = transposed(data)
            cache[slot] = (data, data_t, scale_inv)
        return data, data_t, scale_inv
    data, data_t, scale_inv = cast(fi.rs, weight.contiguous(), True, slot, need_transpose,
                                   fi.replay, fi.record, nc)
    if is_first_microbatch is not None and module is not None:
        if module._fp8_weight_cache is None:
            module._fp8_weight_cache = {}
        module._fp8_weight_cache[slot] = (data, data_t, scale_inv)
    return data, data_t, scale_inv
