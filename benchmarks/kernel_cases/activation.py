"""Activation cases for bench_kernels.py: every activation (gelu, relu, qgelu, srelu, silu) and
every gated form (geglu, reglu, qgeglu, sreglu, swiglu), forward and backward, the fused
dbias + dact of each plain activation, and gelu with an FP8 output, at 16384x4096 and 32768x8192
bf16 (the input's shape; a gated input holds both halves, its output is half as wide).

Bytes: every input read once + every output written once. The "torch" peers are the plain
PyTorch code a user would write (torch.compile is applied to them by the driver): PyTorch's own
kernels where it has one (F.gelu, F.relu, F.silu and their aten backward kernels), otherwise the
closed-form expression in fp32, rounded once."""
import torch
import torch.nn.functional as F

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.activation import ACTIVATIONS, GATED

SHAPES = [(16384, 4096), (32768, 8192)]
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
_QGELU = 1.702


def _randn(shape, i):
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    return torch.randn(shape, device="cuda", dtype=BF16, generator=g)


# ----- peers ------------------------------------------------------------------------------------

def _forward(name):
    """act(x) as a user writes it, in x's dtype."""
    return {
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu,
        "qgelu": lambda x: x * torch.sigmoid(_QGELU * x),
        "srelu": lambda x: F.relu(x).square(),
        "silu": F.silu,
    }[name]


def _value_fp32(name, a):
    return _forward(name)(a)


def _deriv_fp32(name, a):
    """act'(a) for fp32 a."""
    if name == "gelu":
        k = 0.7978845608028654
        u = k * a * (1 + 0.044715 * a * a)
        t = torch.tanh(u)
        return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)
    if name == "relu":
        return (a > 0).float()
    if name == "qgelu":
        s = torch.sigmoid(_QGELU * a)
        return s + _QGELU * a * s * (1 - s)
    if name == "srelu":
        return 2 * F.relu(a)
    s = torch.sigmoid(a)  # silu
    return s + a * s * (1 - s)


def _plain_backward(name):
    """dx = grad * act'(x): PyTorch's backward kernel where it has one."""
    if name == "gelu":
        return lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh")
    if name == "relu":
        return lambda g, x: torch.ops.aten.threshold_backward(g, x, 0)
    if name == "silu":
        return lambda g, x: torch.ops.aten.silu_backward(g, x)
    return lambda g, x: (g.float() * _deriv_fp32(name, x.float())).to(x.dtype)


def _gated_forward(base):
    act = _forward(base)

    def fwd(x):
        a, b = x.chunk(2, dim=-1)
        return act(a) * b
    return fwd


def _gated_backward(base):
    def bwd(g, x):
        a, b = x.float().chunk(2, dim=-1)
        gf = g.float()
        return torch.cat((gf * b * _deriv_fp32(base, a), gf * _value_fp32(base, a)),
                         dim=-1).to(x.dtype)
    return bwd


def _dbias_backward(name):
    dact = _plain_backward(name)

    def bwd(g, x):
        dx = dact(g, x)
        return dx, dx.float().sum(0).to(x.dtype)
    return bwd


def torch_gelu_fp8(x, scale, amax):
    y = F.gelu(x.float(), approximate="tanh")
    torch.maximum(amax, y.abs().amax().reshape(1), out=amax)
    return (y * scale).clamp(-448, 448).to(FP8)


# ----- cases ------------------------------------------------------------------------------------

def _te_fwd(name):
    return lambda x: kernels.activation_forward(x, name)


def _te_bwd(name):
    return lambda g, x: kernels.activation_backward(g, x, name)


def _te_dbias(name):
    return lambda g, x: kernels.dbias_dactivation(g, x, name)


def _cases(rows, cols):
    n = rows * cols
    shape, half = (rows, cols), (rows, cols // 2)
    one = lambda i: (_randn(shape, i),)  # noqa: E731
    grad_full = lambda i: (_randn(shape, i), _randn(shape, 10 + i))  # noqa: E731
    grad_half = lambda i: (_randn(half, i), _randn(shape, 10 + i))  # noqa: E731
    cases = []
    for name in ACTIVATIONS:
        cases += [
            dict(name=f"{name}_fwd", bytes=2 * n * 2, make=one, te=_te_fwd(name),
                 torch=_forward(name)),
            dict(name=f"{name}_bwd", bytes=3 * n * 2, make=grad_full, te=_te_bwd(name),
                 torch=_plain_backward(name)),
            dict(name=f"dbias_d{name}", bytes=3 * n * 2 + cols * 2, make=grad_full,
                 te=_te_dbias(name), torch=_dbias_backward(name)),
        ]
    for name, base in GATED.items():
        cases += [
            dict(name=f"{name}_fwd", bytes=(n + n // 2) * 2, make=one, te=_te_fwd(name),
                 torch=_gated_forward(base)),
            dict(name=f"{name}_bwd", bytes=(n // 2 + 2 * n) * 2, make=grad_half,
                 te=_te_bwd(name), torch=_gated_backward(base)),
        ]
    cases.append(dict(
        name="gelu_fwd_fp8", bytes=n * 2 + n,
        make=lambda i: (_randn(shape, i), torch.tensor([2.0], device="cuda"),
                        torch.zeros(1, device="cuda")),
        te=lambda x, s, a: kernels.activation_forward(x, "gelu", fp8_dtype=FP8, scale=s, amax=a),
        torch=torch_gelu_fp8))
    return cases


CASES = [dict(family="activation", shape=shape, **case)
         for shape in SHAPES for case in _cases(*shape)]
