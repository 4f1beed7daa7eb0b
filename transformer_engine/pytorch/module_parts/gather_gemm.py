"""Sequence-parallel GEMMs that hide their all-gather / reduce-scatter under row blocks.

Column side: with sequence parallelism the column-parallel modules gather their GEMM input's
rows from every rank before their first GEMM. Rather than waiting for the gather, the GEMM runs
on the rows this rank already holds while the others are in flight, then on each rank's rows as
they land; each block writes its rows of the one output buffer in place, so the output is the
unsplit GEMM's, in rank order, with no copy. Row side: a row-parallel GEMM's product is a partial
sum that the ranks reduce-scatter; the peers' row blocks are multiplied and sent first, this
rank's own block hides their exchange, and the partial sums add.

The transfers (NVTE_TP_OVERLAP, common/config.py): the GPUs' copy engines through symmetric
memory (copy_engine_tp.py) where torch has it and the group is NCCL on CUDA (with "graphs", only
while a CUDA graph is captured; its eager calls run each GEMM whole); otherwise NCCL
(an async all-gather; point-to-point for the row side with two ranks). On a backend that cannot
run the gather asynchronously (gloo) it completes first and the blocks run back to back, with
the same results. NVTE_TP_OVERLAP=0 runs each GEMM whole next to its collective.

Both gathers fit the column side: `PendingRows` (high precision, made here) and the FP8 one of
sequence_parallel_fp8 (`PendingFP8Rows`); each holds this rank's rows (`local`), its rank and the
gathered buffer (`data`), valid after `wait()`. A gather the copy engines move begins when
its rows are made (on two ranks: copy_engine_tp.begin_gather), so that it runs under this
rank's block; gemm_over_gather runs the GEMM's blocks over it (a `wait()` finishes it alone).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from ..collectives import all_gather_single, get_distributed_rank, reduce_scatter_first_dim
from ...common import config
from . import copy_engine_tp


def _mode() -> str:
    """"0" (whole GEMMs), "1" (blocks, copy engines where they run), "graphs" (blocks with the
    copy engines under graph capture, whole GEMMs in eager calls) or "nccl" (blocks, NCCL);
    "0" inside a traced graph, whose collectives are synchronous."""
    return "0" if torch.compiler.is_compiling() else config.tp_overlap()


def _overlap() -> bool:
    """Whether GEMMs run in row blocks now. Under "graphs" an eager call runs them whole: a split
    eager step is host-bound, and each block is one more launch, event and stream switch on
    every call, while a graph replay pays none. GPT block at TP=2 + SP on two H200s, eager, in
    each of six benchmark runs the whole GEMMs were faster than the blocks over NCCL: FP8
    5.03-8.02 ms per step against 5.86-9.71, BF16 4.95-5.66 against 5.36-6.37."""
    mode = _mode()
    if mode == "graphs":
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return mode != "0"


class PendingRows:
    """A high-precision all-gather of every rank's rows in flight: wait() returns the gathered
    rows (rank order)."""
    __slots__ = ("local", "data", "handle", "rank", "group", "copy_engine", "begun")

    def __init__(self, local, data, handle, rank, group=None, copy_engine=None):
        self.local, self.data, self.handle, self.rank = local, data, handle, rank
        # copy_engine: the group's name while the gather waits for gemm_over_gather to run it
        # with the copy engines; a wait() before that finishes it without the GEMM (or, when
        # the copy engines have not begun it, gathers through NCCL)
        self.group, self.copy_engine = group, copy_engine
        self.begun = None  # copy_engine_tp.begin_gather's transfer, under way since made

    def wait(self) -> torch.Tensor:
        if self.copy_engine is not None:
            finish_copy_engine_gather(self)
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        return self.data


def start_gather_rows(local: torch.Tensor, tp) -> PendingRows:
    """Starts the all-gather along dim 0 of this rank's rows over tp.group (async on NCCL,
    outside a traced graph), or leaves it to gemm_over_gather when the copy engines will move
    it there."""
    local = local.contiguous()
    out = torch.empty((tp.size * local.shape[0],) + tuple(local.shape[1:]), dtype=local.dtype,
                      device=local.device)
    if local.shape[0] > 0:
        name = copy_engine_tp.chosen(local, tp, local.numel() * local.element_size())
        if name is not None:
            pending = PendingRows(local, out, None, get_distributed_rank(tp.group), tp.group, name)
            pending.begun = copy_engine_tp.begin_gather(local, out, name)
            return pending
    if dist.get_backend(tp.group) == "nccl":
        # a traced call waits here (no async handle inside a graph)
        handle = all_gather_single(out, local, group=tp.group,
                                   async_op=not torch.compiler.is_compiling())
    else:  # gloo has no single-tensor gather: views of `out`, done on return
        dist.all_gather(list(out.chunk(tp.size, dim=0)), local, group=tp.group)
        handle = None
    return PendingRows(local, out, handle, get_distributed_rank(tp.group))


def finish_copy_engine_gather(pending) -> None:
    """Completes a gather that gemm_over_gather was to run with the copy engines, without a
    GEMM: the begun transfer is finished, one not begun goes through NCCL."""
    if pending.begun is not None:
        copy_engine_tp.gather_and_consume(pending.local.view(torch.uint8),
                                          pending.data.view(torch.uint8), pending.copy_engine,
                                          None, pending.begun)
    else:
        all_gather_single(pending.data.view(torch.uint8), pending.local.view(torch.uint8),
                          group=pending.group)
    pending.copy_engine = pending.begun = None


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
    if getattr(pending, "copy_engine", None) is not None:
        rows, dtype = pending.local.shape[0], pending.local.dtype

        # FP8 rows travel as bytes (the pipelines copy any dtype; bytes keep them to one)
        def consume(block, src):
            gemm(block.view(dtype), [o[src * rows:(src + 1) * rows] for o in outs])
        name, begun = pending.copy_engine, pending.begun
        pending.copy_engine = pending.begun = None
        copy_engine_tp.gather_and_consume(pending.local.view(torch.uint8),
                                          pending.data.view(torch.uint8), name, consume, begun)
        return pending.wait()  # the gathered rows (FP8: with their transpose, made now)
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
                        gemm: Callable[..., None], block_multiple: int = 1,
                        bias: torch.Tensor | None = None,
                        addend: torch.Tensor | None = None) -> torch.Tensor:
    """This rank's rows of reduce_scatter(gemm(x)) (+ bias) (+ addend) over tp.group, for a
    row-parallel GEMM whose product on each rank is a partial sum: x holds every row;
    gemm(rows, out, bias, addend) writes rows' product (+ bias) (+ addend) into out. The peers'
    blocks are multiplied first and sent while the next block is multiplied, this rank's block
    last, and the partial sums for this rank's rows add: by the copy engines for any group size
    where they run, else with two ranks point-to-point on the group (a two-term sum is the same
    in either order). Otherwise, and for blocks whose rows are not a multiple of block_multiple
    (FP8 GEMMs need 16), everything is multiplied, then reduce-scattered.
    bias ([out_cols]) and addend (this rank's rows, [rows, out_cols], a residual) are added
    once, by the GEMM of this rank's block (its epilogue and C operand, so no separate adds),
    or after the reduce-scatter where the GEMM runs whole."""
    world = tp.size
    rows = x.shape[0] // world
    blocks = rows > 0 and rows % block_multiple == 0 and _mode() != "0"
    if blocks:
        # under "graphs" an eager call grows the workspace for the capture that may follow
        name = copy_engine_tp.chosen(x, tp, 2 * rows * out_cols * torch.finfo(dtype).bits // 8)
        blocks = _overlap()
        if name is not None:
            rank = get_distributed_rank(tp.group)

            def produce(r, out):
                own = r == rank
                gemm(x[r * rows:(r + 1) * rows], out, bias if own else None,
                     addend if own else None)
            return copy_engine_tp.produce_and_reduce_scatter(rows, out_cols, world, dtype,
                                                             x.device, name, produce)
    if world != 2 or not blocks:
        full = torch.empty((x.shape[0], out_cols), dtype=dtype, device=x.device)
        gemm(x, full, None, None)
        y = reduce_scatter_first_dim(full, tp.group)
        if bias is not None:
            y = y.add_(bias)
        return y if addend is None else y.add_(addend)
    rank = get_distributed_rank(tp.group)
    peer = dist.get_global_rank(tp.group, 1 - rank)
    theirs = x[(1 - rank) * rows:(2 - rank) * rows]
    mine = x[rank * rows:(rank + 1) * rows]
    send = torch.empty((rows, out_cols), dtype=dtype, device=x.device)
    gemm(theirs, send, None, None)
    recv = torch.empty_like(send)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer, tp.group),
                                       dist.P2POp(dist.irecv, recv, peer, tp.group)])
    out = torch.empty_like(send)
    gemm(mine, out, bias, addend)
    for request in requests:
        request.wait()
    return out.add_(recv)
