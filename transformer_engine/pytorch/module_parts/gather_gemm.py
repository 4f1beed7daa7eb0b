"""A column-parallel GEMM over rows that the sequence-parallel all-gather is still bringing.

With sequence parallelism the column-parallel modules gather their GEMM input's rows from
every rank before their first GEMM. Rather than waiting for the gather, the GEMM runs on the rows
this rank already holds while the collective is in flight (NCCL runs it on its own stream), then
on the other ranks' rows once they land; each block writes its rows of the one output buffer in
place, so the output is the unsplit GEMM's, in rank order, with no copy. The gather then hides
under this rank's block (for two ranks, half the GEMM). On a backend that cannot run the gather
asynchronously it completes first and the blocks run back to back, with the same results.

Both gathers fit: `PendingRows` (high precision, started here) and the FP8 one of
sequence_parallel_fp8 (`PendingFP8Rows`); each holds this rank's rows (`local`), its rank and the
gathered buffer (`data`), valid after `wait()`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..collectives import get_distributed_rank


class PendingRows:
    """A high-precision all-gather of every rank's rows in flight: wait() returns the gathered
    rows (rank order)."""
    __slots__ = ("local", "data", "handle", "rank")

    def __init__(self, local, data, handle, rank):
        self.local, self.data, self.handle, self.rank = local, data, handle, rank

    def wait(self) -> torch.Tensor:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        return self.data


def start_gather_rows(local: torch.Tensor, tp) -> PendingRows:
    """Starts the all-gather along dim 0 of this rank's rows over tp.group (async on NCCL)."""
    local = local.contiguous()
    out = torch.empty((tp.size * local.shape[0],) + tuple(local.shape[1:]), dtype=local.dtype,
                      device=local.device)
    if dist.get_backend(tp.group) == "nccl":
        handle = dist.all_gather_into_tensor(out, local, group=tp.group, async_op=True)
    else:  # gloo has no single-tensor gather: views of `out`, done on return
        dist.all_gather(list(out.chunk(tp.size, dim=0)), local, group=tp.group)
        handle = None
    return PendingRows(local, out, handle, get_distributed_rank(tp.group))


def fp8_blocks_fit(pending) -> bool:
    """Whether an FP8 GEMM can run on each rank's block of rows (FP8 GEMMs need every
    dimension a multiple of 16, so the block too; otherwise the whole gather is awaited)."""
    return pending.local is not None and pending.local.shape[0] % 16 == 0


def gemm_over_gather(pending, outs: Sequence[torch.Tensor],
                     gemm: Callable[[torch.Tensor, list], None]):
    """Runs gemm(rows, [out blocks]) on this rank's rows, then on the others' once gathered; each
    block of `outs` (row-aligned with the gathered rows) is written by the call that computes it.
    Returns what pending.wait() returns (the gathered rows, with their FP8 transpose for the FP8
    gather)."""
    rows = pending.local.shape[0]
    lo, hi = pending.rank * rows, (pending.rank + 1) * rows
    gemm(pending.local, [o[lo:hi] for o in outs])
    arrived = pending.wait()
    full = pending.data
    if lo > 0:
        gemm(full[:lo], [o[:lo] for o in outs])
    if hi < full.shape[0]:
        gemm(full[hi:], [o[hi:] for o in outs])
    return arrived
