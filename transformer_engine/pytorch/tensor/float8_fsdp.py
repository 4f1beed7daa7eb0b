"""FSDP2 (torch.distributed.fsdp.fully_shard) all-gather of Float8Tensor parameters in FP8.

fully_shard calls two methods of a parameter's local shard, when it has them, around each
all-gather: ``fsdp_pre_all_gather`` says what to send and ``fsdp_post_all_gather`` builds the
unsharded parameter from what arrived. Float8Tensor implements them with the functions here, so
an FP8-only weight (``quantized_model_init`` / ``fp8_model_init``) travels as its FP8 bytes plus
one float32 inverse scale per shard: half the traffic of a BF16 weight, a quarter of FP32.

Scales: an in-place update of an FP8 weight (an optimizer step, a copy_ from a checkpoint)
quantises the new value with its amax (current scaling). For a shard that amax is reduced
(maximum) over the shard group, one all-reduce for all the tensors one op writes (a _foreach_
optimizer step writes every parameter at once), so that every shard holds the scale the whole
weight would have and the sharded model steps bit for bit like the unsharded one. The shard
learns its group at its first gather. Should the shards' scales still differ (a shard written
outside such an op), the gathered shards are brought to the largest inverse scale of all (the
one that covers the largest value): local work on the gathered bytes, no collective, no host
synchronisation; a shard already on that scale is copied exactly.

A weight whose first dimension the mesh does not divide evenly is the exception: FSDP asks that
every all-gather input then have the padded shard's shape, which a one-element scale cannot, so
such a weight is gathered in its nominal dtype and quantised after the gather (current scaling).
Every rank takes the same branch, decided from the global shape.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch

# the all-gather metadata's first field: which of the two forms was sent
_FP8_BYTES, _HIGH_PRECISION = "fp8", "high_precision"


def _evenly_split(shard: torch.Tensor, world: int, orig_size: torch.Size) -> bool:
    # the same answer on every rank: with an uneven split no shard holds exactly 1/world
    return shard.numel() * world == math.prod(orig_size)


def pre_all_gather(shard, mesh, orig_size: torch.Size, module=None, mp_policy=None
                   ) -> Tuple[Tuple[torch.Tensor, ...], tuple]:
    """(all-gather inputs, metadata) of a Float8Tensor shard: its FP8 bytes and its inverse
    scale, or its value in the nominal (or mixed-precision parameter) dtype padded to the
    padded shard's shape when the mesh does not split the weight evenly."""
    world = mesh.size()
    shard.__dict__["_fsdp_shard_group"] = mesh.get_group(mesh.ndim - 1)
    if _evenly_split(shard, world, orig_size):
        data = shard._data.contiguous().view(torch.uint8)
        scale_inv = shard._scale_inv.reshape(1).to(torch.float32)
        return (data, scale_inv), (_FP8_BYTES, shard._data.dtype, tuple(orig_size))
    dtype = getattr(mp_policy, "param_dtype", None) or shard.dtype
    rows = -(-orig_size[0] // world)
    padded = torch.zeros((rows,) + tuple(orig_size[1:]), dtype=dtype, device=shard.device)
    if shard.numel():
        padded[: shard.shape[0]].copy_(shard.dequantize(dtype))
    return (padded,), (_HIGH_PRECISION, shard._data.dtype, tuple(orig_size))


def _common_scale(data: torch.Tensor, scale_invs: torch.Tensor, fp8_dtype: torch.dtype,
                  world: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gathered shards (world equal blocks of rows) re-expressed on the largest inverse
    scale: (fp8 data, one-element scale_inv)."""
    from ..kernels import quantize
    common = scale_invs.amax().reshape(1)
    values = data.view(fp8_dtype).float().reshape(world, -1) * scale_invs.reshape(world, 1)
    requantized, _ = quantize(values.reshape(data.shape), torch.reciprocal(common), fp8_dtype)
    return requantized, common


def post_all_gather(cls, all_gather_outputs: Sequence[torch.Tensor], metadata: tuple,
                    param_dtype: torch.dtype, out=None):
    """The unsharded tensor (of class ``cls``, Float8Tensor) from the gathered inputs, and the
    tensors whose storage FSDP frees after use and re-allocates before the next gather (the FP8
    data and, for a 2-D weight, its FP8 transpose). With ``out`` (a later gather), ``out``'s
    data, scale and transpose are overwritten in place and None is returned."""
    from .current_scaling import quantize_current
    form, fp8_dtype, orig_size = metadata
    if form == _FP8_BYTES:
        gathered, scale_invs = all_gather_outputs
        world = scale_invs.numel()
        data, scale_inv = _common_scale(gathered.reshape(orig_size), scale_invs, fp8_dtype, world)
    else:
        (gathered,) = all_gather_outputs
        data, scale_inv = quantize_current(gathered[: orig_size[0]].reshape(orig_size), fp8_dtype)
    from ..kernels import transpose
    if out is not None:
        # a refill between forward and backward, as FSDP's own all-gather into its buffers is:
        # the values equal those the forward saved, so autograd's version check must not fire
        with torch.autograd._unsafe_preserve_version_counter(out._data), \
                torch.autograd._unsafe_preserve_version_counter(out._scale_inv):
            out._data.copy_(data)
            out._scale_inv.copy_(scale_inv.reshape(out._scale_inv.shape))
        cached = out._transpose_cache
        if cached is not None and cached.numel() == data.numel():
            with torch.autograd._unsafe_preserve_version_counter(cached):
                cached.copy_(transpose(data))
        else:
            out._transpose_cache = None  # made again on first use
        return None
    unsharded = cls(data, scale_inv.reshape(1).clone(), param_dtype)
    if data.dim() != 2 or not data.numel():
        return unsharded, (data,)
    # the FP8 transpose the backward GEMMs read, made here so that FSDP frees it with the data
    # after use (a transpose made later would stay allocated while the weight is sharded)
    unsharded._transpose_cache = transpose(data)
    return unsharded, (data, unsharded._transpose_cache)



def requantize_together(pairs) -> None:
    """Quantises each (Float8Tensor, new value) pair back into the tensor (current scaling),
    with the amaxes of FSDP shards reduced over their shard group: one collective per group for
    the whole list, no host synchronisation."""
    import torch.distributed as dist
    from .current_scaling import amax_of
    values = [new.to(t.dtype) for t, new in pairs]
    amaxes = [amax_of(v) for v in values]
    by_group: dict = {}
    for i, (t, _) in enumerate(pairs):
        group = t.__dict__.get("_fsdp_shard_group")
        if group is not None:
            by_group.setdefault(group, []).append(i)
    for group, idx in by_group.items():
        stacked = torch.cat([amaxes[i] for i in idx])
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX, group=group)
        for k, i in enumerate(idx):
            amaxes[i] = stacked[k:k + 1]
    for (t, _), value, amax in zip(pairs, values, amaxes):
        t._requantize_from(value, amax)
