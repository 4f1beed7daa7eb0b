"""FSDP2 (torch.distributed.fsdp.fully_shard) over te modules in a two-process gloo group on the
CPU: the cases of tests/distributed/fsdp_cases.py (a sharded LayerNormMLP + Linear stack trains
step for step like the unsharded model on the whole batch, with FP32 weights and with
quantized_model_init FP8 weights all-gathered as FP8, and its sharded state round-trips through
torch.distributed.checkpoint). The NCCL two-GPU run of the same cases is in tests/distributed."""
import functools
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "distributed"))
from test_distributed import _spawn  # noqa: E402
import fsdp_cases  # noqa: E402


def _body(rank, world, group, precision, steps):
    fsdp_cases.run_fsdp_case(rank, world, group, "cpu", precision, steps)


def test_fsdp2_matches_unsharded_and_checkpoints_two_ranks_gloo():
    _spawn(functools.partial(_body, precision="fp32", steps=6))


def test_fsdp2_fp8_weights_gather_fp8_and_match_unsharded_two_ranks_gloo():
    _spawn(functools.partial(_body, precision="fp8", steps=20))
