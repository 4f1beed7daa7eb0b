"""Functional LayerNorm, LayerNorm + dense and LayerNorm + MLP (usable without Flax), composed
of the differentiable primitives (each a jax.custom_vjp over the custom calls or the jnp
references) and `dense` (FP8 under fp8_autocast)."""
from __future__ import annotations

from typing import Optional, Sequence

from .dense import dense, fused_gelu_mlp
from .primitives.activation import activation as _activation
from .primitives.normalization import layernorm as _layernorm

# Activation tuples of NVIDIA TE's LayerNormMLP -> the native activation names.
_ACT_ALIASES = {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu",
                "quick_gelu": "qgelu", "qgelu": "qgelu", "squared_relu": "srelu", "srelu": "srelu",
                "sigmoid": "sigmoid"}
_GATED_OF = {"gelu": "geglu", "relu": "reglu", "silu": "swiglu", "qgelu": "qgeglu",
             "srelu": "sreglu", "sigmoid": "glu"}


def activation_name(activations: Sequence[str]) -> Optional[str]:
    """('gelu',) -> 'gelu'; ('silu', 'linear') -> 'swiglu'; ('linear',) -> None (identity)."""
    acts = tuple(a.lower() for a in activations)
    if acts == ("linear",):
        return None
    if len(acts) == 1 and acts[0] in _ACT_ALIASES:
        return _ACT_ALIASES[acts[0]]
    if len(acts) == 2 and acts[1] == "linear" and acts[0] in _ACT_ALIASES:
        return _GATED_OF[_ACT_ALIASES[acts[0]]]
    raise ValueError(f"layernorm_mlp: activations {activations!r} not supported; expected one of "
                     f"{sorted(_ACT_ALIASES)} alone or followed by 'linear' (gated), or ('linear',)")


def layernorm(x, gamma, beta=None, layernorm_type="layernorm", zero_centered_gamma=False,
              epsilon=1e-6):
    """LayerNorm ('layernorm') or RMSNorm ('rmsnorm') over the last dimension."""
    if beta is None and layernorm_type == "layernorm":
        raise ValueError("layernorm: beta is required for layernorm_type='layernorm'")
    return _layernorm(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type)


def activation(x, activation_type: Sequence[str] = ("gelu",)):
    """act(x) for an activation tuple; gated forms take x [..., 2 * N] (act half first)."""
    name = activation_name(activation_type)
    return x if name is None else _activation(x, name)


def layernorm_dense(x, kernel, gamma, beta=None, bias=None, layernorm_type="layernorm",
                    zero_centered_gamma=False, epsilon=1e-6, fp8_meta=None):
    """dense(layernorm(x), kernel, bias)."""
    h = layernorm(x, gamma, beta, layernorm_type, zero_centered_gamma, epsilon)
    return dense(h, kernel, bias, fp8_meta)


def layernorm_mlp(x, gamma, beta, kernels, biases=(None, None), layernorm_type="layernorm",
                  zero_centered_gamma=False, epsilon=1e-6, activation_type=("gelu",),
                  fp8_metas=(None, None), intermediate_fn=None):
    """fc2(act(fc1(layernorm(x)))). kernels: (kernel_1 [hidden, n_act * inter],
    kernel_2 [inter, hidden]) with n_act = len(activation_type) (gated: act half first);
    intermediate_fn, e.g. dropout, is applied to the activation's output."""
    k1, k2 = kernels
    b1, b2 = biases
    h = layernorm(x, gamma, beta, layernorm_type, zero_centered_gamma, epsilon)
    if activation_name(activation_type) == "gelu" and intermediate_fn is None:
        fused = fused_gelu_mlp(h, k1, b1, k2, b2)
        if fused is not None:
            return fused
    y1 = dense(h, k1, b1, fp8_metas[0])
    a = activation(y1, activation_type)
    if intermediate_fn is not None:
        a = intermediate_fn(a)
    return dense(a, k2, b2, fp8_metas[1])
