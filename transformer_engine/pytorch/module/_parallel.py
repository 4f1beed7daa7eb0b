"""Tensor-parallel plumbing of the modules around their single autograd Function: column
parallel (weight split over output features; input copied to, or with sequence parallelism
gathered from, the group) and row parallel (split over input features; output all-reduced, or
reduce-scattered with sequence parallelism)."""
from __future__ import annotations

from .. import distributed as dist_te


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


def column_input(inp, tp_group, tp_size, sequence_parallel):
    if tp_size == 1:
        return inp
    if sequence_parallel:
        return dist_te.gather_from_sequence_parallel_region(inp, tp_group)
    return dist_te.copy_to_tensor_parallel_region(inp, tp_group)


def row_output(out, tp_group, tp_size, sequence_parallel):
    if tp_size == 1:
        return out
    if sequence_parallel:
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
        self.gather = self.active and sequence_parallel

    def gather_rows(self, t):
        return dist_te.all_gather_first_dim(t, self.group) if self.gather else t

    def reduce_grad(self, dln):
        if not self.active:
            return dln
        if self.gather:
            return dist_te.reduce_scatter_first_dim(dln, self.group)
        return dist_te.all_reduce(dln.contiguous(), self.group)


NO_TP = NormTP(None, 1, False, False)
