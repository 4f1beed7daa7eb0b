"""What every Transformer Engine module shares: its FP8 recipe state (made on first FP8 use,
saved in state_dict as extra state), weight creation (meta device, FP8-only weights under
quantized_model_init), and the default initialisation."""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .. import quantization as q
from ..quantization import FP8GlobalState
from ..tensor import Float8Tensor
from ._wgrad import DelayedWeightGrad


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
    """Base of Linear, LayerNormLinear and LayerNormMLP: `fp8_slots` = (forward casts,
    backward casts) the module makes per call."""
    fp8_slots = (0, 0)

    def __init__(self):
        super().__init__()
        self._fp8_state: Optional[q.RecipeState] = None
        self._pending_fp8_extra_state = None
        self._fp8_weight_cache = None
        self._fp8_checkpoint_stash = None
        self.primary_weights_in_fp8 = FP8GlobalState.model_init
        self._model_init_recipe = FP8GlobalState.model_init_recipe

    def _remember_device(self, device: torch.device) -> None:
        if device.type == "cuda":
            q._flavor(device)  # cache the FP8 flavour now, outside any compiled region

    # -- FP8 per call
    def fp8_call_info(self, device: torch.device) -> FP8CallInfo:
        s = FP8GlobalState
        if not (s.enabled or s.calibrating):
            return _NO_FP8
        if s.enabled:
            if s.recipe.float8_block_scaling():
                raise NotImplementedError(
                    f"{type(self).__name__}: Float8BlockScaling is supported by Linear, "
                    "LayerNormLinear and LayerNormMLP only")
            q.check_fp8_support(device, type(self).__name__)
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
            rs = self._fp8_state = q.recipe_state_for(rs, s.recipe, device, *self.fp8_slots)
            if self._pending_fp8_extra_state is not None:
                rs.load_dict(self._pending_fp8_extra_state)
                self._pending_fp8_extra_state = None
        phase = s.recompute_phase
        replay = record = None
        if phase and s.enabled:  # checkpointing: record (1) or replay (2) this call's scales
            from ._casts import record_list, replay_list
            replay, record = replay_list(self, phase), record_list(self, phase)
        # a checkpointed forward (phase 1) counts the backward that its recompute (phase 2,
        # run under the forward's step) will deliver
        step = q.register_forward(rs, expect_backward=phase != 2)
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
        """A parameter initialised on `device` ('meta' defers it: call reset_parameters() after
        to_empty()); under quantized_model_init it is stored as a Float8Tensor only."""
        self._remember_device(device)
        w = torch.empty(shape, dtype=dtype, device=device)
        if device.type != "meta" and init is not None:
            init(w)
        if self.primary_weights_in_fp8 and device.type != "meta":
            w = self._to_fp8_weight(w)
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
        rs = q.RecipeState(recipe, w.device, 1, 0)
        return Float8Tensor.quantize(w, rs.fwd_dtype, w.dtype)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._fp8_weight_cache = None
        rs = self._fp8_state
        if rs is not None:
            p = next(iter(self.parameters()), None)
            if p is not None and p.device != rs.device and p.device.type != "meta":
                saved = rs.to_dict()
                self._fp8_state = q.RecipeState(rs.recipe, p.device, *self.fp8_slots)
                self._fp8_state.load_dict({k: v.to(p.device) for k, v in saved.items()
                                           if isinstance(v, torch.Tensor)})
        return out

    # -- checkpoints: FP8 metadata as extra state; checkpoints without it still load
    def get_extra_state(self):
        if self._fp8_state is None:
            return self._pending_fp8_extra_state
        return self._fp8_state.to_dict()

    def set_extra_state(self, state):
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
