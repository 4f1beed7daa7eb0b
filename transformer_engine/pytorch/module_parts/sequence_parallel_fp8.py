"""The sequence-parallel all-gather of a column-parallel FP8 GEMM's input, in FP8: each rank
quantises its own rows with a scale every rank shares, and only the 1-byte data travels (half
of BF16's traffic); the wgrad transpose is made from the gathered bytes, so the backward never
gathers again. Linear, LayerNormLinear and LayerNormMLP all gather through `start_fp8_gather`.

The scale must be the same on every rank, or the gathered rows would be read with another
rank's scale_inv:
  * Float8CurrentScaling: the amax of this rank's rows is all-reduced (MAX) over the
    tensor-parallel group on the device before the scale is made (`fp8_amax_group`), so the
    scale is that of the gathered tensor, as the unsplit module's.
  * DelayedScaling: the scale comes from the amax history, identical on every rank only when
    the step's amaxes are reduced over a group that holds every tensor-parallel rank
    (`recipe.reduce_amax` and the autocast's amax_reduction_group). Then this rank's amax
    enters the history and the step's batched reduction makes it the gathered tensor's, as the
    unsplit module's. Otherwise the rows are gathered in high precision and cast after the
    gather (`fp8_gather_applies` is False), as before.

The backward of a row-parallel GEMM under sequence parallelism (row-parallel Linear,
LayerNormMLP's FC2) gathers its output gradient the same way (`gather_fp8_grad`): each rank casts
its own rows with the shared backward scale and the 1-byte rows travel while the input
gradient's GEMM runs on the blocks that have landed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..collectives import all_gather_bytes_first_dim, get_distributed_rank
from ..library.cast import cast, transposed
from . import copy_engine_tp, side_stream
from .gather_gemm import finish_copy_engine_gather, fp8_blocks_fit, gemm_over_gather


def _holds_every_rank(amax_group, tp_group) -> bool:
    if amax_group is None:
        return False
    if amax_group is tp_group:
        return True
    # asked per call, not cached: a cache would keep process groups alive past
    # destroy_process_group
    return set(dist.get_process_group_ranks(tp_group)) <= set(dist.get_process_group_ranks(amax_group))


def fp8_gather_applies(fi, tp) -> bool:
    """Whether the gather of this call moves FP8 bytes: an FP8 per-tensor recipe (the caller's
    GEMM consumes FP8), a sequence-parallel gather, a scale that every rank shares (see the
    module doc), and an eager call (a traced graph keeps the high-precision gather)."""
    if not (fi.fp8 and tp.gather) or torch.compiler.is_compiling():
        return False
    rs = fi.rs
    if not rs.delayed:
        return True
    # a checkpoint recompute replays the forward's scale and holds the forward's step, so it
    # decides as the forward did
    step = fi.step
    return (step is not None and rs.recipe.reduce_amax
            and _holds_every_rank(step.group, tp.group))


def fp8_amax_group(fi, tp):
    """The group to all-reduce a current-scaling amax over before this rank's cast (None under
    delayed scaling, whose amax is reduced with the step's)."""
    return None if fi.rs.delayed else tp.group


class PendingFP8Rows:
    """An FP8 all-gather in flight (async_op): `wait()` returns (gathered data, its transpose
    or None), the transpose made once the bytes are here. `local` (this rank's rows) and `rank`
    let a GEMM start on those rows before the others land (see gather_gemm.py)."""
    __slots__ = ("data", "handle", "need_transpose", "local", "rank", "group", "copy_engine",
                 "beside", "begun")

    def __init__(self, data, handle, need_transpose, local=None, rank=0, group=None,
                 copy_engine=None, beside=False):
        self.data, self.handle, self.need_transpose = data, handle, need_transpose
        self.local, self.rank = local, rank
        # copy_engine: the group's name while the gather waits for gather_gemm.gemm_over_gather
        # to run it with the copy engines; a wait() before that finishes it without the GEMM
        self.group, self.copy_engine = group, copy_engine
        self.begun = None  # copy_engine_tp.begin_gather's transfer, under way since made
        # beside: the transpose is a forward's, read only by the backward, and may run on the
        # side stream (side_stream.py)
        self.beside = beside

    def wait(self):
        if self.copy_engine is not None:
            finish_copy_engine_gather(self)
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        data_t = None
        if self.need_transpose:
            data_t = side_stream.transpose_beside(self.data) if self.beside else None
            if data_t is None:
                data_t = transposed(self.data)
        return self.data, data_t


