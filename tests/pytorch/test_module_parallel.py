"""Tensor-parallel te.Linear (column / row, with and without sequence parallelism) against the
unsplit layer, and the delayed-scaling amax reduction over the autocast's group: two CPU ranks
in a gloo group (the collectives are torch.distributed's, so the same code runs over NCCL)."""
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, errors):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        sys.path.insert(0, ROOT)
        _check_parallel(rank, world)
        _check_amax_reduction(rank, world)
        _check_distributed_checkpoint(rank, world)
        _check_norm_modules(rank, world)
        _check_residual_in_row_blocks(rank, world)
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which fails the test
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")


def _check_parallel(rank, world):
    import transformer_engine.pytorch as te
    group = dist.new_group(list(range(world)))
    gen = torch.Generator().manual_seed(0)
    w_col, b_col = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    w_row, b_row = torch.randn(64, 96, generator=gen), torch.randn(64, generator=gen)
    x, h = torch.randn(8, 64, generator=gen), torch.randn(8, 96, generator=gen)
    for sp in (False, True):
        col = te.Linear(64, 96, parallel_mode="column", tp_group=group, sequence_parallel=sp, device="cpu")
        row = te.Linear(96, 64, parallel_mode="row", tp_group=group, sequence_parallel=sp, device="cpu")
        assert col.weight.shape == (96 // world, 64) and row.weight.shape == (64, 96 // world)
        with torch.no_grad():
            col.weight.copy_(w_col.chunk(world, 0)[rank])
            col.bias.copy_(b_col.chunk(world, 0)[rank])
            row.weight.copy_(w_row.chunk(world, 1)[rank])
            row.bias.copy_(b_row)
        xi = (x.chunk(world, 0)[rank] if sp else x).clone().requires_grad_()
        y = col(xi)
        torch.testing.assert_close(y, (x @ w_col.T + b_col).chunk(world, 1)[rank], rtol=1e-5, atol=1e-5)
        y.sum().backward()
        # dL/dx of the full layer is sum over all output features: the column-parallel backward
        # all-reduces (or reduce-scatters) the partial input gradients
        full_dx = torch.ones(8, 96) @ w_col
        torch.testing.assert_close(xi.grad, full_dx.chunk(world, 0)[rank] if sp else full_dx,
                                   rtol=1e-5, atol=1e-4)
        out = row(h.chunk(world, 1)[rank].contiguous())
        expect = h @ w_row.T + b_row
        torch.testing.assert_close(out, expect.chunk(world, 0)[rank] if sp else expect, rtol=1e-5, atol=1e-4)


def _check_amax_reduction(rank, world):
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe
    from transformer_engine.pytorch.kernels.cast import fp8_max_of
    group = dist.new_group(list(range(world)))
    torch.manual_seed(1)
    lin = te.Linear(32, 32, device="cpu")
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 + rank)) * (1 + 3 * rank)
    with te.fp8_autocast(fp8_recipe=recipe.DelayedScaling(amax_history_len=2), fp8_group=group):
        lin(x)
    amax = x.abs().max().reshape(1)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    rs = lin._fp8_state
    expect = torch.tensor([fp8_max_of(rs.fwd_dtype)]) / amax
    assert torch.equal(rs.scale_fwd[:1], expect), (rs.scale_fwd, expect)


