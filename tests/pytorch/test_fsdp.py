"""FSDP2 (torch.distributed.fsdp.fully_shard) over te modules in a two-process gloo group on the
CPU: a sharded LayerNormMLP + Linear stack trains step for step like the unsharded model on the
whole batch, and its sharded state round-trips through torch.distributed.checkpoint. The NCCL
two-GPU run (BF16 and FP8) is in tests/distributed."""
import os
import sys
import tempfile

import pytest
import torch

import transformer_engine.pytorch as te

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn  # noqa: E402

STEPS, BATCH, HIDDEN = 6, 8, 32


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(te.LayerNormMLP(HIDDEN, 2 * HIDDEN, device="cpu"),
                               te.Linear(HIDDEN, HIDDEN, device="cpu"))


def _body_fsdp2_matches_unsharded(rank, world, group):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    # a CPU mesh: on a machine with GPUs fully_shard would otherwise move the shards to cuda
    mesh = init_device_mesh("cpu", (world,))
    sharded, ref = _model(), _model()
    for sub in sharded:
        fully_shard(sub, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    per = BATCH // world
    for step in range(STEPS):
        x = randn((BATCH, HIDDEN), torch.float32, "cpu", seed=100 + step)
        loss = sharded(x[rank * per:(rank + 1) * per]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = ref(x).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        torch.testing.assert_close(total / world, ref_loss.detach(), rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f"step {step}: {m}")
    # the sharded state saved and loaded into a fresh sharded model gives the same outputs
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path, src=0, group=group)
    dcp.save({"model": sharded.state_dict()}, checkpoint_id=path[0])
    fresh = _model()
    for sub in fresh:
        fully_shard(sub, mesh=mesh)
    fully_shard(fresh, mesh=mesh)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=path[0])
    fresh.load_state_dict(state["model"])
    x = randn((per, HIDDEN), torch.float32, "cpu", seed=7 + rank)
    torch.testing.assert_close(fresh(x), sharded(x), rtol=0, atol=0)


def test_fsdp2_matches_unsharded_and_checkpoints_two_ranks_gloo():
    _spawn(_body_fsdp2_matches_unsharded)
