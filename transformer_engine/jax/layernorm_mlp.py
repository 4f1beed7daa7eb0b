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
    """LayerNorm or RMSNorm over the last dimension; differentiable.

    Native kernels through XLA FFI on NVIDIA and AMD GPUs, jnp code on the CPU.

    Parameters
    ----------
    x : jax.Array
        Input ``[..., hidden]``.
    gamma : jax.Array
        Scale ``[hidden]``.
    beta : jax.Array, optional
        Bias ``[hidden]``; required for ``'layernorm'``, unused for ``'rmsnorm'``.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    zero_centered_gamma : bool, default False
        ``gamma`` is stored as ``gamma - 1``: the output is scaled by ``1 + gamma``.
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    """
    if beta is None and layernorm_type == "layernorm":
        raise ValueError("layernorm: beta is required for layernorm_type='layernorm'")
    return _layernorm(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type)


def activation(x, activation_type: Sequence[str] = ("gelu",)):
    """Apply an activation (plain or gated); differentiable.

    Parameters
    ----------
    x : jax.Array
        Input ``[..., n]``; for a gated activation ``[..., 2 * n]`` with the activated half first.
    activation_type : sequence of str, default ('gelu',)
        One name for a plain activation: ``'gelu'``, ``'relu'``, ``'silu'`` (or ``'swish'``),
        ``'quick_gelu'`` (``'qgelu'``), ``'squared_relu'`` (``'srelu'``); the same name followed
        by ``'linear'`` for its gated form (e.g. ``('silu', 'linear')`` is SwiGLU); or
        ``('linear',)`` for the identity.

    Returns
    -------
    jax.Array
        ``[..., n]``.
    """
    name = activation_name(activation_type)
    return x if name is None else _activation(x, name)


def layernorm_dense(x, kernel, gamma, beta=None, bias=None, layernorm_type="layernorm",
                    zero_centered_gamma=False, epsilon=1e-6, fp8_meta=None):
    """``dense(layernorm(x), kernel, bias)``; FP8 GEMM under :func:`fp8_autocast`.

    Parameters
    ----------
    x : jax.Array
        Input ``[..., hidden]``.
    kernel : jax.Array
        Weight ``[hidden, m]``.
    gamma : jax.Array
        Norm scale ``[hidden]``.
    beta : jax.Array, optional
        Norm bias ``[hidden]`` (required for ``'layernorm'``).
    bias : jax.Array, optional
        GEMM bias ``[m]``.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    zero_centered_gamma : bool, default False
        ``gamma`` is stored as ``gamma - 1``: the output is scaled by ``1 + gamma``.
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    fp8_meta : tuple of jax.Array, optional
        ``(amax_history, scale[, skipped_updates])``: the GEMM's FP8 state (see :func:`dense`);
        required under delayed scaling, optional under current scaling, ignored outside FP8.
    """
    h = layernorm(x, gamma, beta, layernorm_type, zero_centered_gamma, epsilon)
    return dense(h, kernel, bias, fp8_meta)


def layernorm_mlp(x, gamma, beta, kernels, biases=(None, None), layernorm_type="layernorm",
                  zero_centered_gamma=False, epsilon=1e-6, activation_type=("gelu",),
                  fp8_metas=(None, None), intermediate_fn=None):
    """``fc2(act(fc1(layernorm(x))))``; FP8 GEMMs under :func:`fp8_autocast`.

    Parameters
    ----------
    x : jax.Array
        Input ``[..., hidden]``.
    gamma : jax.Array
        Norm scale ``[hidden]``.
    beta : jax.Array or None
        Norm bias ``[hidden]`` (required for ``'layernorm'``).
    kernels : tuple of (jax.Array, jax.Array)
        ``(kernel_1 [hidden, n_act * inter], kernel_2 [inter, hidden])`` where ``n_act`` is
        ``len(activation_type)`` (2 for gated activations, activated half first).
    biases : tuple of (jax.Array or None, jax.Array or None), default (None, None)
        Biases of the two GEMMs, ``[n_act * inter]`` and ``[hidden]``.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    zero_centered_gamma : bool, default False
        ``gamma`` is stored as ``gamma - 1``: the output is scaled by ``1 + gamma``.
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    activation_type : sequence of str, default ('gelu',)
        One name for a plain activation: ``'gelu'``, ``'relu'``, ``'silu'`` (or ``'swish'``),
        ``'quick_gelu'`` (``'qgelu'``), ``'squared_relu'`` (``'srelu'``); the same name followed
        by ``'linear'`` for its gated form (e.g. ``('silu', 'linear')`` is SwiGLU); or
        ``('linear',)`` for the identity.
    fp8_metas : tuple, default (None, None)
        The ``fp8_meta`` of each GEMM (see :func:`dense`).
    intermediate_fn : callable, optional
        Applied to the activation's output before the second GEMM, e.g. dropout.
    """
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
