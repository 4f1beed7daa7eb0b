"""The side stream (one per device) that parts of an FP8 sequence-parallel forward run on,
beside main-stream work that does not depend on them, and the join that orders them before
their readers:

- `transpose_beside`: the transpose of a column-parallel GEMM's gathered FP8 input, which only
  the backward's weight gradient reads. In line it sits between the gather and what follows
  (the attention, the activation); beside, the first one runs under the core attention;
- the weight casts that TransformerLayer makes beside its core attention
  (weight_cast_beside.py).

Both apply while a CUDA graph is captured, and to eager calls under NVTE_TP_OVERLAP=1
(`usable`). Every piece is registered (`pending`) and joined (`join`) before anything can read
it: when the outermost FP8 autocast exits (so that a CUDA graph capture of the forward also ends
joined), at the top of each FP8 backward (a backward run inside the autocast), and, for a weight
cast, by the forward that takes it. The kernels are the in-line ones on the same bytes, so the
results are bit-identical to the in-line order (tests/distributed/test_fp8_step_overlap_nccl.py).
On two H200s, GPT block at TP=2 + SP replayed from CUDA graphs, same-run A/B: the FP8 step took
3.05 ms with everything in line and 2.96 ms with this work and the forward's amax update
(update_stream.py) beside the main stream. Other placements measured no gain over this one
(two H200s, same code built twice, three alternating runs each: 3.048 ms mean against 3.030):
the QKV weight's cast beside the input's norm and gather, FC1's beside the projection's
reduce-scatter, the transposes of FC1's gathered input after the activation, of the
projection's input beside its GEMM blocks and of the backward's gathered FC2 output gradient
beside FC1's dgrad; the activation's transpose beside FC2 slowed FC2's blocks by more than it
took off the critical path. The QKV cast measured no gain either with the QKV GEMM's blocks, not
the gather's start, waiting for it (same run, three repeats each: 3.002 ms with, 3.002 without).
What the side casts cost, from a kernel timeline: the GPU hands out the thread blocks of a
kernel already queued before those of one that becomes ready later, so FC1's and FC2's casts,
which get SMs only as the core attention drains, held back the attention output's cast and the
projection's reduce-scatter behind them when each was one launch (idle gaps of 22 and 23 us on
that path between the attention's end and the projection's first block); they now launch in
bands of rows (weight_cast_beside.band_tiles), between which those kernels get the SMs.
"""
from __future__ import annotations

import torch

from ...common import config
from ..kernels import eager
from ..kernels.cast import transpose_unchecked

# switched off by callers that compare against the in-line order
enabled = True
# side-stream work launched so far, by kind (read by the tests: a silent fallback to the
# in-line order would pass the numerics)
runs = {"transpose": 0}

_STREAMS: dict = {}
_PENDING: list = []  # (device index, event) of side-stream work not joined yet


def side(device: torch.device, role: str = "forward") -> torch.cuda.Stream:
    """The side stream of device for role (one per device and role, made on first use): the
    forward's transposes and weight casts here, the step's amax updates (update_stream.py) on
    their own."""
    key = (role, device.index)
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.Stream(device)
    return stream


def usable(t: torch.Tensor) -> bool:
    """Whether side-stream work applies to a call on t now: a CUDA tensor outside torch.compile,
    while a CUDA graph is captured or under NVTE_TP_OVERLAP=1. Eager calls under the default
    (NVTE_TP_OVERLAP=graphs) keep the in-line order, as they run each GEMM whole: a split step
    is host-bound there, and the side stream's events and stream switches are host time paid
    on every call, where a graph pays them once."""
    if not (enabled and t.is_cuda) or torch.compiler.is_compiling():
        return False
    return torch.cuda.is_current_stream_capturing() or config.tp_overlap() == "1"


def transpose_beside(data: torch.Tensor):
    """data.T (2-D FP8 bytes) as a new contiguous tensor whose transpose runs on the side
    stream once the current stream's work so far is done; None where it cannot (the caller
    transposes in line). Readers must `join` first."""
    if not (usable(data) and data.dim() == 2 and eager.native_call(data) is not None):
        return None
    main = torch.cuda.current_stream(data.device)
    out = torch.empty((data.shape[1], data.shape[0]), dtype=data.dtype, device=data.device)
    aside = side(data.device)
    aside.wait_stream(main)
    with torch.cuda.stream(aside):
        transpose_unchecked(eager.native_call(data), data, out)
    if not torch.cuda.is_current_stream_capturing():
        # both were made on the main stream: a free there must not hand their memory to new
        # work before the side stream is done with it (under capture the join at the
        # autocast's exit orders the graph)
        data.record_stream(aside)
        out.record_stream(aside)
    event = torch.cuda.Event()
    event.record(aside)
    pending(data.device, event)
    runs["transpose"] += 1
    return out


def pending(device: torch.device, event: torch.cuda.Event) -> None:
    """Registers side-stream work (done when event has passed) for the next `join`."""
    _PENDING.append((device.index, event))


def join() -> None:
    """The current stream of each device waits for all side-stream work registered so far (the
    transposes, and weight casts no forward took: weight_cast_beside.py)."""
    if not _PENDING:
        return
    for index, event in _PENDING:
        torch.cuda.current_stream(index).wait_event(event)
    _PENDING.clear()