def _check_distributed_checkpoint(rank, world):
    """distribute_saved_activations keeps 1/world of the input per rank and gathers it for the
    recompute: gradients equal those of the plain run."""
    import transformer_engine.pytorch as te
    group = dist.new_group(list(range(world)))
    torch.manual_seed(2)
    mlp = te.LayerNormMLP(32, 64, device="cpu")
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(3))
    grads = []
    for distribute in (False, True):
        xi = x.clone().requires_grad_()
        y = te.checkpoint(mlp, xi, distribute_saved_activations=distribute, tp_group=group)
        y.sum().backward()
        grads.append([xi.grad] + [p.grad.clone() for p in mlp.parameters()])
        mlp.zero_grad()
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def _check_norm_modules(rank, world):
    """LayerNormLinear (column) and LayerNormMLP (FC1 column, FC2 row) split over two ranks:
    outputs, input gradients and every weight gradient equal the unsplit module's (parameters
    marked `sequence_parallel` hold partial sums over sequence shards and are all-reduced, as a
    training loop does; without sequence parallelism nothing is marked)."""
    import transformer_engine.pytorch as te
    group = dist.new_group(list(range(world)))
    x = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(4))
    for sp in (False, True):
        for kind in ("LayerNormLinear", "LayerNormMLP"):
            torch.manual_seed(5)
            if kind == "LayerNormLinear":
                full = te.LayerNormLinear(32, 48, device="cpu")
                part = te.LayerNormLinear(32, 48, parallel_mode="column", tp_group=group,
                                          sequence_parallel=sp, device="cpu")
                splits = {"weight": 0, "bias": 0}
            else:
                full = te.LayerNormMLP(32, 64, device="cpu")
                part = te.LayerNormMLP(32, 64, set_parallel_mode=True, tp_group=group,
                                       sequence_parallel=sp, device="cpu")
                splits = {"fc1_weight": 0, "fc1_bias": 0, "fc2_weight": 1}
            with torch.no_grad():
                for n, p in full.named_parameters():
                    if n.startswith("layer_norm"):
                        p.normal_(generator=torch.Generator().manual_seed(6))
                    src = p if n not in splits else p.chunk(world, splits[n])[rank]
                    getattr(part, n).copy_(src)
            xa = x.clone().requires_grad_()
            ya = full(xa)
            ya.sum().backward()
            xb = (x.chunk(world, 0)[rank] if sp else x).clone().requires_grad_()
            yb = part(xb)
            yb.sum().backward()
            if kind == "LayerNormLinear":
                expect_y = ya.detach().chunk(world, -1)[rank]
            else:
                expect_y = ya.detach().chunk(world, 0)[rank] if sp else ya.detach()
            torch.testing.assert_close(yb, expect_y, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(xb.grad, xa.grad.chunk(world, 0)[rank] if sp else xa.grad,
                                       rtol=1e-5, atol=1e-5)
            for n, p in full.named_parameters():
                g = getattr(part, n).grad
                if getattr(getattr(part, n), "sequence_parallel", False):
                    g = g.clone()
                    dist.all_reduce(g, group=group)  # what the training loop does for SP params
                expect = p.grad if n not in splits else p.grad.chunk(world, splits[n])[rank]
                torch.testing.assert_close(g, expect, rtol=1e-5, atol=1e-5, msg=f"{kind} sp={sp} {n}")


def _check_residual_in_row_blocks(rank, world):
    """Sequence parallel: the row-parallel Linear's `_residual` and LayerNormMLP's `_add_input`
    (TransformerLayer's residual connections) and their biases are added by the GEMM of this
    rank's block of rows; output and every gradient equal the unsplit module's with the adds
    made apart (the bias, marked `sequence_parallel`, all-reduced as a training loop does).
    Without sequence parallelism the row split refuses the residual."""
    import transformer_engine.pytorch as te
    group = dist.new_group(list(range(world)))
    gen = torch.Generator().manual_seed(7)
    x, r = torch.randn(8, 2, 48, generator=gen), torch.randn(8, 2, 32, generator=gen)
    for kind in ("Linear", "LayerNormMLP"):
        torch.manual_seed(8)
        if kind == "Linear":
            full = te.Linear(48, 32, device="cpu")
            part = te.Linear(48, 32, parallel_mode="row", tp_group=group, sequence_parallel=True,
                             device="cpu")
            plain = te.Linear(48, 32, parallel_mode="row", tp_group=group, device="cpu")
            splits = {"weight": 1}
            assert part.residual_in_gemm(r.chunk(world, 0)[rank], x[..., :48 // world])
            assert not plain.residual_in_gemm(r, x[..., :48 // world])
            xa, xb = x, x.chunk(world, -1)[rank]  # row parallel: the input's features split
        else:
            full = te.LayerNormMLP(32, 64, device="cpu")
            part = te.LayerNormMLP(32, 64, set_parallel_mode=True, tp_group=group,
                                   sequence_parallel=True, device="cpu")
            plain = te.LayerNormMLP(32, 64, set_parallel_mode=True, tp_group=group, device="cpu")
            splits = {"fc1_weight": 0, "fc1_bias": 0, "fc2_weight": 1}
            assert part.residual_in_gemm() and not plain.residual_in_gemm()
            xa, xb = r, r.chunk(world, 0)[rank]  # the residual is the input itself
        with torch.no_grad():
            for n, p in full.named_parameters():
                p.normal_(generator=torch.Generator().manual_seed(9))
                getattr(part, n).copy_(p if n not in splits else p.chunk(world, splits[n])[rank])
        xa, xb = xa.clone().requires_grad_(), xb.contiguous().clone().requires_grad_()
        ra, rb = r.clone().requires_grad_(), r.chunk(world, 0)[rank].clone().requires_grad_()
        dy = torch.randn(8, 2, 32, generator=gen)
        if kind == "Linear":
            ya, yb = full(xa) + ra, part(xb, _residual=rb)
        else:
            ya, yb = full(xa) + xa, part(xb, _add_input=True)
        ya.backward(dy)
        yb.backward(dy.chunk(world, 0)[rank])
        torch.testing.assert_close(yb, ya.detach().chunk(world, 0)[rank], rtol=1e-5, atol=1e-5)
        if kind == "Linear":
            torch.testing.assert_close(xb.grad, xa.grad.chunk(world, -1)[rank], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(rb.grad, ra.grad.chunk(world, 0)[rank], rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(xb.grad, xa.grad.chunk(world, 0)[rank], rtol=1e-5, atol=1e-5)
        for n, p in full.named_parameters():
            g = getattr(part, n).grad
            if getattr(getattr(part, n), "sequence_parallel", False):
                g = g.clone()
                dist.all_reduce(g, group=group)
            expect = p.grad if n not in splits else p.grad.chunk(world, splits[n])[rank]
            torch.testing.assert_close(g, expect, rtol=1e-5, atol=1e-4, msg=f"{kind} {n}")


def test_tensor_parallel_linear_and_amax_reduction():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(2, _free_port(), errors), nprocs=2, start_method="spawn")
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert not problems, "\n".join(problems)
