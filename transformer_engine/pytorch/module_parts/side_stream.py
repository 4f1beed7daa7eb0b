"""Pieces of an FP8 sequence-parallel forward that run on a side stream, beside work of the main
stream that does not depend on them:

- `transpose_beside`: the transpose of a column-parallel GEMM's gathered FP8 input, which only the
  backward's weight gradient reads. In line it sits between the gather and what follows (the
  attention, the activation); beside, it runs under them. Every such transpose is joined
  (`join`) before anything can read it: when the outermost FP8 autocast exits (so that a CUDA
  graph capture of the forward also ends joined) and at the top of each FP8 backward that
  consumes one (a backward run inside the autocast).
- `gather_beside_cast`: the copy-engine gather pipeline of an FP8 GEMM input started on the side
  stream as soon as the norm has written this rank's rows, while the main stream casts the
  weight; each GEMM block first waits for that cast. In line, the pipeline's opening barrier,
  copy into the symmetric workspace and second barrier wait behind the weight cast.

On two GPUs, GPT block at TP=2 + SP replayed from CUDA graphs, each moves about 10-15 us per
gather off the step's critical path; the transposes and GEMMs are the same kernels on the same
bytes, so the results are bit-identical to the in-line order (tests/distributed).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..kernels import eager
from ..kernels.cast import transpose_unchecked

# switched off by callers that compare against the in-line order
enabled = True
# side-stream work launched so far, by kind (read by the tests: a silent fallback to the
# in-line order would pass the numerics)
runs = {"transpose": 0, "gather": 0}

_STREAMS: dict = {}
_PENDING: list = []  # (stream index, event) of transposes not joined yet


def _side(device: torch.device) -> torch.cuda.Stream:
    stream = _STREAMS.get(device.index)
    if stream is None:
        stream = _STREAMS[device.index] = torch.cuda.Stream(device)
    return stream


def usable(t: torch.Tensor) -> bool:
    return enabled and t.is_cuda and not torch.compiler.is_compiling()


def transpose_beside(data: torch.Tensor):
    """data.T (2-D FP8 bytes) as a new contiguous tensor whose transpose runs on the side
    stream once the current stream's work so far is done; None where it cannot (the caller
    transposes in line). Readers must `join` first."""
    if not (usable(data) and data.dim() == 2 and eager.native_call(data) is not None):
        return None
    main = torch.cuda.current_stream(data.device)
    out = torch.empty((data.shape[1], data.shape[0]), dtype=data.dtype, device=data.device)
    side = _side(data.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        transpose_unchecked(eager.native_call(data), data, out)
    if not torch.cuda.is_current_stream_capturing():
        # both were made on the main stream: a free there must not hand their memory to new
        # work before the side stream is done with it (under capture the join at the
        # autocast's exit orders the graph)
        data.record_stream(side)
        out.record_stream(side)
    event = torch.cuda.Event()
    event.record(side)
    _PENDING.append((data.device.index, event))
    runs["transpose"] += 1
    return out


def join() -> None:
    """The current stream of each device waits for every transpose launched beside so far."""
    if not _PENDING:
        return
    for index, event in _PENDING:
        torch.cuda.current_stream(index).wait_event(event)
    _PENDING.clear()


def gather_beside_cast(ready: torch.cuda.Event, device: torch.device,
                       pipeline: Callable[[Callable], None],
                       consume: Callable[[torch.Tensor, int], None]) -> None:
    """Runs pipeline(wrapped consume) on the side stream from `ready` (recorded on the main
    stream when this rank's rows were written), each consume call first waiting for the main
    stream's work issued before the pipeline (the weight cast); the main stream then waits for
    the whole pipeline."""
    main = torch.cuda.current_stream(device)
    cast_done = torch.cuda.Event()
    cast_done.record(main)
    side = _side(device)
    side.wait_event(ready)

    def after_cast(block, src):
        torch.cuda.current_stream(device).wait_event(cast_done)
        consume(block, src)
    with torch.cuda.stream(side):
        pipeline(after_cast)
    main.wait_stream(side)
    runs["gather"] += 1
