"""Tensor-parallel plumbing of the modules around their single autograd Function: column
parallel (weight split over output features; input copied to, or with sequence parallelism
gathered from, the group) and row parallel (split over input features; output all-reduced, or
reduce-scattered with sequence parallelism)."""
from __future__ import annotations

import torch

from .. import distributed as dist_te
from ..collectives import get_distributed_rank, start_all_reduce, start_reduce_scatter_first_dim
from . import copy_engine_tp


def resolve_tp(tp_group, tp_size):
    if tp_group is not None:
        size = dist_te.get_distributed_world_size(tp_group)
        if tp_size not in (None, 1, size):
            raise ValueError(f"tp_size={tp_size} differs from the size {size} of tp_group")
        return size
    return 1 if tp_size is None else int(tp_size)


def check_parallel_mode(who, parallel_mode):
    if parallel_mode not in (None, "column", "row"):
        raise ValueError(f"{who}: parallel_mode is {parallel_mode!r}; expected None, 'column' or 'row'")


def split_features(who, in_features, out_features, parallel_mode, tp_size):
    if parallel_mode == "column":
        out_features = dist_te.divide(out_features, tp_size, f"{who}: out_features")
    elif parallel_mode == "row":
        in_features = dist_te.divide(in_features, tp_size, f"{who}: in_features")
    return in_features, out_features


def require_group(tp_group, tp_size):
    """A module split over tp_size > 1 ranks needs their process group: without one its
    collectives would be the identity and each rank would silently compute only its own part.
    Raised at the first forward, before any collective (every rank raises alike)."""
    if tp_size > 1 and tp_group is None:
        raise ValueError(f"Linear / LayerNormLinear / LayerNormMLP: tp_size={tp_size} but tp_group "
                         f"is None; pass the process group of the {tp_size} tensor-parallel ranks "
                         f"as tp_group (or tp_size=1 for no tensor parallelism)")


def check_sequence_rows(rows, tp_size, what):
    """A sequence-parallel split needs a sequence (dim 0) divisible by the group's size; checked
    before the collective, on every rank alike."""
    if rows % tp_size:
        raise ValueError(f"Linear / LayerNormLinear / LayerNormMLP (sequence_parallel=True): {what} "
                         f"has {rows} rows in dim 0 (the sequence), not divisible by tp_size="
                         f"{tp_size}; pad the sequence to a multiple of tp_size")


def column_input(inp, tp_group, tp_size, sequence_parallel):
    if tp_size == 1:
        return inp
    require_group(tp_group, tp_size)
    if sequence_parallel:
        return dist_te.gather_from_sequence_parallel_region(inp, tp_group)
    return dist_te.copy_to_tensor_parallel_region(inp, tp_group)


def check_row_input(inp, tp_group, tp_size, sequence_parallel):
    """The checks of row_output, made at the forward's start (before the GEMM and any FP8 step
    bookkeeping): the output has the input's rows."""
    if tp_size == 1:
        return
    require_group(tp_group, tp_size)
    if sequence_parallel:
        check_sequence_rows(inp.shape[0], tp_size, "the row-parallel input")


def row_output(out, tp_group, tp_size, sequence_parallel):
    if tp_size == 1:
        return out
    require_group(tp_group, tp_size)
    if sequence_parallel:
        check_sequence_rows(out.shape[0], tp_size, "the row-parallel output")
        return dist_te.reduce_scatter_to_sequence_parallel_region(out, tp_group)
    return dist_te.reduce_from_tensor_parallel_region(out, tp_group)


class NormTP:
    """Tensor parallelism of a norm followed by a column-parallel GEMM (LayerNormLinear,
    LayerNormMLP). The collectives sit between the norm and the GEMM, as in Megatron: with
    sequence parallelism the norm runs on this rank's rows and its output is all-gathered, the
    gradient reduce-scattered back; without it the norm runs on the full input and the gradient
    of its output is all-reduced, so the norm's weight gradients are complete on every rank
    (partial over sequence shards with sequence parallelism: those parameters are marked
    `sequence_parallel` for the caller's all-reduce)."""
    __slots__ = ("group", "size", "active", "gather")

    def __init__(self, group, size, active, sequence_parallel):
        self.group, self.size = group, size
        self.active = active and size > 1
        if self.active:
            require_group(group, size)
        self.gather = self.active and sequence_parallel

    def gather_rows(self, t):
        return dist_te.all_gather_first_dim(t, self.group) if self.gather else t

    def reduce_grad(self, dln):
        return self.start_reduce_grad(dln).wait()

    def start_reduce_grad(self, dln):
        """The reduction of the norm output's gradient, started: a PendingGrad whose wait()
        returns it. On NCCL it runs while the caller issues its weight-gradient GEMMs (the
        backward overlaps the collective with them); elsewhere it is done on return."""
        if not self.active:
            return PendingGrad(dln, None)
        if self.gather:
            return PendingGrad(*start_reduce_scatter_first_dim(dln, self.group))
        return PendingGrad(*start_all_reduce(dln.contiguous(), self.group))

    def dgrad_and_reduce(self, dy, cols: int, dtype, dgrad, block_multiple: int = 1,
                         weight_grads=None):
        """(the norm output's gradient reduced over the group as a PendingGrad, what
        weight_grads() returned or None): dgrad(rows, out) writes into out [rows, cols] the
        gradient of those rows of dy. With sequence parallelism and the copy engines
        (copy_engine_tp), it is made in one block of rows per rank, each peer's block first, and
        the copy engines move each block to its owner while the next is made, so the
        reduce-scatter hides under the GEMM without taking its SMs; blocks need rows that are a
        multiple of block_multiple (FP8 GEMMs: 16). Otherwise it is made whole and its reduction
        started. weight_grads (the caller's weight-gradient GEMMs, which do not read this
        gradient) runs where it hides the most of the reduction: right after this rank's block,
        under the last copy and the pipeline's closing barrier, or after the reduction is
        started."""
        rows = dy.shape[0] // self.size if self.gather else 0
        if rows > 0 and rows % block_multiple == 0:
            nbytes = self.size * rows * cols * torch.finfo(dtype).bits // 8
            name = copy_engine_tp.chosen(dy, self, nbytes)
            if name is not None:
                rank, made = get_distributed_rank(self.group), []

                def block(r, out):
                    dgrad(dy[r * rows:(r + 1) * rows], out)
                    if r == rank and weight_grads is not None:  # this rank's block comes last
                        made.append(weight_grads())
                reduced = copy_engine_tp.produce_and_reduce_scatter(
                    rows, cols, self.size, dtype, dy.device, name, block)
                if weight_grads is not None and not made:  # pragma: no cover - pipeline order
                    made.append(weight_grads())
                return PendingGrad(reduced, None), (made[0] if made else None)
        full = torch.empty((dy.shape[0], cols), dtype=dtype, device=dy.device)
        dgrad(dy, full)
        pending = self.start_reduce_grad(full)
        return pending, (weight_grads() if weight_grads is not None else None)


class PendingGrad:
    """A gradient whose reduction over the tensor-parallel group may still be in flight."""
    __slots__ = ("value", "handle")

    def __init__(self, value, handle):
        self.value, self.handle = value, handle

    def wait(self):
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        return self.value


NO_TP = NormTP(None, 1, False, False)
