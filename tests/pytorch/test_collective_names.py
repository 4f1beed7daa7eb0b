"""The single-tensor collectives (collectives.all_gather_single / reduce_scatter_single, which the
NCCL paths call) go by the names this torch gives them: all_gather_single and
reduce_scatter_single where torch has them (torch 2.13 renamed all_gather_into_tensor and
reduce_scatter_tensor, whose old names now warn), the old names on older torch; and on a
two-process gloo group they gather and reduce-scatter without a warning."""
import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

from transformer_engine.pytorch import collectives

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn  # noqa: E402

_PAIRS = (("all_gather_single", "all_gather_into_tensor"),
          ("reduce_scatter_single", "reduce_scatter_tensor"))


def _recording(calls, name):
    def call(out, inp, group=None, async_op=False):
        calls.append((name, group, async_op))
        return "handle"
    return call


@pytest.mark.parametrize("new,old", _PAIRS)
def test_the_newer_name_is_called_where_torch_has_it(monkeypatch, new, old):
    calls = []
    monkeypatch.setattr(dist, new, _recording(calls, new), raising=False)
    monkeypatch.setattr(dist, old, _recording(calls, old))
    t = torch.zeros(2)
    assert getattr(collectives, new)(t, t, group="g", async_op=True) == "handle"
    assert calls == [(new, "g", True)]


@pytest.mark.parametrize("new,old", _PAIRS)
def test_the_older_name_serves_a_torch_without_the_newer(monkeypatch, new, old):
    calls = []
    monkeypatch.delattr(dist, new, raising=False)
    monkeypatch.setattr(dist, old, _recording(calls, old))
    t = torch.zeros(2)
    assert getattr(collectives, new)(t, t, group="g") == "handle"
    assert calls == [(old, "g", False)]


def _body_single_tensor_collectives(rank, world, group):
    xs = [randn((2 * world, 3), torch.float32, "cpu", seed=30 + r) for r in range(world)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        gathered = torch.empty(world * 2 * world, 3)
        handle = collectives.all_gather_single(gathered, xs[rank], group=group, async_op=True)
        handle.wait()
        assert torch.equal(gathered, torch.cat(xs))
        mine = torch.empty(2, 3)
        collectives.reduce_scatter_single(mine, xs[rank].clone(), group=group)
    torch.testing.assert_close(mine, sum(xs)[2 * rank:2 * rank + 2], rtol=1e-6, atol=1e-6)


def test_single_tensor_collectives_two_ranks_gloo():
    _spawn(_body_single_tensor_collectives)
