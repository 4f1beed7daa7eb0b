"""Bad tensor/sequence/context-parallel input raises a clear error on every rank before any
collective, so that no rank waits for another: a tp_size that does not divide the split feature
size, tp_size > 1 without a tp_group, a tp_group whose size differs from tp_size, and a
sequence-parallel row-parallel input whose sequence the group does not divide (two-process gloo
group). Context parallelism's refusal of masks it cannot split is tested in
test_context_parallel.py."""
import os
import sys

import pytest
import torch

import transformer_engine.pytorch as te

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn  # noqa: E402


@pytest.mark.parametrize("mode,in_f,out_f,name", [("column", 32, 30, "out_features 30"),
                                                  ("row", 37, 32, "in_features 37")])
def test_tp_size_must_divide_the_split_features(mode, in_f, out_f, name):
    with pytest.raises(ValueError, match=f"Linear: {name} is not divisible by the tensor-parallel size 4"):
        te.Linear(in_f, out_f, tp_size=4, parallel_mode=mode, device="cpu")
    with pytest.raises(ValueError, match="is not divisible by the tensor-parallel size 4"):
        te.LayerNormMLP(32, 30, tp_size=4, set_parallel_mode=True, device="cpu")


@pytest.mark.parametrize("build", [
    lambda: te.Linear(32, 32, tp_size=2, parallel_mode="column", device="cpu"),
    lambda: te.Linear(32, 32, tp_size=2, parallel_mode="row", device="cpu"),
    lambda: te.LayerNormLinear(32, 32, tp_size=2, parallel_mode="column", device="cpu"),
    lambda: te.LayerNormMLP(32, 64, tp_size=2, set_parallel_mode=True, device="cpu"),
], ids=["linear_column", "linear_row", "layernorm_linear", "layernorm_mlp"])
def test_tp_size_without_a_group_is_refused_at_forward(build):
    m = build()
    x = randn((16, m.in_features if hasattr(m, "in_features") else 32), torch.float32, "cpu", seed=1)
    if isinstance(m, te.Linear) and m.parallel_mode == "row":
        x = randn((16, 16), torch.float32, "cpu", seed=1)
    with pytest.raises(ValueError, match="tp_size=2 but tp_group is None"):
        m(x)


def _body_group_errors(rank, world, group):
    # a tp_size that contradicts the group: refused at construction
    with pytest.raises(ValueError, match="tp_size=4 differs from the size 2 of tp_group"):
        te.Linear(32, 32, tp_group=group, tp_size=4, parallel_mode="column", device="cpu")
    # sequence parallelism over a sequence of 7 rows: refused by every rank before the
    # reduce-scatter (and before the GEMM); the group still works afterwards
    m = te.Linear(32, 32, tp_group=group, parallel_mode="row", sequence_parallel=True, device="cpu")
    with pytest.raises(ValueError, match="7 rows in dim 0 .*not divisible by tp_size=2"):
        m(randn((7, 16), torch.float32, "cpu", seed=2))
    out = m(randn((8, 16), torch.float32, "cpu", seed=3 + rank))
    assert out.shape == (4, 32)


def test_group_errors_are_raised_on_every_rank_before_communicating_two_ranks_gloo():
    _spawn(_body_group_errors)
