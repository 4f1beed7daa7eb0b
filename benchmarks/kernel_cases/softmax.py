"""Softmax cases for bench_kernels.py: scaled softmax forward and backward over rows of
[rows, sk] = [16384, 4096] and [32768, 8192] bf16 (attention scores viewed as b*h*sq rows), the
masked form as [2, 8, 1024, 4096] with a [2, 1, 1024, 4096] bool mask, and the causal form as
[4, 4096, 4096].

Bytes: inputs read once and outputs written once; the mask counts once (it is shared by the
heads). The causal kernels only need the lower triangle of their inputs (the rest is masked),
so those cases count half the input bytes plus the full output. The "torch" peers are the
plain-PyTorch reference (softmax in fp32 after scaling and masking)."""
import torch

from transformer_engine.pytorch import kernels

BF16 = torch.bfloat16
SCALE = 0.125


def _randn(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(3000 + seed)
    return torch.randn(shape, device="cuda", dtype=BF16, generator=g)


# ----- peers ------------------------------------------------------------------------------------

def torch_softmax(x):
    return torch.softmax(x.float() * SCALE, -1).to(x.dtype)


def torch_softmax_bwd(dy, y):
    yf = y.float()
    dyf = dy.float()
    return (SCALE * yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(y.dtype)


def torch_masked_softmax(x, mask):
    return torch.softmax((x.float() * SCALE).masked_fill(mask, float("-inf")), -1).to(x.dtype)


def torch_causal_softmax(x):
    sq, sk = x.shape[-2:]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)
    return torch.softmax((x.float() * SCALE).masked_fill(mask, float("-inf")), -1).to(x.dtype)


# ----- cases ------------------------------------------------------------------------------------

def _rows_cases(rows, sk):
    n, shape = rows * sk, (rows, sk)
    return [
        dict(name="softmax_fwd", shape=shape, bytes=2 * n * 2, make=lambda i: (_randn(shape, i),),
             te=lambda x: kernels.scaled_softmax_forward(x, SCALE), torch=torch_softmax),
        dict(name="softmax_bwd", shape=shape, bytes=3 * n * 2,
             make=lambda i: (_randn(shape, i), torch.softmax(_randn(shape, 10 + i).float(), -1).to(BF16)),
             te=lambda dy, y: kernels.scaled_softmax_backward(dy, y, SCALE), torch=torch_softmax_bwd),
    ]


def _masked_case():
    shape, mask_shape = (2, 8, 1024, 4096), (2, 1, 1024, 4096)
    n = 2 * 8 * 1024 * 4096

    def make(i):
        g = torch.Generator(device="cuda").manual_seed(4000 + i)
        mask = torch.rand(mask_shape, device="cuda", generator=g) < 0.2
        return _randn(shape, i), mask
    return dict(name="masked_softmax_fwd", shape=shape, bytes=2 * n * 2 + n // 8, make=make,
                te=lambda x, m: kernels.scaled_masked_softmax_forward(x, m, SCALE),
                torch=torch_masked_softmax)


def _causal_cases():
    shape = (4, 4096, 4096)
    n = 4 * 4096 * 4096
    return [
        dict(name="causal_softmax_fwd", shape=shape, bytes=(n // 2 + n) * 2,
             make=lambda i: (_randn(shape, i),),
             te=lambda x: kernels.scaled_upper_triang_masked_softmax_forward(x, SCALE),
             torch=torch_causal_softmax),
        dict(name="causal_softmax_bwd", shape=shape, bytes=(n + n) * 2,
             make=lambda i: (_randn(shape, i), torch_causal_softmax(_randn(shape, 10 + i))),
             te=lambda dy, y: kernels.scaled_upper_triang_masked_softmax_backward(dy, y, SCALE),
             torch=torch_softmax_bwd),
    ]


CASES = [dict(family="softmax", **case)
         for case in _rows_cases(16384, 4096) + [_masked_case()] + _causal_cases()
         + _rows_cases(32768, 8192)]
