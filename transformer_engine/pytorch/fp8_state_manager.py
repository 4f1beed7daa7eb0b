"""FP8GlobalStateManager: NVIDIA Transformer Engine's class-method view of the FP8 autocast
state, read from this library's state object (quantization.FP8GlobalState).

Only queries and the save/restore pair are offered; entering and leaving FP8 regions goes
through `autocast` / `fp8_autocast`, which also run the delayed-scaling updates.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import quantization as q


class FP8GlobalStateManager:
    """Class methods over the process-wide FP8 state (no instances)."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return q.FP8GlobalState.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return q.FP8GlobalState.calibrating

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        """Whether modules built now keep FP8-only weights (inside quantized_model_init)."""
        return q.FP8GlobalState.model_init

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        return q.FP8GlobalState.model_init_keep_hp

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        """Whether FP8 is on while the current CUDA stream is being captured into a graph."""
        return (q.FP8GlobalState.enabled and torch.cuda.is_available()
                and torch.cuda.is_current_stream_capturing())

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True inside an autocast until the first FP8 module of its outermost context ran."""
        return q.FP8GlobalState.is_first_fp8_module()

    @classmethod
    def get_fp8_recipe(cls):
        """The recipe of the current autocast, else the default recipe."""
        s = q.FP8GlobalState
        return s.recipe if s.recipe is not None else q.get_default_recipe()

    @classmethod
    def get_fp8_group(cls):
        return q.FP8GlobalState.group

    @classmethod
    def get_autocast_state(cls) -> Tuple:
        s = q.FP8GlobalState
        return (s.enabled, s.calibrating, s.recipe, s.group, s.depth, s.step, s.recompute_phase)

    @classmethod
    def set_autocast_state(cls, state: Tuple) -> None:
        s = q.FP8GlobalState
        (s.enabled, s.calibrating, s.recipe, s.group, s.depth, s.step, s.recompute_phase) = state

    @classmethod
    def reset(cls) -> None:
        """Back to no autocast and no model-init context; pending updates are run first."""
        q.flush_deferred_updates()
        s = q.FP8GlobalState
        s.enabled = s.calibrating = False
        s.recipe = s.group = s.step = None
        s.depth = 0
        s.recompute_phase = 0
        s.model_init, s.model_init_recipe, s.model_init_keep_hp = False, None, False

    @classmethod
    def is_fp8_available(cls) -> Tuple[bool, str]:
        return q.check_fp8_support()

    @classmethod
    def is_mxfp8_available(cls) -> Tuple[bool, str]:
        return q.check_mxfp8_support()

    @classmethod
    def is_fp8_block_scaling_available(cls) -> Tuple[bool, str]:
        return q.check_fp8_block_scaling_support()

    @classmethod
    def is_nvfp4_available(cls) -> Tuple[bool, str]:
        return q.check_nvfp4_support()

    @staticmethod
    def get_fp8_torch_dtype(recipe, fprop_tensor: bool = True,
                            device: Optional[torch.device] = None) -> torch.dtype:
        return get_fp8_torch_dtype(recipe, fprop_tensor, device)


def get_fp8_torch_dtype(recipe, fprop_tensor: bool = True,
                        device: Optional[torch.device] = None) -> torch.dtype:
    """The torch FP8 dtype a recipe uses for forward (fprop_tensor) or backward tensors on a
    device (default: the current GPU, else OCP)."""
    from ..common import fp8_formats
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    fmt = recipe.fp8_format.value
    return getattr(torch, fp8_formats.fp8_dtype_name(fmt.fwd if fprop_tensor else fmt.bwd,
                                                     q._flavor(torch.device(device))))


def get_fp8_max(recipe, fprop_tensor: bool = True, device: Optional[torch.device] = None) -> float:
    from ..common import fp8_formats
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    fmt = recipe.fp8_format.value
    return fp8_formats.fp8_max(fmt.fwd if fprop_tensor else fmt.bwd, q._flavor(torch.device(device)))
