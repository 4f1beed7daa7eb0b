"""Where a DelayedScaling step's amax reductions and scale updates run when they reduce over a
process group: on a side stream, beside the work that follows them, rather than in line.

The reduction is a collective, so in line it costs the all-reduce plus however long the other
ranks take to reach it, with the SMs idle meanwhile; and nothing that runs after it in its pass
reads what the update writes (the casts that read the scales are done, the GEMMs read the
scale_inv each cast made for its own output). Two points qualify (quantization.py):

- the backward update, made once the step's last backward launched its last cast
  (`quantization.backward_casts_done`): the rest of that backward (its GEMMs, the first layer's
  LayerNorm backward, the gradients' accumulation) runs beside it, and the backward's stream
  waits for it when the backward ends (an autograd final callback). On two H100s, the GPT
  block at TP=2 + SP replayed from graphs: the all-reduce, its copies and the update (about 45
  us in line) run beside the backward, and the step takes about 0.05 ms less. Made after the
  last backward's GEMMs instead, as before, it ran under the LayerNorm backward and outlasted
  it: the step's end (a graph replay ends with its last node) waited about 30 us for it
  (kernel timeline of one rank, two H200s);
- the forward update, made when the outermost autocast exits: it starts instead after the last
  forward cast of the step (`quantization.forward_casts_done`, called by LayerNormMLP after its
  FC2 weight cast) beside the last GEMM, and the stream waits for it at the exit
  (`forward_after_last_cast`).

Either way the next reader of the scales (the next step's first cast) comes after the wait, and
a CUDA-graph capture ends with the side stream joined.
"""
from __future__ import annotations

from typing import Callable

import torch

from .module_parts import side_stream

# updates run on the side stream so far, and backwards counted as finished at their last cast
# (read by the tests: a silent fallback to the in-line update would pass the numerics)
runs = {"beside_backward": 0, "after_event": 0, "backward_after_cast": 0}
# the forward update started after the step's last forward cast (quantization.forward_casts_done)
forward_after_last_cast = True
# the backward update started after the last backward's last cast, before its GEMMs
# (quantization.backward_casts_done), rather than when that backward finishes
backward_after_last_cast = True


def beside_backward(update: Callable[[], None], device: torch.device) -> None:
    """update() on the side stream of device, joined when the running backward ends; in line
    off CUDA, under tracing, or when no backward is running."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        update()
        return
    side = side_stream.side(device, "update")
    try:
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: torch.cuda.current_stream(device).wait_stream(side))
    except RuntimeError:  # no backward running (backward_finished called directly)
        update()
        return
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        update()
    runs["beside_backward"] += 1


def after_event(update: Callable[[], None], event: torch.cuda.Event,
                device: torch.device) -> None:
    """update() on the side stream of device once event (recorded on the current stream) has
    passed, then the current stream waits for it."""
    side = side_stream.side(device, "update")
    side.wait_event(event)
    with torch.cuda.stream(side):
        update()
    torch.cuda.current_stream(device).wait_stream(side)
    runs["after_event"] += 1
