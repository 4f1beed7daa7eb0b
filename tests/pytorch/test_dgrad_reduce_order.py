"""Where NormTP.dgrad_and_reduce (module_parts/parallel.py) runs its caller's weight-gradient work:
with the copy engines, right after this rank's dgrad block and inside the reduce-scatter pipeline,
so that the GEMMs run under its last copy and closing barrier; otherwise after the reduction has
started. The pipeline here is a stand-in that calls the blocks in torch's order (the peers' first,
this rank's last) and records when it closes; the GPU pipeline is run by tests/distributed."""
import pytest
import torch

from transformer_engine.pytorch.module_parts import copy_engine_tp, parallel

ROWS, COLS, WORLD = 4, 3, 2


def _tp(gather: bool):
    tp = parallel.NormTP.__new__(parallel.NormTP)
    tp.group, tp.size, tp.active, tp.gather = None, WORLD, gather, gather
    return tp


def _dgrad(order):
    def dgrad(rows, out):
        order.append("dgrad")
        out.copy_(2 * rows[:, :COLS])
    return dgrad


@pytest.mark.parametrize("rank", [0, 1])
def test_weight_grads_run_after_this_ranks_block_inside_the_pipeline(monkeypatch, rank):
    order = []

    def pipeline(rows, cols, world, dtype, device, name, produce):
        stacked = torch.empty((world * rows, cols), dtype=dtype)
        for step in range(1, world + 1):  # the peers' blocks first, this rank's last
            r = (rank + step) % world
            produce(r, stacked[r * rows:(r + 1) * rows])
        order.append("closed")
        return stacked[rank * rows:(rank + 1) * rows].clone()

    monkeypatch.setattr(copy_engine_tp, "chosen", lambda t, tp, nbytes: "tp")
    monkeypatch.setattr(copy_engine_tp, "produce_and_reduce_scatter", pipeline)
    monkeypatch.setattr(parallel, "get_distributed_rank", lambda group: rank)
    dy = torch.randn(WORLD * ROWS, 5)
    pending, made = _tp(True).dgrad_and_reduce(
        dy, COLS, torch.float32, _dgrad(order), 1, lambda: order.append("wgrad") or "dw")
    assert made == "dw"
    assert order == ["dgrad", "dgrad", "wgrad", "closed"]
    torch.testing.assert_close(pending.wait(), 2 * dy[rank * ROWS:(rank + 1) * ROWS, :COLS])


def test_weight_grads_follow_a_started_reduction_without_the_pipeline():
    order = []
    dy = torch.randn(WORLD * ROWS, 5)
    pending, made = _tp(False).dgrad_and_reduce(
        dy, COLS, torch.float32, _dgrad(order), 1, lambda: order.append("wgrad") or "dw")
    assert (made, order) == ("dw", ["dgrad", "wgrad"])
    torch.testing.assert_close(pending.wait(), 2 * dy[:, :COLS])
    # no weight-gradient work: nothing is made
    assert _tp(False).dgrad_and_reduce(dy, COLS, torch.float32, _dgrad([]))[1] is None
