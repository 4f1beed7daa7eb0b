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

from ..collectives import get_distributed_rank, reduce_scatter_first_dim
from ...common import config


def _overlap() -> bool:
    """Whether GEMM blocks hide the collective: not inside a traced graph (its collectives are
    synchronous there) and not under NVTE_TP_OVERLAP=0, which runs each GEMM whole next to its
    collective (the same results, nothing hidden: the schedule to compare against)."""
    return not torch.compiler.is_compiling() and config.tp_overlap()


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
    """Starts the all-gather along dim 0 of this rank's rows over tp.group (async on NCCL,
    outside a traced graph)."""
    local = local.contiguous()
    out = torch.empty((tp.size * local.shape[0],) + tuple(local.shape[1:]), dtype=local.dtype,
                      device=local.device)
    if dist.get_backend(tp.group) == "nccl":
        # a traced call waits here (no async handle inside a graph)
        handle = dist.all_gather_into_tensor(out, local, group=tp.group,
                                             async_op=not torch.compiler.is_compiling())
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
    if not _overlap():
        arrived = pending.wait()
        gemm(pending.data, list(outs))
        return arrived
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


def gemm_reduce_scatter(x: torch.Tensor, tp, out_cols: int, dtype: torch.dtype,
                        gemm: Callable[[torch.Tensor, torch.Tensor], None],
                        block_multiple: int = 1) -> torch.Tensor:
    """This rank's rows of reduce_scatter(gemm(x)) over tp.group, for a row-parallel GEMM whose
    product on each rank is a partial sum: x holds every row; gemm(rows, out) writes rows' product
    into out. With two ranks the peer's block is multiplied first and sent while this rank's
    block is multiplied, and the peer's partial sums for this rank's rows arrive meanwhile
    (point-to-point on the group) and are added: the exchange hides under the second block, and
    a two-term sum is the same in either order. Other group sizes, and blocks whose rows are not
    a multiple of block_multiple (FP8 GEMMs need 16), multiply everything, then reduce-scatter."""
    world = tp.size
    rows = x.shape[0] // world
    if world != 2 or rows == 0 or rows % block_multiple or not _overlap():
        full = torch.empty((x.shape[0], out_cols), dtype=dtype, device=x.device)
        gemm(x, full)
        return reduce_scatter_first_dim(full, tp.group)
    rank = get_distributed_rank(tp.group)
    peer = dist.get_global_rank(tp.group, 1 - rank)
    theirs = x[(1 - rank) * rows:(2 - rank) * rows]
    mine = x[rank * rows:(rank + 1) * rows]
    send = torch.empty((rows, out_cols), dtype=dtype, device=x.device)
    gemm(theirs, send)
    recv = torch.empty_like(send)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer, tp.group),
                                       dist.P2POp(dist.irecv, recv, peer, tp.group)])
    out = torch.empty_like(send)
    gemm(mine, out)
    for request in requests:
        request.wait()
    return out.add_(recv)
