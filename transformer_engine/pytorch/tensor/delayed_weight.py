"""FP8-only weights (quantized_model_init) under DelayedScaling are quantized as a module with
high-precision weights casts them: with the scale that the module's delayed-scaling state holds
for the weight (1 before its first step), their amax going into that state's history. So the
first step of the two reads the same weight bits and both make the same scale update; later
``quantize_`` calls use the module's scale, as NVIDIA TE's weight quantizer does."""
from __future__ import annotations

import torch

from .float8_tensor import Float8Quantizer, Float8Tensor


def new_weight_quantizer(rs) -> Float8Quantizer:
    """The quantizer of a new FP8-only weight under the delayed-scaling recipe state `rs` (any
    state of the recipe: only its initial scale and FP8 dtype are read): that initial scale, and
    an amax of its own until a module's state adopts it (follow_module_state)."""
    qz = Float8Quantizer(rs.fwd_scale[0].clone(),
                         torch.zeros(1, dtype=torch.float32, device=rs.device),
                         rs.fwd_dtype, columnwise=False)
    qz.module_weight = True
    return qz


def quantize_new_weight(w: torch.Tensor, rs) -> Float8Tensor:
    """A new FP8-only weight of a per-tensor recipe state `rs` (quantized_model_init): under
    delayed scaling with new_weight_quantizer's scale, else with its own amax."""
    if rs.delayed:
        return new_weight_quantizer(rs).quantize(w, dtype=w.dtype)
    return Float8Tensor.quantize(w, rs.fwd_dtype, w.dtype)


def follow_module_state(weight: Float8Tensor, rs, slot: int) -> None:
    """Points the quantizer of an FP8-only weight made by new_weight_quantizer at the scale and
    amax-history row of forward slot `slot` of the module's delayed-scaling state `rs`, first
    recording there the amax its current value was quantized from, as the module's own cast of a
    high-precision weight would have. A no-op for other weights and once adopted."""
    qz = weight._quantizer
    if not getattr(qz, "module_weight", False) or qz.scale is rs.fwd_scale[slot]:
        return
    amax = rs.fwd_amax[slot]
    torch.maximum(amax, qz.amax.reshape(1).to(amax.device), out=amax)
    qz.scale, qz.amax = rs.fwd_scale[slot], amax
