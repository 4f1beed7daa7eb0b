"""When the FP8 sequence-parallel step's side-stream work (module_parts/side_stream.py) applies:
under CUDA-graph capture and under NVTE_TP_OVERLAP=1, never in eager calls under the other
schedules (host-bound there), never off CUDA or while switched off; where a forward casts its
weight (before the input's norm, unless a cast made beside waits) and when a backward starts
the step's amax update (at its last cast, only for a reduction over a group on a GPU). The work
itself and its bit-equality with the in-line order are tested on two GPUs
(tests/distributed/test_fp8_step_overlap_nccl.py)."""
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from transformer_engine.pytorch.module_parts import side_stream
from utils import DEVICES, randn


class _OnGPU:
    is_cuda = True


@pytest.mark.parametrize("mode", ["graphs", "1", "nccl", "0", ""])
@pytest.mark.parametrize("capturing", [False, True])
def test_side_stream_applies_under_capture_or_overlap_1(mode, capturing):
    with mock.patch.dict("os.environ", {"NVTE_TP_OVERLAP": mode}), \
            mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=capturing):
        assert side_stream.usable(_OnGPU()) == (capturing or mode == "1")
        side_stream.enabled = False
        try:
            assert not side_stream.usable(_OnGPU())
        finally:
            side_stream.enabled = True


def test_side_stream_never_for_cpu_tensors():
    with mock.patch.dict("os.environ", {"NVTE_TP_OVERLAP": "1"}):
        assert not side_stream.usable(torch.zeros(2))
        assert side_stream.transpose_beside(torch.zeros(2, 2, dtype=torch.uint8)) is None


@pytest.mark.parametrize("mode", ["graphs", "1", "nccl", "0", ""])
@pytest.mark.parametrize("capturing", [False, True])
def test_row_blocks_under_graphs_only_in_captures(mode, capturing):
    # "graphs" (also the default, "") runs each GEMM whole in eager calls and in row blocks in
    # captures; "1" and "nccl" always in blocks; "0" never
    from transformer_engine.pytorch.module_parts import gather_gemm
    with mock.patch.dict("os.environ", {"NVTE_TP_OVERLAP": mode}), \
            mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=capturing):
        expected = {"graphs": capturing, "": capturing, "1": True, "nccl": True, "0": False}[mode]
        assert gather_gemm._overlap() == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module_name", ["LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("made_beside", [False, True])
def test_weight_cast_before_the_norm_unless_made_beside(module_name, made_beside, device):
    # a weight the forward casts itself is cast before the input's norm (the sequence-parallel
    # gather's copy then starts under the first GEMM block); one made beside is taken after
    # the norm, which must not wait for it
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling
    from transformer_engine.pytorch.module import base, layernorm_linear, layernorm_mlp
    where = layernorm_linear if module_name == "LayerNormLinear" else layernorm_mlp
    calls = []
    cast_weight, make_norm = base.fp8_weight, layernorm_linear.norm_for_gemm

    def weight(*args, **kwargs):
        calls.append("weight")
        return cast_weight(*args, **kwargs)

    def norm(*args, **kwargs):
        calls.append("norm")
        return make_norm(*args, **kwargs)
    torch.manual_seed(0)
    module = getattr(te, module_name)(64, 32, device=device)
    x = randn((16, 64), torch.float32, device, seed=1)
    with te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()):
        module(x)  # makes the module's FP8 state
    if made_beside:  # a stale entry: taken after the norm, then refused, and the cast made there
        module.__dict__["_fp8_weights_beside"] = {1: SimpleNamespace(weight=None)}
    with mock.patch.object(where, "fp8_weight", weight), \
            mock.patch.object(where, "norm_for_gemm", norm), \
            te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling()):
        module(x)
    assert calls[:2] == (["norm", "weight"] if made_beside else ["weight", "norm"])


def test_backward_casts_done_counts_only_group_reductions_on_gpus():
    # the backward update moves to the last backward cast only where it runs beside the
    # backward (an amax reduction over a group, on a GPU); elsewhere the backward counts itself
    # finished at its end as before
    from transformer_engine.pytorch import quantization as q, update_stream
    step = mock.Mock(group=object())
    step.recipe.reduce_amax = True
    cuda = torch.device("cuda", 0)
    assert not q.backward_casts_done(None, cuda)
    assert not q.backward_casts_done(step, torch.device("cpu"))
    for group, reduce_amax in ((None, True), (object(), False)):
        other = mock.Mock(group=group)
        other.recipe.reduce_amax = reduce_amax
        assert not q.backward_casts_done(other, cuda)
        other.backward_finished.assert_not_called()
    update_stream.backward_after_last_cast = False
    try:
        assert not q.backward_casts_done(step, cuda)
    finally:
        update_stream.backward_after_last_cast = True
    step.backward_finished.assert_not_called()
    before = update_stream.runs["backward_after_cast"]
    assert q.backward_casts_done(step, cuda)
    step.backward_finished.assert_called_once_with()
    assert update_stream.runs["backward_after_cast"] == before + 1
