"""Collectives as operations: AllGather, ReduceScatter (along the first dimension) and
AllReduce, each with the adjoint collective in the backward pass. Without an initialised
process group (or in a group of one) they return the input."""
from __future__ import annotations

from ... import distributed as dist_te
from ..op import BasicOperation


def _group(process_group):
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.group.WORLD if process_group is None else process_group


class _Collective(BasicOperation):
    def __init__(self, process_group=None) -> None:
        super().__init__()
        self.process_group = process_group

    def _forward(self, ctx, x, extra_inputs):
        return x, ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        return dy, (), []

    def _group_output(self, y):
        group = _group(self.process_group)
        return y if group is None else self._collective(y, group)


class AllGather(_Collective):
    """All-gather along the first dimension (backward: reduce-scatter).

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    """

    def _collective(self, y, group):
        return dist_te.gather_from_sequence_parallel_region(y, group)


class ReduceScatter(_Collective):
    """Reduce-scatter (sum) along the first dimension (backward: all-gather).

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    """

    def _collective(self, y, group):
        return dist_te.reduce_scatter_to_sequence_parallel_region(y, group)


class AllReduce(_Collective):
    """All-reduce (sum). The output is assumed to feed computations repeated on every process,
    so its gradient is the same everywhere and the backward pass is the identity.

    Parameters
    ----------
    process_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    reduce_in_backward : bool, default True
        Accepted for compatibility; the backward pass is the identity either way.
    """

    def __init__(self, process_group=None, reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self._reduce_in_backward = bool(reduce_in_backward)

    def _collective(self, y, group):
        return dist_te.reduce_from_tensor_parallel_region(y, group)
