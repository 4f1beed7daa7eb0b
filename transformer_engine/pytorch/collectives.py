"""The raw collectives of tensor and sequence parallelism (no autograd): sums and first-dim
gathers/scatters over a process group, NCCL's single-tensor forms where the backend has them.
The lowest layer of the distributed code: checkpoint and distributed both build on it."""
from __future__ import annotations

import torch
import torch.distributed as dist


def get_distributed_world_size(group=None) -> int:
    """Ranks in `group` (the default group when None, as torch.distributed reads it); 1 when
    torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def get_distributed_rank(group=None) -> int:
    """This process's rank in `group` (default group when None); 0 when not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def _tp_size(group) -> int:
    """Ranks of a tensor-parallel group: None means no tensor parallelism (see the module doc)."""
    return 1 if group is None else get_distributed_world_size(group)


def _uses_nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


# ---------------------------------------------------------------------------------------------
# Raw collectives (no autograd): the building blocks of the Functions below
# ---------------------------------------------------------------------------------------------

def all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over the group in place and return it (identity for one rank)."""
    if _tp_size(group) == 1:
        return tensor
    dist.all_reduce(tensor, group=group)
    return tensor


def all_gather_first_dim(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dim 0 (rank order)."""
    world = _tp_size(group)
    if world == 1:
        return tensor
    tensor = tensor.contiguous()
    out = torch.empty((world * tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)
    if _uses_nccl(group):
        dist.all_gather_into_tensor(out, tensor, group=group)
    else:  # gloo and others lack the single-tensor form: gather into views of `out`
        dist.all_gather(list(out.chunk(world, dim=0)), tensor, group=group)
    return out


def reduce_scatter_first_dim(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum over the group, then keep this rank's 1/world slice of dim 0."""
    world = _tp_size(group)
    if world == 1:
        return tensor
    if tensor.shape[0] % world != 0:
        raise ValueError(f"reduce_scatter_along_first_dim: dim 0 of shape {tuple(tensor.shape)} is not "
                         f"divisible by the group size {world}")
    tensor = tensor.contiguous()
    if _uses_nccl(group):
        out = torch.empty((tensor.shape[0] // world,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        dist.reduce_scatter_tensor(out, tensor, group=group)
        return out
    # gloo has no reduce-scatter: all-reduce a copy and keep our slice (twice the traffic, same sums)
    summed = tensor.clone()
    dist.all_reduce(summed, group=group)
    return summed.chunk(world, dim=0)[get_distributed_rank(group)].contiguous()