def start_fp8_gather(local: torch.Tensor, tp, need_transpose: bool,
                     async_op: bool = False, transpose_beside: bool = False) -> PendingFP8Rows:
    """Starts the all-gather along dim 0 of this rank's FP8 rows `local` (quantised with the
    shared scale) over tp.group; with async_op the collective runs while the caller casts its
    weight, until it waits (torch.distributed's handle: on NCCL the compute stream then waits
    for the collective's stream, with no host synchronisation). transpose_beside: a forward's
    GEMM input, whose transpose only the backward reads, may be transposed on the side stream
    (side_stream.transpose_beside)."""
    beside = transpose_beside and need_transpose and side_stream.usable(local)
    if async_op and local.shape[0] % 16 == 0:  # rows an FP8 GEMM block can take
        name = copy_engine_tp.chosen(local, tp, local.numel())
        if name is not None:  # moved under the GEMM's blocks (gather_gemm.gemm_over_gather)
            out = torch.empty((tp.size * local.shape[0],) + tuple(local.shape[1:]),
                              dtype=local.dtype, device=local.device)
            local = local.contiguous()
            pending = PendingFP8Rows(out, None, need_transpose, local,
                                     get_distributed_rank(tp.group), tp.group, name, beside)
            pending.begun = copy_engine_tp.begin_gather(local.view(torch.uint8),
                                                        out.view(torch.uint8), name)
            return pending
    out, handle = all_gather_bytes_first_dim(local, tp.group, tp.size, async_op)
    return PendingFP8Rows(out.view(local.dtype), handle, need_transpose, local,
                          get_distributed_rank(tp.group), beside=beside)


def arrived(data, data_t):
    """(data, data_t) of a GEMM input that may still be a gather in flight (PendingFP8Rows)."""
    if isinstance(data, PendingFP8Rows):
        return data.wait()
    return data, data_t


def gather_fp8_grad(fi, tp, dy: torch.Tensor, need_transpose: bool, dgrad_cols: int, dgrad):
    """Sequence parallel, FP8 (where fp8_gather_applies): every rank's rows of an output
    gradient in FP8, of which dy holds this rank's. This rank's rows are cast with the scale the
    ranks share and gathered as bytes while dgrad(rows, scale_inv, out) writes the input
    gradient of each rank's block of rows as it lands (this rank's first; FP8 GEMMs need blocks
    of 16 rows, else after the whole gather). dgrad None: no input gradient. Returns (dyq,
    dyq_t or None, scale_inv, dx or None)."""
    dyq, _, dy_sinv = cast(fi.rs, dy, False, 0, False, amax_group=fp8_amax_group(fi, tp))
    pending = start_fp8_gather(dyq, tp, need_transpose, async_op=True)
    if dgrad is None:
        dyq, dyq_t = pending.wait()
        return dyq, dyq_t, dy_sinv, None
    dx = torch.empty((pending.data.shape[0], dgrad_cols), dtype=dy.dtype, device=dy.device)
    if fp8_blocks_fit(pending):
        dyq, dyq_t = gemm_over_gather(pending, (dx,), lambda rows, o: dgrad(rows, dy_sinv, o[0]))
    else:
        dyq, dyq_t = pending.wait()
        dgrad(dyq, dy_sinv, dx)
    return dyq, dyq_t, dy_sinv, dx
