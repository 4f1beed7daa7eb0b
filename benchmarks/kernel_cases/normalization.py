"""Normalization cases for bench_kernels.py: LayerNorm and RMSNorm forward and backward, and
LayerNorm with an FP8 output, bf16 activations and weights at 16384x4096 and 32768x8192.

Bytes: x (and dz) read once, z (or dx) written once, plus the fp32 row statistics; the weights
(a few KB) are left out. The "torch" peers are what PyTorch itself runs: F.layer_norm /
F.rms_norm forward and aten's LayerNorm backward kernel; RMSNorm backward, which PyTorch has no
single public kernel for, is the closed-form reference (torch.compile fuses it)."""
import torch
import torch.nn.functional as F

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.normalization import rmsnorm_bwd_reference

SHAPES = [(16384, 4096), (32768, 8192)]
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
EPS = 1e-5


def _randn(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(2000 + seed)
    return torch.randn(shape, device="cuda", dtype=BF16, generator=g)


def _weights(cols, seed):
    return _randn((cols,), seed) * 0.1 + 1.0, _randn((cols,), seed + 1) * 0.1


# ----- peers ------------------------------------------------------------------------------------

def torch_layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def torch_rmsnorm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def torch_layernorm_fp8(x, w, b, scale, amax):
    y = F.layer_norm(x, (x.shape[-1],), w, b, EPS).float()
    torch.maximum(amax, y.abs().amax().reshape(1), out=amax)
    return (y * scale).clamp(-448, 448).to(FP8)


def torch_layernorm_bwd(dz, x, mu, rsigma, w, b):
    return torch.ops.aten.native_layer_norm_backward(dz, x, [x.shape[-1]], mu, rsigma, w, b,
                                                     [True, True, True])


# ----- inputs -----------------------------------------------------------------------------------

def _make_ln_bwd(shape, i):
    x, dz = _randn(shape, i), _randn(shape, 10 + i)
    w, b = _weights(shape[-1], 20 + i)
    # aten's statistics ([rows, 1]) serve both: ours are the same values, flattened.
    _, mu, rsigma = torch.ops.aten.native_layer_norm(x, [shape[-1]], w, b, EPS)
    return dz, x, mu, rsigma, w, b


def _make_rms_bwd(shape, i):
    x, dz = _randn(shape, i), _randn(shape, 10 + i)
    w, _ = _weights(shape[-1], 20 + i)
    rsigma = torch.rsqrt(x.float().square().mean(-1) + EPS)
    return dz, x, rsigma, w


def _cases(rows, cols):
    n, shape = rows * cols, (rows, cols)
    stats = rows * 4
    cases = [
        dict(name="layernorm_fwd", bytes=2 * n * 2 + 2 * stats,
             make=lambda i: (_randn(shape, i), *_weights(cols, 20 + i)),
             te=lambda x, w, b: kernels.layernorm_fwd(x, w, b, EPS), torch=torch_layernorm),
        dict(name="rmsnorm_fwd", bytes=2 * n * 2 + stats,
             make=lambda i: (_randn(shape, i), _weights(cols, 20 + i)[0]),
             te=lambda x, w: kernels.rmsnorm_fwd(x, w, EPS), torch=torch_rmsnorm),
        dict(name="layernorm_bwd", bytes=3 * n * 2 + 2 * stats,
             make=lambda i: _make_ln_bwd(shape, i),
             te=lambda dz, x, mu, rs, w, b: kernels.layernorm_bwd(dz, x, mu.view(-1), rs.view(-1), w),
             torch=torch_layernorm_bwd),
        dict(name="rmsnorm_bwd", bytes=3 * n * 2 + stats,
             make=lambda i: _make_rms_bwd(shape, i),
             te=lambda dz, x, rs, w: kernels.rmsnorm_bwd(dz, x, rs, w),
             torch=lambda dz, x, rs, w: rmsnorm_bwd_reference(dz, x, rs, w)),
    ]
    if rows == SHAPES[0][0]:
        # The FP8 output must cost no more than the bf16 one (it writes half the bytes).
        cases.append(dict(
            name="layernorm_fwd_fp8", bytes=n * 2 + n + 2 * stats,
            make=lambda i: (_randn(shape, i), *_weights(cols, 20 + i),
                            torch.tensor([16.0], device="cuda"), torch.zeros(1, device="cuda")),
            te=lambda x, w, b, s, a: kernels.layernorm_fwd(x, w, b, EPS, fp8_dtype=FP8, scale=s, amax=a),
            torch=torch_layernorm_fp8))
    return cases


CASES = [dict(family="normalization", shape=shape, **case)
         for shape in SHAPES for case in _cases(*shape)]
