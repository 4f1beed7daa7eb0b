"""The bias gradient of a high-precision linear layer for bench_kernels.py: the column sums of
the output gradient dY [tokens, features] in bf16 (fp32 accumulation, a bf16 result), kernels.dbias
(nvte_dbias) against PyTorch's `dy.sum(0)` eagerly and under torch.compile.

Shapes: the plain bias gradients of a GPT block step at 4096 tokens, hidden 4096 (QKV projection
dY [4096, 12288], attention output projection and FC2 dY [4096, 4096] each; FC1's bias gradient
comes from the fused dbias + dact), grouped so that the driver also prints their total, and one
large [16384, 16384]. Bytes: dY read once + the bias written once."""
import torch

from transformer_engine.pytorch import kernels

BF16 = torch.bfloat16
GPT_BLOCK = [(4096, 12288), (4096, 4096)]
SHAPES = [(4096, 12288), (4096, 4096), (16384, 16384)]


def _randn(shape, i):
    g = torch.Generator(device="cuda").manual_seed(2000 + i)
    return torch.randn(shape, device="cuda", dtype=BF16, generator=g)


def _torch_sum(dy):
    return dy.sum(0)


def _te_sum(dy):
    return kernels.dbias(dy)


def _case(rows, cols):
    # the GPT block has two dY of [4096, 4096]: the group total counts that shape twice
    weight = 2 if (rows, cols) == (4096, 4096) else 1
    return dict(family="bias_grad", name="dbias", shape=(rows, cols), bytes=rows * cols * 2 + cols * 2,
                make=lambda i: (_randn((rows, cols), i),), te=_te_sum, torch=_torch_sum,
                group=("GPT block dY (4096 tokens)", weight) if (rows, cols) in GPT_BLOCK else None)


CASES = [_case(*shape) for shape in SHAPES]
