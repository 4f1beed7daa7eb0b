"""FP8 casts of the modules' GEMM operands, shared by Linear, LayerNormLinear and LayerNormMLP:
the chooser of the cast family. In eager mode on the native core the unchecked calls of
kernels/cast.py and kernels/cast_fused.py run (scale and amax as pointers into the module's
recipe state); otherwise the checked ops (dispatch: the kernels or, traced, their custom ops).

Each returns the FP8 data, its transpose when the backward needs it (Hopper FP8 GEMMs take
only the TN layout) and the scale_inv the data was made with (a fresh value per cast, so a
delayed-scaling update between forward and backward cannot change saved tensors' meaning).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import dispatch as K
from .activation import bias_grad_of
from ..kernels import eager
from ..kernels.cast import cast_unchecked, transpose_unchecked
from ..kernels.cast_fused import cast_transpose_dbias_unchecked
from ..quantization import RecipeState


def cast_scale(rs: RecipeState, x: torch.Tensor, forward: bool, slot: int, stash: Optional[list],
               amax_group=None):
    """(scale, amax-to-update) for one cast. DelayedScaling: the module's scale and its amax
    history row. Current scaling: amax of x now (all-reduced over amax_group when x is one
    rank's rows of a tensor split over it), then its scale. In a checkpoint recompute the
    forward's scale is replayed and no amax is recorded."""
    if stash is not None:
        return stash.pop(0), None
    if rs.delayed:
        scale = (rs.fwd_scale if forward else rs.bwd_scale)[slot]
        amax = (rs.fwd_amax if forward else rs.bwd_amax)[slot]
    elif torch.compiler.is_compiling():
        # traced: the scale as a value of the graph (same kernels as eager), not module state
        scale = K.current_scale(x, rs.fwd_max if forward else rs.bwd_max, rs.recipe.use_power_2_scales)
        amax = None
    else:
        scale, amax = rs.current_scale(x, forward, slot, amax_group), None
    return scale, amax


def record_scale(saved: Optional[list], scale: torch.Tensor) -> None:
    """In a checkpointed forward, keep a copy of the scale for the recompute."""
    if saved is not None:
        saved.append(scale.clone())


def cast(rs, x, forward, slot, need_transpose, replay=None, record=None, nc=None,
         amax_group=None, band_rows=0):
    """(data, data_t or None, scale_inv) of a 2-D tensor. nc: the caller's eager native call
    when it already took one for a plain call (a contiguous x, no replay or record).
    amax_group (current scaling): x is this rank's rows of a tensor split over that group, and
    the scale is the whole tensor's (its amax all-reduced over the group first). band_rows: on
    the direct path, a cast+transpose launched in bands of rows (kernels/cast.cast_unchecked)."""
    if nc is not None:
        return cast_unchecked(nc, rs, x, forward, slot, need_transpose, band_rows)
    # the direct call computes a current scale from x alone: a group's scale takes the checked ops
    if replay is None and record is None and x.dim() == 2 and x.is_contiguous() and (
            rs.delayed or (not rs.recipe.use_power_2_scales and amax_group is None)):
        nc = eager.native_call(x)
        if nc is not None:  # eager on the native core: the direct calls, same kernels and bits
            return cast_unchecked(nc, rs, x, forward, slot, need_transpose, band_rows)
    scale, amax = cast_scale(rs, x, forward, slot, replay, amax_group)
    record_scale(record, scale)
    dtype = rs.fwd_dtype if forward else rs.bwd_dtype
    if need_transpose:
        return K.cast_transpose(x, scale, dtype, amax)
    data, scale_inv = K.quantize(x, scale, dtype, amax)
    return data, None, scale_inv


def cast_grad(fi, dy, need_transpose: bool, db_dtype):
    """(dyq, dyq_t or None, scale_inv, db or None) of an output gradient (backward slot 0). With a
    bias gradient to make (db_dtype not None) and a transpose wanted, on the direct path, one
    kernel casts, transposes and sums the columns; otherwise the cast, then an fp32 column sum."""
    if db_dtype is not None and need_transpose and eager.usable_backward(fi) and dy.dim() == 2:
        nc = eager.native_call(dy)
        if nc is not None:
            dyq, dyq_t, db, dy_sinv = cast_transpose_dbias_unchecked(nc, fi.rs, dy, 0, db_dtype)
            return dyq, dyq_t, dy_sinv, db
    db = None
    if db_dtype is not None:
        db = bias_grad_of(dy if dy.dim() == 2 else dy.reshape(-1, dy.shape[-1]), db_dtype)
    dyq, dyq_t, dy_sinv = cast(fi.rs, dy, False, 0, need_transpose)
    return dyq, dyq_t, dy_sinv, db


def transposed(data: torch.Tensor) -> torch.Tensor:
    nc = eager.native_call(data) if data.dim() == 2 else None
    if nc is not None:
        return transpose_unchecked(nc, data)
    return K.transpose(data)


def record_amax(rs: RecipeState, x: torch.Tensor, forward: bool, slot: int) -> None:
    """Calibration: amax only, into the history row that the next update reads."""
    K.compute_amax(x, (rs.fwd_amax if forward else rs.bwd_amax)[slot])
