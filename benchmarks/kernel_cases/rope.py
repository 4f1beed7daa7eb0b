"""Fused RoPE cases for bench_kernels.py: forward and backward, sbhd, rotate-half, full rotary
dim, bf16, on [s, b, h, d] tensors viewed as 16384x4096 (s=4096, b=4, h=32, d=128) and 32768x8192
(s=8192, b=4, h=64, d=128) tokens x features.

Bytes: x (or grad) read once, the output written once, the freqs table read once. The "torch"
peer is the plain reference of kernels/rope.py (fp32 maths, one rounding)."""
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.rope import rope_reference

# (s, b, h, d) and the 2-D shape they stand for.
SHAPES = [((4096, 4, 32, 128), (16384, 4096)), ((8192, 4, 64, 128), (32768, 8192))]
BF16 = torch.bfloat16


def _freqs(s, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, device="cuda", dtype=torch.float32), inv)
    return torch.cat((ang, ang), dim=-1).reshape(s, 1, 1, d)


def _make(sbhd):
    s, _, _, d = sbhd

    def make(i):
        g = torch.Generator(device="cuda").manual_seed(2000 + i)
        return torch.randn(sbhd, device="cuda", dtype=BF16, generator=g), _freqs(s, d)
    return make


def torch_rope_bwd(g, freqs):
    # The backward of rotate-half RoPE with freqs = cat(f, f): rotation by the opposite angle.
    return rope_reference(g, -freqs)


CASES = []
for sbhd, flat in SHAPES:
    n = flat[0] * flat[1]
    table = sbhd[0] * sbhd[3] * 4
    CASES += [
        dict(family="rope", name="rope_fwd_sbhd", shape=flat, bytes=2 * n * 2 + table,
             make=_make(sbhd), te=lambda x, f: kernels.rope_forward(x, f, "sbhd"),
             torch=lambda x, f: rope_reference(x, f, "sbhd")),
        dict(family="rope", name="rope_bwd_sbhd", shape=flat, bytes=2 * n * 2 + table,
             make=_make(sbhd), te=lambda g, f: kernels.rope_backward(g, f, "sbhd"),
             torch=torch_rope_bwd),
    ]
