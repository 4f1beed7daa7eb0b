"""FP8 for the fusible operations: each operation's recipe state under the autocast in force,
and the casts of GEMM operands with that state's scales."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .. import kernels
from .. import quantization as q
from ..quantization import FP8GlobalState
from .op import op_name


class FP8Call(NamedTuple):
    rs: q.RecipeState           # the operation's scales and amax history for this recipe
    step: Optional[object]      # the delayed-scaling step to report the backward to, or None
    calibrating: bool = False   # high precision, recording amaxes only (autocast calibrating=True)


def fp8_call(op, device: torch.device, expect_backward: bool) -> Optional[FP8Call]:
    """The operation's FP8 state when FP8 autocast is on (or calibrating), else None. Creates
    or refreshes the state for the autocast's recipe and joins the step's batched
    delayed-scaling update."""
    s = FP8GlobalState
    if not s.enabled and not (s.calibrating and s.recipe is not None and s.recipe.delayed()):
        return None
    recipe = s.recipe
    if s.enabled:  # (calibrating runs high-precision maths: no FP8 needed on the device)
        if recipe.float8_block_scaling():
            raise NotImplementedError(f"{op_name(op)}: Float8BlockScaling is not supported by "
                                      "the fusible operations; use DelayedScaling or "
                                      "Float8CurrentScaling (or te.Linear, which runs it)")
        q.require_fp8_support(device, op_name(op))
    if recipe.delayed() and torch.compiler.is_compiling():
        raise NotImplementedError(f"{op_name(op)}: DelayedScaling is not supported under "
                                  "torch.compile; use Float8CurrentScaling or run eagerly")
    rs = op._fp8_state
    if rs is None or rs.recipe is not recipe or rs.device != device:
        # the state outlives this call: normal tensors even under torch.inference_mode, so a
        # later training step can update it in place
        with torch.inference_mode(False):
            rs = op._fp8_state = q.recipe_state_for(rs, recipe, device, *op.fp8_slots)
            rs.owner = op_name(op)
            if op._pending_fp8_extra_state is not None:
                rs.load_dict({k: v.to(device) for k, v in op._pending_fp8_extra_state.items()
                              if isinstance(v, torch.Tensor)})
                op._pending_fp8_extra_state = None
    step = q.register_forward(rs, expect_backward=expect_backward)
    return FP8Call(rs, step, not s.enabled)


def record_amax(fp8: FP8Call, x: torch.Tensor, slot: int) -> None:
    """Calibration: fold max|x| into the forward amax of `slot` (the delayed-scaling update at
    the autocast's exit turns it into a scale)."""
    kernels.compute_amax(x, fp8.rs.fwd_amax[slot])


def scale_for(rs: q.RecipeState, x: torch.Tensor, forward: bool, slot: int):
    """(scale, amax to update or None) of one cast: the delayed-scaling scale and its history
    row, or a current scale computed from x now."""
    if rs.delayed:
        return ((rs.fwd_scale if forward else rs.bwd_scale)[slot],
                (rs.fwd_amax if forward else rs.bwd_amax)[slot])
    return rs.current_scale(x, forward, slot), None


def cast(rs: q.RecipeState, x: torch.Tensor, forward: bool, slot: int, need_transpose: bool):
    """(data, data_t or None, scale_inv) of x (contiguous, viewed as 2-D for the transpose)
    in the recipe's forward or backward FP8 format."""
    scale, amax = scale_for(rs, x, forward, slot)
    dtype = rs.fwd_dtype if forward else rs.bwd_dtype
    if need_transpose:
        return kernels.cast_transpose(x, scale, dtype, amax)
    data, scale_inv = kernels.quantize(x, scale, dtype, amax)
    return data, None, scale_inv
