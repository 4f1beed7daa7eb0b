"""Flax modules DenseGeneral, LayerNorm, LayerNormDenseGeneral and LayerNormMLP with the argument
names of NVIDIA TE's JAX API, built on the functional ops (FP8 under fp8_autocast/autocast;
delayed-scaling metadata in the FP8_COLLECTION variable collection, see
transformer_engine.jax.fp8)."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax.numpy as jnp

from .. import fp8 as fp8_mod
from ...common import config
from ..dense import dense, fused_gelu_mlp
from ..layernorm_mlp import activation as _activation, activation_name, layernorm
from ..sharding import with_sharding_constraint
from ..skipped_updates import SKIPPED_SUFFIX, warn_in_step

Initializer = Callable[..., Any]


def _default_kernel_init():
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def _canon(axis, ndim):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axes)


class _FP8Metas(nn.Module):
    """Mixin: the FP8 state of one dense op (see transformer_engine.jax.fp8), created under FP8."""

    def fp8_meta(self, name: str):
        """The ``(amax_history, scale, skipped_updates)`` FP8 variables of one dense op, or None.

        Under delayed scaling all three are variables of the ``FP8_COLLECTION`` collection. Under
        current scaling ``amax_history`` is None and the other two are made at ``init``; applied
        without them the op casts statelessly (a non-finite amax then casts with scale 1 and is
        not counted). Outside FP8 the result is None. Variables made before the skip count
        existed are used as they are, with ``skipped_updates`` None.

        Parameters
        ----------
        name : str
            Prefix of the variables' names (e.g. ``'kernel'``).
        """
        cfg = fp8_mod.current_fp8_config()
        if cfg is None:
            return None
        col = fp8_mod.FP8_COLLECTION
        hist = None
        if cfg.delayed:
            hist0, _, _ = fp8_mod.init_fp8_meta(fp8_mod.get_fp8_recipe().amax_history_len)
            hist = self.variable(col, f"{name}_amax_history", lambda: hist0).value
        elif not self._can_hold(f"{name}_scale"):
            return None
        scale = self.variable(col, f"{name}_scale",
                              lambda: jnp.ones((fp8_mod.NUM_META,), jnp.float32)).value
        skipped = None
        if self._can_hold(f"{name}{SKIPPED_SUFFIX}"):
            skipped = self.variable(col, f"{name}{SKIPPED_SUFFIX}",
                                    fp8_mod.init_skipped_updates).value
            if config.jax_warn_skipped_updates_in_step() and not self.is_initializing():
                path = "/".join(tuple(self.scope.path) + (name,))
                warn_in_step(path, type(fp8_mod.get_fp8_recipe()).__name__, skipped)
        return hist, scale, skipped

    def _can_hold(self, var: str) -> bool:
        """Whether the FP8 variable `var` exists or may be made now (at init)."""
        col = fp8_mod.FP8_COLLECTION
        return self.has_variable(col, var) or self.is_mutable_collection(col)


def _data_parallel(x):
    dp = fp8_mod.get_mesh_resource().dp_resource
    return with_sharding_constraint(x, dp, *([None] * (x.ndim - 1)))


class DenseGeneral(_FP8Metas):
    """A dense layer contracting the trailing dimensions of the input, FP8 under ``fp8_autocast``.

    ``y = x @ kernel (+ bias)``, with ``kernel`` of shape ``in_shape + features``. FP8 runs through
    XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on the CPU
    (emulated, the same numerics). FP8 is
    used when the token count and both GEMM sizes are multiples of 16. Under
    :func:`transformer_engine.jax.fp8_autocast` the module creates FP8 variables in the
    ``FP8_COLLECTION`` collection: the amax history (delayed scaling), the scales and the count
    of updates skipped for a NaN or infinite amax (read it with
    :func:`transformer_engine.jax.fp8_skipped_updates`).

    Parameters
    ----------
    features : int or tuple of int
        Output feature dimensions.
    kernel_init : callable, optional
        Initialiser of the kernel, called as ``init(key, shape, dtype)`` (default: variance
        scaling 1.0, fan-in, truncated normal).
    kernel_axes : tuple of str, default ()
        Logical axis names of the kernel, for sharding rules (recorded with the parameter).
    use_bias : bool, default True
        Whether the layer has a bias.
    bias_init : callable, default zeros
        Initialiser of the bias.
    bias_axes : tuple of str, default ()
        Logical axis names of the bias, for sharding rules (recorded with the parameter).
    enable_low_rank_adaptation : bool, default False
        Add a trainable low-rank update ``x @ A @ B * alpha / rank`` (LoRA) to the output.
    low_rank_adaptation_dim : int, default 32
        The rank of ``A`` and ``B``.
    low_rank_adaptation_alpha : float, optional
        Scale numerator of the update; ``None`` scales by 1.
    axis : int or tuple of int, default -1
        The input dimensions contracted with the kernel; they must be the trailing ones.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    input_axes : tuple of str, default ()
        Logical axis names of the input, for sharding rules.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    """
    features: Union[Iterable[int], int]
    kernel_init: Optional[Initializer] = None
    kernel_axes: Tuple[str, ...] = ()
    use_bias: bool = True
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: Tuple[str, ...] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: Optional[float] = None
    axis: Union[Iterable[int], int] = -1
    dtype: Any = jnp.float32
    input_axes: Tuple[str, ...] = ()
    transpose_batch_sequence: bool = False

    @nn.compact
    def __call__(self, inputs):
        """Apply the layer.

        Parameters
        ----------
        inputs : jax.Array
            Input whose trailing dimensions (``axis``) are contracted.

        Returns
        -------
        jax.Array
            ``inputs.shape[:-len(axis)] + features``.
        """
        x = jnp.asarray(inputs, self.dtype)
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        axes = _canon(self.axis, x.ndim)
        if axes != tuple(range(x.ndim - len(axes), x.ndim)):
            raise ValueError(f"DenseGeneral: axis {self.axis} must be the trailing dims of the "
                             f"input (shape {x.shape})")
        in_shape = tuple(x.shape[a] for a in axes)
        kernel = self.param("kernel", self.kernel_init or _default_kernel_init(),
                            in_shape + features, self.dtype)
        k, m = math.prod(in_shape), math.prod(features)
        kernel2 = kernel.reshape(k, m)
        bias = self.param("bias", self.bias_init, features, self.dtype).reshape(m) \
            if self.use_bias else None
        lead = x.shape[:x.ndim - len(axes)]
        x2 = _data_parallel(x.reshape(lead + (k,)))
        tp = fp8_mod.get_mesh_resource().tp_resource
        kernel2 = with_sharding_constraint(kernel2, None, tp)
        y = dense(x2, kernel2, bias, self.fp8_meta("kernel"))
        if self.enable_low_rank_adaptation:
            r = self.low_rank_adaptation_dim
            a = self.param("lora_a_kernel", _default_kernel_init(), (k, r), self.dtype)
            b = self.param("lora_b_kernel", nn.initializers.zeros, (r, m), self.dtype)
            scale = (self.low_rank_adaptation_alpha / r) if self.low_rank_adaptation_alpha else 1.0
            y = y + (x2 @ a @ b) * scale
        return y.reshape(lead + features)


class LayerNorm(nn.Module):
    """LayerNorm or RMSNorm over the last dimension (native kernels on NVIDIA and AMD GPUs).

    Parameters
    ----------
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    zero_centered_gamma : bool, default False
        Store the scale as ``gamma - 1`` (initialised to zero): the output is scaled by
        ``1 + gamma``.
    scale_init : callable, optional
        Initialiser of the norm's scale (default ones, zeros with ``zero_centered_gamma``).
    scale_axes : tuple of str, default ('embed',)
        Logical axis names of the scale.
    bias_init : callable, default zeros
        Initialiser of the bias (``'layernorm'`` only).
    bias_axes : tuple of str, default ('embed',)
        Logical axis names of the bias.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    """
    epsilon: float = 1e-6
    layernorm_type: str = "layernorm"
    zero_centered_gamma: bool = False
    scale_init: Optional[Initializer] = None
    scale_axes: Tuple[str, ...] = ("embed",)
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: Tuple[str, ...] = ("embed",)
    dtype: Any = jnp.float32
    transpose_batch_sequence: bool = False

    def norm_params(self, hidden):
        """Create (or fetch) the norm's parameters.

        Parameters
        ----------
        hidden : int
            Size of the normalised dimension.

        Returns
        -------
        tuple
            ``(scale, bias)``; bias is None for ``'rmsnorm'``.
        """
        init = self.scale_init or (nn.initializers.zeros if self.zero_centered_gamma
                                   else nn.initializers.ones)
        gamma = self.param("scale", init, (hidden,), self.dtype)
        beta = self.param("ln_bias", self.bias_init, (hidden,), self.dtype) \
            if self.layernorm_type == "layernorm" else None
        return gamma, beta

    @nn.compact
    def __call__(self, x):
        """Normalise ``x`` over its last dimension.

        Parameters
        ----------
        x : jax.Array
            Input ``[..., hidden]``.
        """
        if self.layernorm_type not in ("layernorm", "rmsnorm"):
            raise ValueError(f"LayerNorm: layernorm_type is {self.layernorm_type!r}; expected "
                             f"'layernorm' or 'rmsnorm'")
        x = jnp.asarray(x, self.dtype)
        gamma, beta = self.norm_params(x.shape[-1])
        return layernorm(x, gamma, beta, self.layernorm_type, self.zero_centered_gamma,
                         self.epsilon)


def _norm_params(module, hidden):
    init = module.scale_init or (nn.initializers.zeros if module.zero_centered_gamma
                                 else nn.initializers.ones)
    gamma = module.param("scale", init, (hidden,), module.dtype)
    beta = module.param("ln_bias", module.ln_bias_init, (hidden,), module.dtype) \
        if module.layernorm_type == "layernorm" else None
    return gamma, beta


class LayerNormDenseGeneral(_FP8Metas):
    """A norm followed by a dense layer: ``dense(norm(x))``, FP8 under ``fp8_autocast``.

    FP8 runs through XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on
    the CPU (emulated, the same numerics). Under :func:`transformer_engine.jax.fp8_autocast` the
    module creates FP8 variables in the ``FP8_COLLECTION`` collection: the amax history (delayed
    scaling), the scales and the count of updates skipped for a NaN or infinite amax (read it
    with :func:`transformer_engine.jax.fp8_skipped_updates`). ``__call__`` returns
    ``(output, norm_output or None)``.

    Parameters
    ----------
    features : int or tuple of int
        Output feature dimensions.
    enable_layernorm : bool, default True
        Normalise the input first; False makes the module a plain dense layer.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero): the output is scaled by
        ``1 + gamma``.
    scale_init : callable, optional
        Initialiser of the norm's scale (default ones, zeros with ``zero_centered_gamma``).
    scale_axes : tuple of str, default ('embed',)
        Logical axis names of the scale.
    ln_bias_init : callable, default zeros
        Initialiser of the norm's bias (``'layernorm'`` only).
    ln_bias_axes : tuple of str, default ('embed',)
        Logical axis names of the norm's bias.
    kernel_init : callable, optional
        Initialiser of the kernel, called as ``init(key, shape, dtype)`` (default: variance
        scaling 1.0, fan-in, truncated normal).
    kernel_axes : tuple of str, default ()
        Logical axis names of the kernel, for sharding rules (recorded with the parameter).
    use_bias : bool, default False
        Whether the layer has a bias.
    bias_init : callable, default zeros
        Initialiser of the bias.
    bias_axes : tuple of str, default ()
        Logical axis names of the bias, for sharding rules (recorded with the parameter).
    return_layernorm_output : bool, default False
        Return the norm's output as the second element of the result (else None there).
    axis : int or tuple of int, default -1
        The contracted input dimension; only -1 is supported.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    layernorm_input_axes : tuple of str, optional
        Logical axis names of the norm's input, for sharding rules.
    dot_input_axes : tuple of str, optional
        Logical axis names of the GEMM's input, for sharding rules.
    enable_low_rank_adaptation : bool, default False
        Add a trainable low-rank update ``x @ A @ B * alpha / rank`` (LoRA) to the output.
    low_rank_adaptation_dim : int, default 32
        The rank of ``A`` and ``B``.
    low_rank_adaptation_alpha : float, optional
        Scale numerator of the update; ``None`` scales by 1.
    """
    features: Union[Iterable[int], int]
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Optional[Initializer] = None
    scale_axes: Tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: Tuple[str, ...] = ("embed",)
    kernel_init: Optional[Initializer] = None
    kernel_axes: Tuple[str, ...] = ()
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: Tuple[str, ...] = ()
    return_layernorm_output: bool = False
    axis: Union[Iterable[int], int] = -1
    dtype: Any = jnp.float32
    transpose_batch_sequence: bool = False
    layernorm_input_axes: Tuple[str, ...] = None
    dot_input_axes: Tuple[str, ...] = None
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: Optional[float] = None

    @nn.compact
    def __call__(self, inputs):
        """Apply the norm and the dense layer.

        Parameters
        ----------
        inputs : jax.Array
            Input ``[..., hidden]``.

        Returns
        -------
        tuple
            ``(output [..., *features], norm output or None)``.
        """
        x = _data_parallel(jnp.asarray(inputs, self.dtype))
        if _canon(self.axis, x.ndim) != (x.ndim - 1,):
            raise ValueError("LayerNormDenseGeneral: only axis=-1 is supported")
        h = x
        if self.enable_layernorm:
            gamma, beta = _norm_params(self, x.shape[-1])
            h = layernorm(x, gamma, beta, self.layernorm_type, self.zero_centered_gamma,
                          self.epsilon)
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        m = math.prod(features)
        kernel = self.param("kernel", self.kernel_init or _default_kernel_init(),
                            (x.shape[-1],) + features, self.dtype).reshape(x.shape[-1], m)
        kernel = with_sharding_constraint(kernel, None, fp8_mod.get_mesh_resource().tp_resource)
        bias = self.param("bias", self.bias_init, features, self.dtype).reshape(m) \
            if self.use_bias else None
        y = dense(h, kernel, bias, self.fp8_meta("kernel"))
        if self.enable_low_rank_adaptation:
            r = self.low_rank_adaptation_dim
            a = self.param("lora_a_kernel", _default_kernel_init(), (x.shape[-1], r), self.dtype)
            b = self.param("lora_b_kernel", nn.initializers.zeros, (r, m), self.dtype)
            scale = (self.low_rank_adaptation_alpha / r) if self.low_rank_adaptation_alpha else 1.0
            y = y + (h @ a @ b) * scale
        y = y.reshape(x.shape[:-1] + features)
        return y, (h if self.return_layernorm_output else None)


class LayerNormMLP(_FP8Metas):
    """A norm and a two-layer MLP, ``wo(dropout(act(wi(norm(x)))))``; FP8 under ``fp8_autocast``.

    FP8 runs through XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on
    the CPU (emulated, the same numerics). Under :func:`transformer_engine.jax.fp8_autocast` the
    module creates FP8 variables in the ``FP8_COLLECTION`` collection: the amax history (delayed
    scaling), the scales and the count of updates skipped for a NaN or infinite amax (read it
    with :func:`transformer_engine.jax.fp8_skipped_updates`). ``__call__`` returns
    ``(output, norm_output or None)``.

    Parameters
    ----------
    intermediate_dim : int, default 2048
        Size of the intermediate dimension.
    enable_layernorm : bool, default True
        Normalise the input first; False makes the module a plain dense layer.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero): the output is scaled by
        ``1 + gamma``.
    scale_init : callable, optional
        Initialiser of the norm's scale (default ones, zeros with ``zero_centered_gamma``).
    scale_axes : tuple of str, default ('embed',)
        Logical axis names of the scale.
    ln_bias_init : callable, default zeros
        Initialiser of the norm's bias (``'layernorm'`` only).
    ln_bias_axes : tuple of str, default ('embed',)
        Logical axis names of the norm's bias.
    kernel_init : callable, optional
        Initialiser of both kernels (default: variance scaling 1.0, fan-in, truncated normal).
    kernel_axes_1 : tuple of str, default ('embed', 'act', 'mlp')
        Logical axis names of the first kernel ``[hidden, n_act, intermediate_dim]``.
    kernel_axes_2 : tuple of str, default ('mlp', 'embed')
        Logical axis names of the second kernel.
    use_bias : bool, default False
        Whether the layer has a bias.
    bias_init : callable, default zeros
        Initialiser of the bias.
    bias_axes_1 : tuple of str, default ('act', 'mlp')
        Logical axis names of the first bias.
    bias_axes_2 : tuple of str, default ('embed',)
        Logical axis names of the second bias.
    return_layernorm_output : bool, default False
        Return the norm's output as the second element of the result (else None there).
    activations : sequence of str, default ('relu',)
        The activation: one name (``'gelu'``, ``'relu'``, ``'silu'``, ``'quick_gelu'``,
        ``'squared_relu'``), or that name followed by ``'linear'`` for its gated form (e.g.
        ``('silu', 'linear')`` for SwiGLU). All are supported on every backend.
    intermediate_dropout_rng_name : str, default 'dropout'
        PRNG stream of the intermediate dropout.
    intermediate_dropout_rate : float, default 0.1
        Dropout probability after the activation.
    intermediate_hidden_dropout_dims : sequence of int, default ()
        Dimensions along which the dropout mask is broadcast.
    axis : int or tuple of int, default -1
        The contracted input dimension.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    """
    intermediate_dim: int = 2048
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Optional[Initializer] = None
    scale_axes: Tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: Tuple[str, ...] = ("embed",)
    kernel_init: Optional[Initializer] = None
    kernel_axes_1: Tuple[str, ...] = ("embed", "act", "mlp")
    kernel_axes_2: Tuple[str, ...] = ("mlp", "embed")
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes_1: Tuple[str, ...] = ("act", "mlp")
    bias_axes_2: Tuple[str, ...] = ("embed",)
    return_layernorm_output: bool = False
    activations: Sequence[Union[str, Callable]] = ("relu",)
    intermediate_dropout_rng_name: str = "dropout"
    intermediate_dropout_rate: float = 0.1
    intermediate_hidden_dropout_dims: Sequence[int] = ()
    axis: Union[Iterable[int], int] = -1
    dtype: Any = jnp.float32
    transpose_batch_sequence: bool = False

    @nn.compact
    def __call__(self, inputs, deterministic: bool = False):
        """Apply the norm and the MLP.

        Parameters
        ----------
        inputs : jax.Array
            Input ``[..., hidden]``.
        deterministic : bool, default False
            Disable dropout (evaluation).

        Returns
        -------
        tuple
            ``(output [..., hidden], norm output or None)``.
        """
        x = _data_parallel(jnp.asarray(inputs, self.dtype))
        hidden = x.shape[-1]
        acts = tuple(self.activations)
        activation_name(acts)  # validates the tuple
        n_act, inter = len(acts), self.intermediate_dim
        h = x
        if self.enable_layernorm:
            gamma, beta = _norm_params(self, hidden)
            h = layernorm(x, gamma, beta, self.layernorm_type, self.zero_centered_gamma,
                          self.epsilon)
        init = self.kernel_init or _default_kernel_init()
        tp = fp8_mod.get_mesh_resource().tp_resource
        k1 = self.param("wi_kernel", init, (hidden, n_act, inter), self.dtype)
        k2 = self.param("wo_kernel", init, (inter, hidden), self.dtype)
        k1 = with_sharding_constraint(k1.reshape(hidden, n_act * inter), None, tp)
        k2 = with_sharding_constraint(k2, tp, None)
        b1 = self.param("wi_bias", self.bias_init, (n_act, inter), self.dtype).reshape(-1) \
            if self.use_bias else None
        b2 = self.param("wo_bias", self.bias_init, (hidden,), self.dtype) if self.use_bias else None
        dropout_active = self.intermediate_dropout_rate > 0.0 and not deterministic
        if activation_name(acts) == "gelu" and not dropout_active:
            fused = fused_gelu_mlp(h, k1, b1, k2, b2)
            if fused is not None:
                return fused, (h if self.return_layernorm_output else None)
        y1 = dense(h, k1, b1, self.fp8_meta("wi"))
        a = _activation(y1, acts)
        a = nn.Dropout(rate=self.intermediate_dropout_rate,
                       broadcast_dims=tuple(self.intermediate_hidden_dropout_dims),
                       rng_collection=self.intermediate_dropout_rng_name)(
                           a, deterministic=deterministic)
        y = dense(a, k2, b2, self.fp8_meta("wo"))
        return y, (h if self.return_layernorm_output else None)
