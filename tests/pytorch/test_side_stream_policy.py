"""When the FP8 sequence-parallel step's side-stream work (module_parts/side_stream.py) applies:
under CUDA-graph capture and under NVTE_TP_OVERLAP=1, never in eager calls under the other
schedules (host-bound there), never off CUDA or while switched off. The work itself and its
bit-equality with the in-line order are tested on two GPUs
(tests/distributed/test_fp8_step_overlap_nccl.py)."""
from unittest import mock

import pytest
import torch

from transformer_engine.pytorch.module_parts import side_stream


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
