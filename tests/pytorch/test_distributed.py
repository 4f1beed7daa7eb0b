"""CudaRNGStatesTracker and the tensor-parallel collectives, the latter in a real two-process gloo
group on the CPU (torch.multiprocessing spawn), and column/row-parallel te.Linear against one
unsplit Linear with the same weights."""
import gc
import os
import socket
import sys
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import transformer_engine.pytorch as te
from transformer_engine.pytorch import distributed as ted

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from utils import DEVICES, randn, tols  # noqa: E402

WORLD = 2


# ---------------------------------------------------------------------------------------------
# RNG tracker (single process)
# ---------------------------------------------------------------------------------------------

def _tracker(device):
    return te.CudaRNGStatesTracker(device="cuda" if device == "cuda" else "cpu")


def _rand(device, n=257):
    return torch.rand(n, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_tracker_add_leaves_current_state_alone(device):
    tr = _tracker(device)
    torch.manual_seed(11)
    want = _rand(device)
    torch.manual_seed(11)
    tr.add("model-parallel-rng", 1234)
    assert torch.equal(_rand(device), want)


@pytest.mark.parametrize("device", DEVICES)
def test_tracker_fork_draws_from_named_seed_and_restores(device):
    tr = _tracker(device)
    tr.add("model-parallel-rng", 1234)
    tr.add("other", 99)
    torch.manual_seed(5)
    outside_want = [_rand(device), _rand(device)]

    torch.manual_seed(5)
    first = _rand(device)
    with tr.fork():  # default name
        in_fork = _rand(device)
    second = _rand(device)
    # the region outside the fork continues as if the fork never happened
    assert torch.equal(first, outside_want[0]) and torch.equal(second, outside_want[1])
    # inside: the stream of seed 1234
    torch.manual_seed(1234)
    assert torch.equal(in_fork, _rand(device))
    # a second fork continues the named stream instead of restarting it
    with tr.fork("model-parallel-rng"):
        again = _rand(device)
    torch.manual_seed(1234)
    _rand(device)
    assert torch.equal(again, _rand(device))
    with tr.fork("other"):
        other = _rand(device)
    assert not torch.equal(other, in_fork)


@pytest.mark.parametrize("device", DEVICES)
def test_tracker_get_set_states_replays(device):
    tr = _tracker(device)
    tr.add("model-parallel-rng", 7)
    with tr.fork():
        _rand(device)
    saved = tr.get_states()
    with tr.fork():
        first = _rand(device)
    tr.set_states(saved)
    with tr.fork():
        replay = _rand(device)
    assert torch.equal(first, replay)
    assert set(saved) == {"model-parallel-rng"}


def test_tracker_rejects_duplicates_unknown_and_reset():
    tr = te.CudaRNGStatesTracker(device="cpu")
    tr.add("a", 1)
    with pytest.raises(ValueError, match="already exists"):
        tr.add("a", 2)
    with pytest.raises(ValueError, match="seed 1 is already used"):
        tr.add("b", 1)
    with pytest.raises(KeyError, match="no state named 'missing'"):
        with tr.fork("missing"):
            pass
    with pytest.raises(TypeError, match="seed must be an int"):
        tr.add("c", 1.5)
    with pytest.raises(TypeError, match="states must be a dict"):
        tr.set_states([1])
    with pytest.raises(ValueError, match="device must be"):
        te.CudaRNGStatesTracker(device="tpu")
    tr.reset()
    assert tr.get_states() == {}
    tr.add("a", 1)  # name and seed are free again


def test_tracker_fork_restores_on_exception():
    tr = te.CudaRNGStatesTracker(device="cpu")
    tr.add("x", 3)
    torch.manual_seed(0)
    want = torch.rand(5)
    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        with tr.fork("x"):
            torch.rand(5)
            raise RuntimeError("boom")
    assert torch.equal(torch.rand(5), want)


def test_collectives_are_identity_without_group():
    x = randn((6, 5), torch.float32, "cpu", seed=1).requires_grad_()
    for fn in (ted.copy_to_tensor_parallel_region, ted.reduce_from_tensor_parallel_region,
               ted.gather_from_sequence_parallel_region, ted.reduce_scatter_to_sequence_parallel_region):
        assert fn(x, None) is x
    assert ted.get_distributed_world_size(None) == 1 and ted.get_distributed_rank(None) == 0
    with pytest.raises(ValueError, match="not divisible by the tensor-parallel size 4"):
        ted.divide(10, 4, "out_features")


# ---------------------------------------------------------------------------------------------
# Two-process gloo group
# ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, errfile, body):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        body(rank, world, dist.group.WORLD)
        # Free what the body left in reference cycles before the group goes: an FP8 autocast step
        # keeps its amax_reduction_group alive, and a gloo group destroyed only at interpreter exit
        # aborts the process now and then (std::terminate). Reported; the suites check results here.
        gc.collect()
        dist.barrier()
    except BaseException:  # noqa: BLE001  (reported to the parent through the file)
        with open(f"{errfile}.{rank}", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(body):
    with tempfile.TemporaryDirectory() as tmp:
        errfile = os.path.join(tmp, "err")
        try:
            mp.spawn(_worker, args=(WORLD, _free_port(), errfile, body), nprocs=WORLD, join=True)
        except Exception as exc:  # show the worker's traceback, not only "process 1 terminated"
            msgs = []
            for r in range(WORLD):
                if os.path.exists(f"{errfile}.{r}"):
                    msgs.append(f"rank {r}:\n" + open(f"{errfile}.{r}").read())
            pytest.fail("\n".join(msgs) or str(exc))


def _body_collectives(rank, world, group):
    # every rank builds every rank's inputs from fixed seeds, so each can compute the expected sums
    xs = [randn((4, 3), torch.float64, "cpu", seed=10 + r) for r in range(world)]
    gs = [randn((4, 3), torch.float64, "cpu", seed=20 + r) for r in range(world)]

    # copy-to: identity forward, all-reduce backward
    x = xs[rank].clone().requires_grad_()
    y = ted.copy_to_tensor_parallel_region(x, group)
    assert torch.equal(y, xs[rank])
    y.backward(gs[rank])
    torch.testing.assert_close(x.grad, sum(gs), rtol=0, atol=1e-12)

    # reduce-from: all-reduce forward, identity backward; the input is not modified
    x = xs[rank].clone().requires_grad_()
    y = ted.reduce_from_tensor_parallel_region(x, group)
    torch.testing.assert_close(y, sum(xs), rtol=0, atol=1e-12)
    assert torch.equal(x.detach(), xs[rank])
    y.backward(gs[rank])
    assert torch.equal(x.grad, gs[rank])

    # gather along dim 0: forward all-gather, backward reduce-scatter
    x = xs[rank].clone().requires_grad_()
    y = ted.gather_from_sequence_parallel_region(x, group)
    assert torch.equal(y, torch.cat(xs))
    big = [randn((4 * world, 3), torch.float64, "cpu", seed=30 + r) for r in range(world)]
    y.backward(big[rank])
    torch.testing.assert_close(x.grad, sum(big).chunk(world)[rank], rtol=0, atol=1e-12)

    # reduce-scatter along dim 0: forward reduce-scatter, backward all-gather
    x = big[rank].clone().requires_grad_()
    y = ted.reduce_scatter_to_sequence_parallel_region(x, group)
    torch.testing.assert_close(y, sum(big).chunk(world)[rank], rtol=0, atol=1e-12)
    y.backward(gs[rank])
    assert torch.equal(x.grad, torch.cat(gs))

    # NVIDIA TE's raw collectives: (output, handle), no autograd; async handles wait()
    y2, handle = ted.gather_along_first_dim(xs[rank], group)
    assert handle is None and torch.equal(y2, torch.cat(xs))
    y2, handle = ted.gather_along_first_dim(xs[rank], group, async_op=True)
    if handle is not None:
        handle.wait()
    assert torch.equal(y2, torch.cat(xs))
    y3, handle = ted.reduce_scatter_along_first_dim(big[rank], group)
    torch.testing.assert_close(y3, sum(big).chunk(world)[rank], rtol=0, atol=1e-12)

    # an odd first dim cannot be scattered: clear error, on every rank (no hang)
    try:
        ted.reduce_scatter_to_sequence_parallel_region(randn((5, 3), torch.float32, "cpu"), group)
    except ValueError as exc:
        assert "not divisible by the group size 2" in str(exc)
    else:
        raise AssertionError("reduce_scatter of 5 rows over 2 ranks did not raise")
    assert ted.get_distributed_world_size(group) == world and ted.get_distributed_rank(group) == rank


def test_collectives_two_ranks_gloo():
    _spawn(_body_collectives)


def _has_tp_linear() -> bool:
    import inspect
    lin = getattr(te, "Linear", None)
    if lin is None:
        return False
    params = inspect.signature(lin.__init__).parameters
    return all(p in params for p in ("tp_group", "parallel_mode", "sequence_parallel"))


def _body_parallel_linear(rank, world, group):
    torch.manual_seed(0)
    hidden, ffn, tokens = 32, 48, 8
    dtype = torch.float32
    w1 = randn((ffn, hidden), dtype, "cpu", seed=1, scale=0.2)
    b1 = randn((ffn,), dtype, "cpu", seed=2)
    w2 = randn((hidden, ffn), dtype, "cpu", seed=3, scale=0.2)
    b2 = randn((hidden,), dtype, "cpu", seed=4)
    x = randn((tokens, hidden), dtype, "cpu", seed=5)
    dy = randn((tokens, hidden), dtype, "cpu", seed=6)

    # unsplit reference: two plain te.Linear
    ref1 = te.Linear(hidden, ffn, params_dtype=dtype, device="cpu")
    ref2 = te.Linear(ffn, hidden, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        ref1.weight.copy_(w1); ref1.bias.copy_(b1); ref2.weight.copy_(w2); ref2.bias.copy_(b2)  # noqa: E702
    xr = x.clone().requires_grad_()
    ref2(ref1(xr)).backward(dy)

    for seq_par in (False, True):
        col = te.Linear(hidden, ffn, params_dtype=dtype, device="cpu", tp_group=group, tp_size=world,
                        parallel_mode="column", sequence_parallel=seq_par)
        row = te.Linear(ffn, hidden, params_dtype=dtype, device="cpu", tp_group=group, tp_size=world,
                        parallel_mode="row", sequence_parallel=seq_par)
        assert tuple(col.weight.shape) == (ffn // world, hidden), col.weight.shape
        assert tuple(row.weight.shape) == (hidden, ffn // world), row.weight.shape
        with torch.no_grad():
            col.weight.copy_(w1.chunk(world, 0)[rank]); col.bias.copy_(b1.chunk(world, 0)[rank])  # noqa: E702
            row.weight.copy_(w2.chunk(world, 1)[rank]); row.bias.copy_(b2)  # noqa: E702
        # sequence parallel: each rank holds its slice of the tokens in and out
        xin = (x.chunk(world, 0)[rank] if seq_par else x).clone().requires_grad_()
        out = row(col(xin))
        want = ref2(ref1(x)).detach()
        want_local = want.chunk(world, 0)[rank] if seq_par else want
        t = tols(dtype)
        torch.testing.assert_close(out, want_local, **t)
        out.backward(dy.chunk(world, 0)[rank] if seq_par else dy)
        want_dx = xr.grad.chunk(world, 0)[rank] if seq_par else xr.grad
        torch.testing.assert_close(xin.grad, want_dx, **t)
        torch.testing.assert_close(col.weight.grad, ref1.weight.grad.chunk(world, 0)[rank], **t)
        torch.testing.assert_close(col.bias.grad, ref1.bias.grad.chunk(world, 0)[rank], **t)
        torch.testing.assert_close(row.weight.grad, ref2.weight.grad.chunk(world, 1)[rank], **t)
        # the row-parallel bias is replicated. Without sequence parallelism each rank saw every
        # token, so its grad is the full one; with it each rank saw its slice of the tokens and, as
        # in NVIDIA TE (the bias is marked `sequence_parallel`), the sum over ranks is left to the
        # training loop's gradient all-reduce.
        bias_grad = row.bias.grad.clone()
        if seq_par:
            assert getattr(row.bias, "sequence_parallel", False), "row-parallel SP bias not marked"
            dist.all_reduce(bias_grad, group=group)
        torch.testing.assert_close(bias_grad, ref2.bias.grad, **t)


@pytest.mark.skipif(not _has_tp_linear(), reason="te.Linear has no tp_group/parallel_mode/sequence_parallel yet")
def test_column_row_parallel_linear_matches_unsplit_two_ranks_gloo():
    _spawn(_body_parallel_linear)


def _body_parallel_layernorm_mlp(rank, world, group):
    """LayerNormMLP with set_parallel_mode (FC1 column-, FC2 row-parallel) against the unsplit
    module with the same weights, with and without sequence parallelism."""
    torch.manual_seed(0)
    hidden, ffn, tokens = 32, 64, 8
    dtype = torch.float32
    ref = te.LayerNormMLP(hidden, ffn, activation="swiglu", params_dtype=dtype, device="cpu")
    with torch.no_grad():
        # a seed per parameter name: the values do not depend on the registration order
        seeds = {"layer_norm_weight": 0, "layer_norm_bias": 1, "fc1_weight": 2, "fc2_weight": 3,
                 "fc1_bias": 4, "fc2_bias": 5}
        for n, p in ref.named_parameters():
            i = seeds[n]
            p.copy_(randn(p.shape, dtype, "cpu", seed=200 + i, scale=0.3) + (1 if p.dim() == 1 and i == 0 else 0))
    x = randn((tokens, hidden), dtype, "cpu", seed=5)
    dy = randn((tokens, hidden), dtype, "cpu", seed=6)
    xr = x.clone().requires_grad_()
    want = ref(xr)
    want.backward(dy)
    full = dict(ref.named_parameters())

    def shard(name, t):
        if name == "fc1_weight" or name == "fc1_bias":  # gated: both halves split the same way
            halves = t.chunk(2, 0)
            return torch.cat([h.chunk(world, 0)[rank] for h in halves])
        if name == "fc2_weight":
            return t.chunk(world, 1)[rank]
        return t

    for seq_par in (False, True):
        m = te.LayerNormMLP(hidden, ffn, activation="swiglu", params_dtype=dtype, device="cpu", tp_group=group,
                            tp_size=world, set_parallel_mode=True, sequence_parallel=seq_par)
        with torch.no_grad():
            for n, p in m.named_parameters():
                assert p.shape == shard(n, full[n]).shape, f"{n}: {tuple(p.shape)}"
                p.copy_(shard(n, full[n]))
        xin = (x.chunk(world, 0)[rank] if seq_par else x).clone().requires_grad_()
        out = m(xin)
        t = tols(dtype)
        torch.testing.assert_close(out, want.detach().chunk(world, 0)[rank] if seq_par else want.detach(), **t)
        out.backward(dy.chunk(world, 0)[rank] if seq_par else dy)
        torch.testing.assert_close(xin.grad, xr.grad.chunk(world, 0)[rank] if seq_par else xr.grad, **t)
        for n, p in m.named_parameters():
            g = p.grad.clone()
            if seq_par and n in ("layer_norm_weight", "layer_norm_bias", "fc2_bias"):
                dist.all_reduce(g, group=group)  # replicated, saw a slice of the tokens: caller sums
            torch.testing.assert_close(g, shard(n, full[n].grad), **t, msg=lambda s: f"{n} (sp={seq_par}): {s}")


@pytest.mark.skipif(not _has_tp_linear(), reason="te modules have no tensor-parallel arguments yet")
def test_tensor_parallel_layernorm_mlp_matches_unsplit_two_ranks_gloo():
    _spawn(_body_parallel_layernorm_mlp)


def _body_amax_reduction(rank, world, group):
    """DelayedScaling with fp8_group: after a step on inputs of different magnitude per rank, the
    scales agree across ranks (same output for the same input); without the group they do not."""
    from transformer_engine.common import recipe
    outs = {}
    for reduce in (True, False):
        torch.manual_seed(0)  # same weights on both ranks
        m = te.Linear(32, 32, params_dtype=torch.float32, device="cpu")
        r = recipe.DelayedScaling()
        x_rank = randn((16, 32), torch.float32, "cpu", seed=rank) * (1 + 2.3 * rank)
        with te.fp8_autocast(enabled=True, fp8_recipe=r, fp8_group=group if reduce else None):
            y = m(x_rank)
        y.sum().backward()
        x_same = randn((16, 32), torch.float32, "cpu", seed=99)
        with torch.no_grad(), te.fp8_autocast(enabled=True, fp8_recipe=r, fp8_group=group if reduce else None):
            out = m(x_same)
        gathered = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(gathered, out, group=group)
        outs[reduce] = gathered
    assert torch.equal(outs[True][0], outs[True][1]), "amax not reduced over fp8_group"
    assert not torch.equal(outs[False][0], outs[False][1]), "ranks agree without reduction: test is vacuous"


def test_delayed_scaling_amax_reduced_over_group_two_ranks_gloo():
    _spawn(_body_amax_reduction)


def test_distributed_checkpoint_is_te_checkpoint():
    lin = te.Linear(16, 8, params_dtype=torch.float32, device="cpu")
    x = randn((4, 16), torch.float32, "cpu", seed=3).requires_grad_()
    y = ted.checkpoint(lin, x)
    y.sum().backward()
    g = x.grad.clone()
    x.grad = None
    lin(x).sum().backward()
    assert torch.equal(y, lin(x)) and torch.equal(g, x.grad)
