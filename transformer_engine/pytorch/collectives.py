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


def all_gather_single(out: torch.Tensor, inp: torch.Tensor, group=None, async_op: bool = False):
    """torch.distributed's single-tensor all-gather (every rank's `inp` into `out`, rank order):
    all_gather_single where torch has it (torch 2.13 renamed all_gather_into_tensor, and the old
    name now warns on every program's first call), else all_gather_into_tensor. Looked up per
    call, so that a torch.distributed patched by a profiler or a test is the one called."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, inp, group=group, async_op=async_op)


def reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, group=None,
                          async_op: bool = False):
    """torch.distributed's single-tensor reduce-scatter (sum): reduce_scatter_single where torch
    has it (the newer name of reduce_scatter_tensor), else reduce_scatter_tensor."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(out, inp, group=group, async_op=async_op)


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
        all_gather_single(out, tensor, group=group)
    else:  # gloo and others lack the single-tensor form: gather into views of `out`
        dist.all_gather(list(out.chunk(world, dim=0)), tensor, group=group)
    return out


def reduce_scatter_first_dim(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum over the group, then keep this rank's 1/world slice of dim 0."""
    out, _ = start_reduce_scatter_first_dim(tensor, group, async_op=False)
    return out


def start_reduce_scatter_first_dim(tensor: torch.Tensor, group=None, async_op: bool = True):
    """reduce_scatter_first_dim, started: (out, handle or None). With async_op on NCCL the
    collective runs on its own stream while the caller issues more work, and `out` holds the
    sums once the handle is waited on (the compute stream then waits for the collective, with
    no host synchronisation); other backends, and a traced call, finish before returning
    (handle None)."""
    async_op = async_op and not torch.compiler.is_compiling()
    world = _tp_size(group)
    if world == 1:
        return tensor, None
    if tensor.shape[0] % world != 0:
        raise ValueError(f"reduce_scatter_along_first_dim: dim 0 of shape {tuple(tensor.shape)} is not "
                         f"divisible by the group size {world}")
    tensor = tensor.contiguous()
    if _uses_nccl(group):
        out = torch.empty((tensor.shape[0] // world,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        handle = reduce_scatter_single(out, tensor, group=group, async_op=async_op)
        return out, handle
    # gloo has no reduce-scatter: all-reduce a copy and keep our slice (twice the traffic, same sums)
    summed = tensor.clone()
    dist.all_reduce(summed, group=group)
    return summed.chunk(world, dim=0)[get_distributed_rank(group)].contiguous(), None


def start_all_reduce(tensor: torch.Tensor, group=None, async_op: bool = True):
    """all_reduce, started: (tensor, handle or None), summed in place once the handle is waited
    on (see start_reduce_scatter_first_dim)."""
    if _tp_size(group) == 1:
        return tensor, None
    async_op = async_op and _uses_nccl(group) and not torch.compiler.is_compiling()
    handle = dist.all_reduce(tensor, group=group, async_op=async_op)
    return tensor, handle


# ---------------------------------------------------------------------------------------------
# FP8 all-gather: each rank quantises its own rows and the FP8 bytes travel (half of BF16's)
# ---------------------------------------------------------------------------------------------

def all_gather_bytes_first_dim(data: torch.Tensor, group, world: int, async_op: bool = False):
    """Every rank's 1-byte `data` (FP8) concatenated along dim 0, as (uint8 tensor, handle or
    None): moved as uint8, which every backend carries (gloo has no FP8 types)."""
    out = torch.empty((world * data.shape[0],) + tuple(data.shape[1:]), dtype=torch.uint8,
                      device=data.device)
    src = data.contiguous().view(torch.uint8)
    if _uses_nccl(group):
        handle = all_gather_single(out, src, group=group, async_op=async_op)
    else:
        handle = dist.all_gather(list(out.chunk(world, dim=0)), src, group=group, async_op=async_op)
    return out, handle


def all_gather_fp8_first_dim(tensor: torch.Tensor, quantizer, group, async_op: bool = False):
    """Every rank's rows of `tensor` concatenated along dim 0 and quantised by `quantizer` with
    one scale, as (Float8Tensor, handle or None): this rank's rows are quantised first and only
    their FP8 bytes are gathered.

    One scale for all rows: a Float8Quantizer's scale is the caller's (the same on every rank
    under delayed scaling with the amax reduced over the group); a Float8CurrentScalingQuantizer
    first reduces its amax over `group` (one all-reduce of one value, on the device), so the
    scale is that of the gathered tensor. With async_op the data arrives when the handle is
    waited on (the Float8Tensor's bytes are the gather's output buffer)."""
    from .tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Tensor
    world = get_distributed_world_size(group)
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        local = Float8CurrentScalingQuantizer(
            quantizer.dtype, quantizer.device, rowwise=True, columnwise=False,
            with_amax_reduction=world > 1, amax_reduction_group=group,
            force_pow_2_scales=quantizer.force_pow_2_scales, amax_epsilon=quantizer.amax_epsilon)
        shard = local.quantize(tensor)
        quantizer.amax, quantizer.scale = local.amax, local.scale
    else:
        columnwise = quantizer.columnwise_usage
        quantizer.set_usage(columnwise=False)  # the transpose is of the gathered rows, made later
        try:
            shard = quantizer.quantize(tensor)
        finally:
            quantizer.set_usage(columnwise=columnwise)
    if world == 1:
        return shard, None
    gathered, handle = all_gather_bytes_first_dim(shard._data, group, world, async_op)
    out = Float8Tensor(gathered.view(shard._data.dtype), shard._scale_inv, shard.dtype)
    out._quantizer = quantizer
    return out, handle
