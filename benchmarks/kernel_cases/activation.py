"""Activation cases for bench_kernels.py: gelu and swiglu forward and backward, the fused
dbias + dgelu, and gelu with an FP8 output, at 16384x4096 and 32768x8192 bf16 (the input's shape;
swiglu's input holds both halves, its output is half as wide).

Bytes: every input read once + every output written once. The "torch" peers are the plain
PyTorch code a user would write (torch.compile is applied to them by the driver)."""
import torch
import torch.nn.functional as F

from transformer_engine.pytorch import ops

SHAPES = [(16384, 4096), (32768, 8192)]
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def _randn(shape, i):
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    return torch.randn(shape, device="cuda", dtype=BF16, generator=g)


# ----- peers ------------------------------------------------------------------------------------

def torch_gelu(x):
    return F.gelu(x, approximate="tanh")


def torch_swiglu(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def torch_dgelu(g, x):
    return torch.ops.aten.gelu_backward(g, x, approximate="tanh")


def torch_dswiglu(g, x):
    a, b = x.float().chunk(2, dim=-1)
    s = torch.sigmoid(a)
    gf = g.float()
    return torch.cat((gf * b * (s + a * s * (1 - s)), gf * a * s), dim=-1).to(x.dtype)


def torch_dbias_dgelu(g, x):
    dx = torch.ops.aten.gelu_backward(g, x, approximate="tanh")
    return dx, dx.float().sum(0).to(x.dtype)


def torch_gelu_fp8(x, scale, amax):
    y = F.gelu(x.float(), approximate="tanh")
    torch.maximum(amax, y.abs().amax().reshape(1), out=amax)
    return (y * scale).clamp(-448, 448).to(FP8)


# ----- cases ------------------------------------------------------------------------------------

def _cases(rows, cols):
    n = rows * cols
    shape = (rows, cols)
    half = (rows, cols // 2)
    return [
        dict(name="gelu_fwd", bytes=2 * n * 2, make=lambda i: (_randn(shape, i),),
             te=lambda x: ops.activation_forward(x, "gelu"), torch=torch_gelu),
        dict(name="swiglu_fwd", bytes=(n + n // 2) * 2, make=lambda i: (_randn(shape, i),),
             te=lambda x: ops.activation_forward(x, "swiglu"), torch=torch_swiglu),
        dict(name="gelu_bwd", bytes=3 * n * 2,
             make=lambda i: (_randn(shape, i), _randn(shape, 10 + i)),
             te=lambda g, x: ops.activation_backward(g, x, "gelu"), torch=torch_dgelu),
        dict(name="swiglu_bwd", bytes=(n // 2 + 2 * n) * 2,
             make=lambda i: (_randn(half, i), _randn(shape, 10 + i)),
             te=lambda g, x: ops.activation_backward(g, x, "swiglu"), torch=torch_dswiglu),
        dict(name="dbias_dgelu", bytes=3 * n * 2 + cols * 2,
             make=lambda i: (_randn(shape, i), _randn(shape, 10 + i)),
             te=lambda g, x: ops.dbias_dactivation(g, x, "gelu"), torch=torch_dbias_dgelu),
        dict(name="gelu_fwd_fp8", bytes=n * 2 + n,
             make=lambda i: (_randn(shape, i), torch.tensor([2.0], device="cuda"),
                             torch.zeros(1, device="cuda")),
             te=lambda x, s, a: ops.activation_forward(x, "gelu", fp8_dtype=FP8, scale=s, amax=a),
             torch=torch_gelu_fp8),
    ]


CASES = [dict(family="activation", shape=shape, **case)
         for shape in SHAPES for case in _cases(*shape)]
