"""Delayed-scaling update of many tensors at once (see csrc/.../recipe.h for the formula).

A group is (amax_history [L, n], scale [n], scale_inv [n], fp8_max[, skipped [n] int32]): the
tensors of one FP8 format of one module. All groups on the GPU are updated in one native launch
(per 56 groups); the reference does the same maths with torch ops.

A tensor whose current amax (history row 0) is NaN or infinite is not updated: its history is
not rolled, row 0 is cleared, its scale keeps the last finite update's value and skipped[j] grows
by one, all on the device (no host synchronisation).
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple, Union

import contextlib

import torch

from .. import native
from ._checks import check_tensor

ScalingGroup = Tuple  # (history, scale, scale_inv, fp8_max) or (..., fp8_max, skipped)
_ALGO_CODE = {"max": 0, "most_recent": 1}


def delayed_scaling_update_reference(history, scale, scale_inv, fp8_max, algo="max", margin=0.0,
                                     skipped=None):
    """In place, like the kernel. `algo` may also be a callable [L, n] history -> [n] amax.
    `skipped` (int32 [n] or None) counts the tensors left alone for a non-finite amax."""
    bad = ~torch.isfinite(history[0])
    if callable(algo):
        amax = algo(history).float()
    elif algo == "most_recent":
        amax = history[0].clone()
    else:
        amax = history.amax(dim=0) if not torch.isnan(history).any() else _nan_max(history)
    rolled = torch.roll(history, -1, dims=0)
    rolled[0].zero_()
    kept = history.clone()
    kept[0].zero_()
    history.copy_(torch.where(bad, kept, rolled))
    # torch evaluates `scalar / tensor` as reciprocal * scalar (an ulp off); divide tensors.
    candidate = (torch.full_like(amax, fp8_max) / amax) / (2.0 ** margin)
    ok = ~bad & (amax > 0) & torch.isfinite(amax) & torch.isfinite(candidate)
    scale.copy_(torch.where(ok, candidate, scale))
    scale_inv.copy_(1.0 / scale)
    if skipped is not None:
        skipped.add_(bad.to(skipped.dtype))


def _nan_max(history):
    nan = torch.isnan(history).any(dim=0)
    return torch.where(nan, torch.full_like(history[0], float("nan")),
                       torch.nan_to_num(history, nan=0.0).amax(dim=0))


def _check_group(op, i, group):
    if len(group) not in (4, 5):
        raise ValueError(f"{op}: groups[{i}] has {len(group)} items; expected (amax_history, scale, "
                         f"scale_inv, fp8_max) or those and a skipped-update counter")
    history, scale, scale_inv, fp8_max = group[:4]
    for name, t in (("amax_history", history), ("scale", scale), ("scale_inv", scale_inv)):
        check_tensor(op, f"groups[{i}].{name}", t, (torch.float32,))
    if history.dim() != 2:
        raise ValueError(f"{op}: groups[{i}].amax_history has shape {tuple(history.shape)}; expected [L, n]")
    n = history.shape[1]
    for name, t in (("scale", scale), ("scale_inv", scale_inv)):
        if t.numel() != n or t.device != history.device:
            raise ValueError(f"{op}: groups[{i}].{name} has shape {tuple(t.shape)} on {t.device}; "
                             f"expected {n} values on {history.device}")
    skipped = group[4] if len(group) == 5 else None
    if skipped is not None and (skipped.dtype != torch.int32 or skipped.numel() != n
                                or skipped.device != history.device):
        raise ValueError(f"{op}: groups[{i}] skipped counter is {skipped.dtype} {tuple(skipped.shape)} "
                         f"on {skipped.device}; expected int32 with {n} values on {history.device}")
    if not (fp8_max > 0 and fp8_max < float("inf")):
        raise ValueError(f"{op}: groups[{i}] fp8_max is {fp8_max}; expected a positive finite number")


def delayed_scaling_update(groups: Sequence[ScalingGroup], algo: Union[str, Callable] = "max",
                           margin: float = 0.0) -> None:
    """Rolls each amax history, recomputes scale and scale_inv, all in place and on the device."""
    op = "delayed_scaling_update"
    if not callable(algo) and algo not in _ALGO_CODE:
        raise ValueError(f"{op}: algo is {algo!r}; expected 'max', 'most_recent' or a callable")
    for i, g in enumerate(groups):
        _check_group(op, i, g)
    fast = [g for g in groups if native.use_native(g[0])] if not callable(algo) else []
    if fast:
        by_device = {}
        for g in fast:
            by_device.setdefault(g[0].device, []).append(g)
        for device, gs in by_device.items():
            desc = [(g[0].data_ptr(), g[1].data_ptr(), g[2].data_ptr(), g[0].shape[0],
                     g[0].shape[1], float(g[3]), g[4].data_ptr() if len(g) == 5 else 0)
                    for g in gs]
            # (CPU tensors reach here only in the emulated AMD build, whose streams are sequential)
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                native.native_for_torch().delayed_scaling_update(
                    desc, _ALGO_CODE[algo], float(margin), native.stream_of(gs[0][0]))
    fast_ids = {id(g) for g in fast}
    for g in groups:
        if id(g) not in fast_ids:
            delayed_scaling_update_reference(g[0], g[1], g[2], g[3], algo, margin,
                                             g[4] if len(g) == 5 else None)


def state_pointers(groups, counters: torch.Tensor) -> tuple:
    """A recipe state's (history, scale, scale_inv, fp8_max, counter, skipped) of the forward and
    of the backward, as raw addresses (fp8_max a float) for the native calls of the eager path
    (the fused Linear step's plan, the unchecked casts), from its two (history, scale,
    scale_inv, fp8_max, skipped) groups and its int32 step counters (one per direction). The
    tensors never move: loading a state copies into them, a device change builds a new state."""
    return tuple((h.data_ptr(), sc.data_ptr(), si.data_ptr(), m, counters[i:i + 1].data_ptr(),
                  sk.data_ptr())
                 for i, (h, sc, si, m, sk) in enumerate(groups))


def update_descriptors(groups) -> tuple:
    """The native batched update's descriptor of each (history, scale, scale_inv, fp8_max,
    skipped) group: addresses, the history's [length, slots] and fp8_max; None for a group
    without slots."""
    return tuple((h.data_ptr(), sc.data_ptr(), si.data_ptr(), h.shape[0], h.shape[1], float(m),
                  sk.data_ptr()) if h.shape[1] else None
                 for h, sc, si, m, sk in groups)

