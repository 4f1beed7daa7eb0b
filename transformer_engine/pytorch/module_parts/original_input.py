"""save_original_input (Linear, GroupedLinear): the forward keeps the GEMM input as it came, in
high precision, instead of the FP8 copy the weight-gradient GEMM reads, and the backward casts
it again. It pays where the caller keeps that input alive anyway (the attention output feeding
a projection), so that no second, FP8 copy of it lives until the backward.

The cast made again must be the forward's, bit for bit. Current scaling and block scaling derive
their scales from the values alone, so it is. Delayed scaling reads the module's scale and maxes
the input's amax into its history a second time; NVIDIA Transformer Engine refuses that
combination and so does this library. Without FP8 the option changes nothing: the input is what
the backward saves anyway. Under a recipe's backward_override the override decides what is
saved ('high_precision': the input; 'dequantized': its FP8 copy)."""
from __future__ import annotations

import torch

from ..library.cast import cast


def check_recipe(who: str, module, fi, weights) -> None:
    """Raises ValueError when save_original_input is on, the call runs under DelayedScaling and
    the backward needs the input (a weight gradient will be made for one of `weights`)."""
    if (getattr(module, "save_original_input", False) and fi.fp8 and fi.rs.delayed
            and torch.is_grad_enabled() and any(w.requires_grad for w in weights)):
        raise ValueError(f"{who}: save_original_input=True is not supported under DelayedScaling "
                         "(the backward would cast the input again with the module's delayed "
                         "scale and record its amax twice); use Float8CurrentScaling or "
                         "Float8BlockScaling, or save_original_input=False")


def cast_again(rs, x: torch.Tensor, slot: int):
    """(xq_t, scale_inv): the transposed FP8 copy of the saved input x for the weight-gradient
    GEMM, cast as the forward cast it (forward slot `slot`, current scaling)."""
    _, xq_t, scale_inv = cast(rs, x, True, slot, True)
    return xq_t, scale_inv
