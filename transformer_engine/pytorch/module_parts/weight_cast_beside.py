"""FP8 weight casts made on a side stream under a TransformerLayer's core attention, for the
modules after it to take.

Under sequence parallelism a TransformerLayer's FP8 forward runs the attention projection's and
the MLP's weight casts (memory-bound, about 85 us per step for the GPT block at TP=2 on an
H200) in line, between GEMMs and collectives that wait for them. A weight's cast depends only on
the weight and its forward scale, both fixed for the whole forward, so TransformerLayer makes
them beside the core attention (compute-bound, its blocks leave room for another kernel's),
each with an event of its own, so that the projection, which comes first, waits for its own cast
only. Each module's forward takes its cast (`take`, through base.fp8_weight) when it still is the
one that forward would make: the same weight tensor at the same version, the same recipe state
and autocast step (scales change only between steps), a plain call (no checkpoint record or
replay, no microbatch cache). Otherwise it is dropped and the forward casts as usual. Only
DelayedScaling casts are made ahead (the scale is the module's state, made by an earlier call);
the cast writes the weight's amax into the module's history, as the module's own cast would. A
cast left untaken is joined at the autocast's exit (side_stream.join), so a graph capture of the
forward still ends joined.
"""
from __future__ import annotations

import torch

from ..library.cast import cast as _cast, transposed
from ..quantization import FP8GlobalState
from ..recipe_state import _recipe_key
from . import side_stream

# casts handed to a module's forward so far, and those of them whose transpose the forward then
# made in line (read by the tests: the path must not go unused, nor leave work in line)
taken = 0
transposed_late = 0


class _Cast:
    __slots__ = ("weight", "version", "rs", "step", "data", "data_t", "scale_inv", "event")


# The casts made here are launched in bands of rows of about this many 128 x 128 tiles (0: one
# launch each). A launch queues all its thread blocks at once, and the GPU hands them out before
# those of main-stream kernels that become ready later, which then wait for the whole launch;
# between two bands they get the SMs first. Two H200s, GPT block at
# TP=2 + SP replayed from CUDA graphs, same run, alternating order: 2.990 ms per FP8 step with
# one launch per cast, 2.953 in bands of 256 tiles, 2.942 in bands of 384 (16 repeats each;
# bands of 128 were slower than one launch); in another run 2.939 against 2.910 (14 repeats),
# and banding the gathered inputs' transposes too made no further difference (2.909).
band_tiles = 384


def _band_rows(weight) -> int:
    if band_tiles <= 0:
        return 0
    col_tiles = -(-weight.shape[1] // 128)
    return max(1, band_tiles // col_tiles) * 128


def applies(module, weight) -> bool:
    """Whether a cast of weight made now is the one the module's next forward would make."""
    s = FP8GlobalState
    if not (s.enabled and s.recompute_phase == 0 and s.recipe is not None
            and s.recipe.delayed()):
        return False
    # a plain tensor only: not a Float8Tensor, nor a DTensor shard (FSDP2 gathers it later)
    if (type(weight) not in (torch.Tensor, torch.nn.Parameter) or weight.dim() != 2
            or not weight.is_contiguous() or not side_stream.usable(weight)):
        return False
    rs = getattr(module, "_fp8_state", None)
    return (rs is not None and rs.delayed and rs.device == weight.device
            and rs.key == _recipe_key(s.recipe))


def cast_beside(items) -> None:
    """Casts each (module, weight, slot) of items that `applies` on the side stream of its
    device, from the current stream's work so far, for the module's next forward (with the
    transpose the backward's dgrad reads when grad mode is on, as the module's own forward,
    called next with the same grad mode, would)."""
    items = [(m, w, slot) for m, w, slot in items if w is not None and applies(m, w)]
    if not items:
        return
    device = items[0][1].device
    main = torch.cuda.current_stream(device)
    capturing = torch.cuda.is_current_stream_capturing()
    side = side_stream.side(device)
    side.wait_stream(main)
    made = []
    with torch.cuda.stream(side):
        for module, weight, slot in items:
            entry = _Cast()
            entry.data, entry.data_t, entry.scale_inv = _cast(
                module._fp8_state, weight, True, slot, torch.is_grad_enabled(),
                band_rows=_band_rows(weight))
            entry.weight, entry.version, entry.rs = weight, weight._version, module._fp8_state
            # the scales change only between autocast steps: a cast of another step is stale
            entry.step = FP8GlobalState.step
            # an event per cast: the first reader (the projection) waits for its own cast
            # only, while the later ones (FC1's, FC2's) run on beside its GEMM and exchange
            entry.event = torch.cuda.Event()
            entry.event.record(side)
            made.append((module, slot, entry))
    for module, slot, entry in made:
        if not capturing:
            # made on the side stream, read and freed on the main one: the allocator must not
            # hand their memory to later side-stream work before the main stream is done
            for t in (entry.data, entry.data_t, entry.scale_inv):
                if t is not None:
                    t.record_stream(main)
        module.__dict__.setdefault("_fp8_weights_beside", {})[slot] = entry
    # the side stream runs in order: the last cast's event covers every cast made here
    side_stream.pending(device, made[-1][2].event)


def waiting(module, slot: int) -> bool:
    """Whether a cast made beside waits for the module's next forward in slot."""
    ahead = module.__dict__.get("_fp8_weights_beside") if module is not None else None
    return bool(ahead) and slot in ahead


def cast_first(module, slot: int, cast_weight):
    """cast_weight() now, ahead of the input's norm or cast, when the forward casts the weight
    itself; None when a cast made beside waits in slot (taken where the GEMM reads it, so that
    the input's work does not wait for it). A sequence-parallel gather's copy then starts after
    the input's rows are made and runs under the first GEMM block. Cast after them, the weight
    held that block back while the copy, begun under the cast, slowed the memset cuBLASLt
    queues before its kernel: the QKV GEMM of the GPT block at TP=2 + SP on two H200s started
    13-15 us after the cast ended, against 3 us when no copy ran."""
    return None if waiting(module, slot) else cast_weight()


def take(module, weight, fi, slot: int, need_transpose: bool):
    """(data, data_t, scale_inv) of the cast made beside for this call, or None (none made, or it
    no longer fits: the caller casts). Any cast made beside for the slot is dropped."""
    ahead = module.__dict__.get("_fp8_weights_beside") if module is not None else None
    entry = ahead.pop(slot, None) if ahead else None
    if (entry is None or entry.weight is not weight or entry.version != weight._version
            or entry.rs is not fi.rs or entry.step is not fi.step or fi.replay is not None
            or fi.record is not None):
        return None
    global taken, transposed_late
    taken += 1
    torch.cuda.current_stream(weight.device).wait_event(entry.event)
    data_t = entry.data_t
    if need_transpose and data_t is None:
        transposed_late += 1
        data_t = transposed(entry.data)
    return entry.data, data_t, entry.scale_inv
