"""FP8 collectives of tensor/sequence parallelism in a two-process gloo group on the CPU:
gather_along_first_dim with an FP8 quantizer quantizes each rank's rows before the gather and
moves FP8 bytes (counted through a wrapper of the collective) with bits equal to quantizing the
gathered high-precision rows; and delayed scaling reduces the amaxes of a whole step in one
collective per direction, however many modules the step runs."""
import os
import sys

import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
import transformer_engine.pytorch.distributed as ted
from transformer_engine.common import recipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn  # noqa: E402

ROWS, COLS = 5, 23  # odd on purpose: a gather does not care about GEMM alignment


class _Counting:
    """Wraps one torch.distributed collective, recording (bytes sent, op) of each call."""

    def __init__(self, name):
        self.name, self.calls = name, []

    def __enter__(self):
        self.original = getattr(dist, self.name)

        def wrapper(*args, **kwargs):
            tensor = args[1] if self.name == "all_gather" else args[0]
            self.calls.append((tensor.numel() * tensor.element_size(), kwargs.get("op")))
            return self.original(*args, **kwargs)

        setattr(dist, self.name, wrapper)
        return self

    def __exit__(self, *exc):
        setattr(dist, self.name, self.original)


def _body_fp8_gather(rank, world, group):
    xs = [randn((ROWS, COLS), torch.float32, "cpu", seed=40 + r, scale=1.0 + r) for r in range(world)]
    fp8 = te.fp8_dtype("e4m3", "cpu")
    whole = torch.cat(xs)

    # delayed scaling: the given scale, the same on every rank
    scale = torch.tensor([3.0])
    q = te.Float8Quantizer(scale.clone(), torch.zeros(1), fp8)
    with _Counting("all_gather") as gathers, _Counting("all_reduce") as reduces:
        out, handle = ted.gather_along_first_dim(xs[rank], group, quantizer=q)
    want = te.Float8Quantizer(scale.clone(), torch.zeros(1), fp8).quantize(whole)
    assert handle is None and isinstance(out, te.Float8Tensor) and out.shape == whole.shape
    assert torch.equal(out._data.view(torch.uint8), want._data.view(torch.uint8))
    assert torch.equal(out._scale_inv, want._scale_inv)
    assert [b for b, _ in gathers.calls] == [ROWS * COLS] and not reduces.calls  # one byte each

    # current scaling: the amax reduced over the group first (4 bytes), then the FP8 gather
    q = te.Float8CurrentScalingQuantizer(fp8, "cpu")
    with _Counting("all_gather") as gathers, _Counting("all_reduce") as reduces:
        out, handle = ted.gather_along_first_dim(xs[rank], group, async_op=True, quantizer=q)
        if handle is not None:
            handle.wait()
    want = te.Float8CurrentScalingQuantizer(fp8, "cpu").quantize(whole)
    assert torch.equal(out._data.view(torch.uint8), want._data.view(torch.uint8))
    assert torch.equal(out._scale_inv, want._scale_inv)
    assert [b for b, _ in gathers.calls] == [ROWS * COLS] and [b for b, _ in reduces.calls] == [4]


def test_fp8_gather_moves_fp8_bytes_two_ranks_gloo():
    _spawn(_body_fp8_gather)


def _amax_reductions_of_a_step(group, layers):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mode = "column" if i % 2 == 0 else "row"
        mods.append(te.Linear(32, 32, tp_group=group, tp_size=2, parallel_mode=mode, device="cpu"))
    if layers % 2:
        mods.append(te.Linear(32, 32, tp_group=group, tp_size=2, parallel_mode="row", device="cpu"))
    x = randn((16, 32), torch.float32, "cpu", seed=3).requires_grad_()
    counts = []
    for _ in range(2):  # the second step runs on the first one's scales
        with _Counting("all_reduce") as reduces:
            with te.autocast(recipe=recipe.DelayedScaling(), amax_reduction_group=group):
                y = x
                for m in mods:
                    y = m(y)
            y.square().mean().backward()
        counts.append(sum(op == dist.ReduceOp.MAX for _, op in reduces.calls))
    return counts


def _body_amax_once(rank, world, group):
    few, many = _amax_reductions_of_a_step(group, 1), _amax_reductions_of_a_step(group, 5)
    # forward amaxes at the autocast's exit, backward ones after the last backward: two
    # collectives a step, whatever the number of modules (never one per tensor)
    assert few == many == [2, 2], (few, many)


def test_amax_reduced_once_per_direction_per_step_two_ranks_gloo():
    _spawn(_body_amax_once)
