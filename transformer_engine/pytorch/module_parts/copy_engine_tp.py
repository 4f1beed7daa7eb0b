"""Sequence-parallel collectives moved by the GPUs' copy engines, interleaved with the GEMMs that
consume or produce them (torch's symmetric memory, torch.distributed._symmetric_memory).

Why not NCCL here: an NCCL all-gather or send/recv running beside a GEMM needs streaming
multiprocessors of its own, and a GEMM that fills the GPU leaves it none, so the two mostly take
turns and little communication hides. Symmetric memory maps each peer's workspace into this
process; a transfer is then a device-to-device copy, which the copy engines run without taking
SMs, while the GEMM blocks run on two streams. This is the transport behind torch's own
fused all-gather-matmul and matmul-reduce-scatter; here its pipelines take our GEMMs (high
precision or FP8, bias and output blocks as the modules need): on two ranks pipelines of our
own on the same workspace, barriers and copies, with fewer barriers (below), on more ranks the
two pipeline functions torch exposes. Where they are missing, the group is not NCCL on CUDA, or
a graph capture would need a larger workspace than the one already made, `usable` is False and
the caller keeps NCCL.

Every rank reaches the same answer from the same facts (shapes, group, capture state and the
workspace's size, which every rank grows alike), so no rank takes this path while a peer waits
in NCCL.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...common import config

try:  # absent from CPU-only and older builds of torch
    from torch.distributed import _symmetric_memory as _symm
except ImportError:  # pragma: no cover - depends on the torch build
    _symm = None

# pipelines run so far, by kind, and of them those run by the two-rank schedules below (read by
# the tests: on NVLink peers the copy-engine schedules must take this path, not fall back to
# NCCL unnoticed)
transfers = {"gather": 0, "reduce_scatter": 0, "gather_pair": 0, "reduce_scatter_pair": 0}

_PIPELINES = ("_pipelined_all_gather_and_consume", "_pipelined_produce_and_all2all",
              "get_symm_mem_workspace", "_get_backend_stream")


def available() -> bool:
    """Whether this torch has the symmetric-memory pipelines."""
    return _symm is not None and all(hasattr(_symm, name) for name in _PIPELINES)


def _workspace_bytes(group_name: str) -> int:
    tensor = getattr(_symm, "_group_name_to_workspace_tensor", {}).get(group_name)
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def usable(t: torch.Tensor, tp, nbytes: int) -> str | None:
    """The group's name when a copy-engine pipeline moving nbytes per rank can run for tensor t
    on tp.group, else None. Under graph capture the workspace cannot grow: an eager call of the
    same shapes (the warm-up before a capture) must have made it large enough."""
    if not t.is_cuda or not available() or torch.compiler.is_compiling():
        return None
    if dist.get_backend(tp.group) != "nccl":
        return None
    name = tp.group.group_name
    if torch.cuda.is_current_stream_capturing() and _workspace_bytes(name) < nbytes:
        return None
    return name


def chosen(t: torch.Tensor, tp, nbytes: int) -> str | None:
    """usable(), when NVTE_TP_OVERLAP asks for the copy engines here ("graphs", the default: under
    CUDA-graph capture; "1": always) outside a traced graph, else None. Under "graphs" an
    eager call still grows the workspace to nbytes (a collective, which every rank reaches
    alike): the capture that may follow cannot, and the warm-up calls before a capture are
    eager ones of the same shapes."""
    mode = config.tp_overlap()
    if torch.compiler.is_compiling() or mode not in ("1", "graphs"):
        return None
    name = usable(t, tp, nbytes)
    capturing = t.is_cuda and torch.cuda.is_current_stream_capturing()
    if name is not None and mode == "graphs" and not capturing:
        if _workspace_bytes(name) < nbytes:
            _symm.get_symm_mem_workspace(name, min_size=nbytes)
        return None
    return name


def gather_and_consume(local: torch.Tensor, out: torch.Tensor, group_name: str,
                       consume: Callable[[torch.Tensor, int], None] | None,
                       begun: "BegunGather | None" = None) -> torch.Tensor:
    """All-gathers local (this rank's rows) into out (every rank's rows, rank order) while
    consume(rows, src_rank) runs on each rank's rows as they land: this rank's first, then each
    peer's on alternating streams right after its copy. begun: what begin_gather returned for
    these tensors (the transfer already under way); consume None (with begun): only the gather.
    Returns out."""
    if begun is None:
        begun = begin_gather(local, out, group_name)
    if begun is not None:
        _finish_gather_pair(begun, consume)
    else:
        _symm._pipelined_all_gather_and_consume(local, consume, out, group_name)
    transfers["gather"] += 1
    return out


def produce_and_reduce_scatter(rows: int, cols: int, world: int, dtype: torch.dtype,
                               device: torch.device, group_name: str,
                               produce: Callable[[int, torch.Tensor], None]) -> torch.Tensor:
    """This rank's rows of the sum over ranks of each rank's partial product: produce(r, out)
    writes this rank's partial sums for rank r's rows into out (rows x cols); the peers' blocks
    are produced first and copied to their owners while the next block is produced, this
    rank's own block last. The ranks' partial sums are added in rank order."""
    stacked = torch.empty(world * rows, cols, dtype=dtype, device=device)
    transfers["reduce_scatter"] += 1
    if world == 2 and stacked.is_cuda:
        return _reduce_scatter_pair(stacked, group_name, produce)
    # torch's pipeline runs each block on one of two streams, so the peer's block and this
    # rank's share the SMs and end together, and the peer's copy waits for both. Each block
    # here waits for the one before it: the peer's block ends in half the time and its copy
    # runs on the copy engines under this rank's block (two H100s, GPT block FC2: the 49 us
    # copy of its 2048 x 4096 bf16 block went from after both GEMMs to under the second)
    done = []

    def in_turn(r: int, out: torch.Tensor) -> None:
        if done:
            torch.cuda.current_stream().wait_event(done[-1])
        produce(r, out)
        event = torch.cuda.Event()
        event.record()
        done.append(event)
    _symm._pipelined_produce_and_all2all(in_turn if stacked.is_cuda else produce, stacked,
                                         group_name)
    return stacked.view(world, rows, cols).sum(dim=0)


# Two ranks on CUDA, in place of torch's pipelines (same transport: the group's symmetric-memory
# workspace, its barriers, the copy engines). torch's open with a barrier (the peer is done
# reading this rank's workspace) and close with one or two. Every pipeline on a group's
# workspace, torch's and these, closes with a barrier that each rank reaches only after its
# reads of the peer's workspace, so an opening one repeats what the last closing one settled:
# these have none. Left in each: one barrier between this rank's writes and the peer's reads,
# and the closing one, off the caller's stream: the reduce-scatter runs it beside its add, the
# gather right after its copy, beside this rank's block (on the caller's stream after both
# blocks it held back the kernel that followed, the core attention after the QKV GEMM, by 10-20
# us; two H200s, kernel timeline, graphed GPT block at TP=2 + SP). Two H200s, GPT block at
# TP=2 + SP replayed from CUDA graphs, same run, three repeats each: 4.499 -> 4.441 ms per BF16
# step, 3.022 -> 2.957 ms per FP8 step. A gather begins when its rows are made, its barrier
# queued before the caller's next kernels (the first GEMM block): same run on two H200s, four
# repeats each, 2.936 -> 2.913 ms per FP8 step (2.968 -> 2.938 in a second run; BF16 4.428
# either way; the same bits). A weight cast made in line goes before the rows are made
# (weight_cast_beside.cast_first): with the copy under it, cuBLASLt's memset before the first
# block ran late.

class BegunGather:
    """A two-rank gather under way (begin_gather): this rank's rows are in its workspace and
    the peer's are being copied into `theirs` on the pipelines' stream."""
    __slots__ = ("ws", "local", "mine", "theirs", "rank", "aside")

    def __init__(self, ws, local, mine, theirs, rank, aside):
        self.ws, self.local, self.mine, self.theirs = ws, local, mine, theirs
        self.rank, self.aside = rank, aside


def begin_gather(local: torch.Tensor, out: torch.Tensor, group_name: str) -> BegunGather | None:
    """Starts the gather of local into out on two CUDA ranks as soon as local is made, so that
    its barrier and the peer's copy run under what the caller queues next (the first GEMM
    block) rather than in front of it; None elsewhere (gather_and_consume runs
    torch's pipeline). The workspace stays this gather's until gather_and_consume finishes it:
    the caller runs no other pipeline on the group in between."""
    if not (local.is_cuda and out.shape[0] == 2 * local.shape[0]):
        return None
    ws = _symm.get_symm_mem_workspace(group_name, min_size=local.numel() * local.element_size())
    rank = ws.rank
    peer, rows = 1 - rank, local.shape[0]
    current = torch.cuda.current_stream()
    ws.get_buffer(rank, local.shape, local.dtype, 0).copy_(local)
    aside = _symm._get_backend_stream()
    aside.wait_stream(current)
    theirs = out[peer * rows:(peer + 1) * rows]
    with torch.cuda.stream(aside):
        # queued before anything the caller launches next, so it gets an SM before a GEMM
        # block takes them all
        ws.barrier(channel=1)  # both ranks' rows are in their workspaces
        theirs.copy_(ws.get_buffer(peer, local.shape, local.dtype, 0))
        # each rank has read the other's workspace: free for the next pipeline, which the
        # finish orders after this stream. Closed here, beside this rank's block, rather than
        # on the caller's stream after both blocks, where the next kernel (the core attention
        # after the QKV GEMM) waited for it
        ws.barrier(channel=0)
    return BegunGather(ws, local, out[rank * rows:(rank + 1) * rows], theirs, rank, aside)


def _finish_gather_pair(begun: BegunGather, consume) -> None:
    current, aside = torch.cuda.current_stream(), begun.aside
    if consume is not None:
        aside.wait_stream(current)  # what the peer's block reads besides its rows (the weight)
        consume(begun.local, begun.rank)
        with torch.cuda.stream(aside):
            consume(begun.theirs, 1 - begun.rank)
    begun.mine.copy_(begun.local)  # under the peer's block
    current.wait_stream(aside)  # the peer's block, and the closing barrier before it
    transfers["gather_pair"] += 1


def _reduce_scatter_pair(stacked, group_name, produce) -> torch.Tensor:
    rows = stacked.shape[0] // 2
    shape, dtype = (rows,) + tuple(stacked.shape[1:]), stacked.dtype
    ws = _symm.get_symm_mem_workspace(group_name, min_size=stacked[:rows].numel()
                                      * stacked.element_size())
    rank = ws.rank
    peer = 1 - rank
    current = torch.cuda.current_stream()
    aside = _symm._get_backend_stream()
    aside.wait_stream(current)
    made, copied = torch.cuda.Event(), torch.cuda.Event()
    with torch.cuda.stream(aside):
        produce(peer, ws.get_buffer(rank, shape, dtype, 0))  # the peer's rows, for it to read
        made.record()
        ws.barrier(channel=1)
        stacked[peer * rows:(peer + 1) * rows].copy_(ws.get_buffer(peer, shape, dtype, 0))
        copied.record()
        ws.barrier(channel=0)  # the peer has read this rank's workspace
    # queued after the barrier, which so gets an SM before this block takes them all, and the
    # copy runs under the block
    current.wait_event(made)
    produce(rank, stacked[rank * rows:(rank + 1) * rows])
    current.wait_event(copied)
    parts = stacked.view(2, rows, *shape[1:])
    # one elementwise add: torch's reduction over a leading dim of two runs at half the
    # bandwidth (37 us against 19 us for two 2048 x 4096 bf16 blocks on an H100); a sum of two
    # terms rounds once either way, so the bits are the same
    summed = torch.add(parts[0], parts[1])
    current.wait_stream(aside)
    transfers["reduce_scatter_pair"] += 1
    return summed
