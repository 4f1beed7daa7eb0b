"""Tensor-parallel te.ops (BasicLinear / Linear in column and row mode, with and without
sequence parallelism, and the collective operations) against the unsplit computation: two CPU
ranks in a gloo group (the collectives are torch.distributed's, so the same code runs over
NCCL)."""
import pytest
import torch
import torch.distributed as dist

from test_distributed import _spawn


def _check_parallel_mlp(rank, world, group):
    """Column-parallel Linear, GELU, row-parallel Linear (Megatron's MLP) against the full MLP,
    forward, input gradient and each rank's slice of the parameter gradients."""
    import torch.nn.functional as F
    import transformer_engine.pytorch as te
    gen = torch.Generator().manual_seed(0)
    w1, b1 = torch.randn(96, 64, generator=gen) * 0.2, torch.randn(96, generator=gen)
    w2, b2 = torch.randn(64, 96, generator=gen) * 0.2, torch.randn(64, generator=gen)
    x, dy = torch.randn(8, 64, generator=gen), torch.randn(8, 64, generator=gen)
    full = [t.clone().requires_grad_(True) for t in (x, w1, b1, w2, b2)]
    hidden = F.gelu(F.linear(full[0], full[1], full[2]), approximate="tanh")
    ref = F.linear(hidden, full[3], full[4])
    ref.backward(dy)
    for sp in (False, True):
        fc1 = te.ops.Linear(64, 96, device="cpu", tensor_parallel_mode="column",
                            tensor_parallel_group=group, sequence_parallel=sp)
        fc2 = te.ops.Linear(96, 64, device="cpu", tensor_parallel_mode="row",
                            tensor_parallel_group=group, sequence_parallel=sp)
        assert fc1.weight.shape == (96 // world, 64) and fc1.bias.shape == (96 // world,)
        assert fc2.weight.shape == (64, 96 // world) and fc2.bias.shape == (64,)
        with torch.no_grad():
            fc1.weight.copy_(w1.chunk(world, 0)[rank])
            fc1.bias.copy_(b1.chunk(world, 0)[rank])
            fc2.weight.copy_(w2.chunk(world, 1)[rank])
            fc2.bias.copy_(b2)
        model = te.ops.Sequential(fc1, te.ops.GELU(), fc2)
        rows = (lambda t: t.chunk(world, 0)[rank]) if sp else (lambda t: t)
        xi = rows(x).clone().requires_grad_(True)
        y = model(xi)
        tol = dict(rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(y, rows(ref.detach()), **tol)
        y.backward(rows(dy))
        torch.testing.assert_close(xi.grad, rows(full[0].grad), **tol)
        torch.testing.assert_close(fc1.weight.grad, full[1].grad.chunk(world, 0)[rank], **tol)
        torch.testing.assert_close(fc1.bias.grad, full[2].grad.chunk(world, 0)[rank], **tol)
        torch.testing.assert_close(fc2.weight.grad, full[3].grad.chunk(world, 1)[rank], **tol)
        # with sequence parallelism each rank holds its rows' part of the replicated bias's
        # gradient; the training loop all-reduces it
        b2_grad = fc2.bias.grad.clone()
        if sp:
            dist.all_reduce(b2_grad, group=group)
        torch.testing.assert_close(b2_grad, full[4].grad, **tol)


def _check_collectives(rank, world, group):
    import transformer_engine.pytorch as te
    gen = torch.Generator().manual_seed(1)
    parts = [torch.randn(3, 5, generator=gen) for _ in range(world)]
    grads = [torch.randn(3 * world, 5, generator=gen) for _ in range(world)]
    x = parts[rank].clone().requires_grad_(True)
    y = te.ops.AllGather()(x)
    torch.testing.assert_close(y, torch.cat(parts))
    y.backward(grads[rank])
    torch.testing.assert_close(x.grad, sum(grads).chunk(world, 0)[rank])
    full = torch.stack(grads).sum(0)
    x = grads[rank].clone().requires_grad_(True)
    y = te.ops.ReduceScatter()(x)
    torch.testing.assert_close(y, full.chunk(world, 0)[rank])
    y.backward(parts[rank])
    torch.testing.assert_close(x.grad, torch.cat(parts))
    x = parts[rank].clone().requires_grad_(True)
    y = te.ops.AllReduce()(x)
    torch.testing.assert_close(y, sum(parts))
    y.backward(grads[rank][:3])
    torch.testing.assert_close(x.grad, grads[rank][:3])


@pytest.mark.parametrize("body", [_check_parallel_mlp, _check_collectives])
def test_tensor_parallel_fusible_ops(body):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    _spawn(body)
