"""FSDP2 over NCCL, one process per GPU: the cases of fsdp_cases.py (FP32 weights, and
quantized_model_init FP8 weights all-gathered as FP8) train like the unsharded model for 20 steps
and round-trip through torch.distributed.checkpoint. Needs two GPUs; the same cases run in a
two-process gloo group on the CPU in tests/pytorch/test_fsdp.py."""
import functools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp_cases  # noqa: E402
from nccl_spawn import spawn_nccl  # noqa: E402

WORLD, STEPS = 2, 20


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _body(rank, world, group, precision):
    fsdp_cases.run_fsdp_case(rank, world, group, "cuda", precision, STEPS)


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_fsdp2_matches_unsharded_and_checkpoints_nccl(precision):
    if _gpus() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs with the native backend; {_gpus()} visible")
    spawn_nccl(functools.partial(_body, precision=precision), WORLD)
