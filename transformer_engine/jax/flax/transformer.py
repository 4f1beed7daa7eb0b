"""DotProductAttention, MultiHeadAttention, RelativePositionBiases and TransformerLayer with the
argument names of NVIDIA TE's JAX API. Attention runs through transformer_engine.jax.fused_attn,
whose dispatcher picks the native fused kernels (cuDNN, portable) through XLA FFI custom calls,
XLA's fused attention, or the jnp path, as PyTorch's DotProductAttention does. Layout: [batch, seq, hidden], or [seq, batch, hidden] with transpose_batch_sequence.
Masks: True = masked out, [batch, 1, sq, sk]."""
from __future__ import annotations

import enum
import math
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp

from ..attention import fused_attn
from ..kernels.rope import rope_forward
from .module import DenseGeneral, LayerNorm, LayerNormDenseGeneral, LayerNormMLP


class TransformerLayerType(enum.Enum):
    """Kind of :class:`TransformerLayer`.

    ``ENCODER``: self-attention and MLP. ``DECODER``: adds cross-attention to the encoder's
    output.
    """
    ENCODER = "encoder"
    DECODER = "decoder"


def _default_init():
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


class DotProductAttention(nn.Module):
    """Attention over already projected queries, keys and values (Flax module).

    Runs :func:`transformer_engine.jax.fused_attn`: GEMMs around the native fused softmax on NVIDIA
    and AMD GPUs, jnp code on the CPU.

    Parameters
    ----------
    head_dim : int
        Size of each head.
    num_attention_heads : int
        Number of query heads.
    num_gqa_groups : int, optional
        Number of key/value heads (grouped-query attention); ``None`` means one per query head.
    attention_dropout : float, default 0.0
        Dropout probability on the attention probabilities.
    attn_mask_type : str, default 'causal'
        ``'no_mask'``, ``'padding'``, ``'causal'``, ``'padding_causal'`` or
        ``'causal_bottom_right'`` (see :func:`transformer_engine.jax.fused_attn`).
    attn_bias_type : str, optional
        Accepted for compatibility; a bias passed to ``__call__`` is added to the scores.
    dropout_rng_name : str, default 'dropout'
        Name of the PRNG stream for dropout (pass it in ``rngs`` of ``apply``).
    float32_logits : bool, default False
        Compute the scores and softmax in float32.
    qkv_layout : {'bshd_bshd_bshd', 'sbhd_sbhd_sbhd'}, default 'bshd_bshd_bshd'
        Separate query, key and value tensors (packed layouts are not supported).
    scale_factor : float, optional
        Score scale (default ``1 / sqrt(head_dim)``).
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    window_size : tuple of (int, int), optional
        Sliding-window attention ``(left, right)``; -1 is unbounded.
    """
    head_dim: int
    num_attention_heads: int
    num_gqa_groups: Optional[int] = None
    attention_dropout: float = 0.0
    attn_mask_type: str = "causal"
    attn_bias_type: Optional[str] = None
    dropout_rng_name: str = "dropout"
    float32_logits: bool = False
    qkv_layout: str = "bshd_bshd_bshd"
    scale_factor: Optional[float] = None
    transpose_batch_sequence: bool = False
    window_size: Optional[Tuple[int, int]] = None

    @nn.compact
    def __call__(self, query, key, value, mask=None, bias=None, *, deterministic: bool = False):
        """Attend.

        Parameters
        ----------
        query : jax.Array
            ``[batch, seq_q, heads, head_dim]`` (seq first with ``transpose_batch_sequence``).
        key : jax.Array
            ``[batch, seq_k, kv_heads, head_dim]``.
        value : jax.Array
            Same shape as ``key``.
        mask : jax.Array, optional
            Boolean ``[batch, 1, seq_q, seq_k]``, True where masked out.
        bias : jax.Array, optional
            Added to the scores.
        deterministic : bool, default False
            Disable dropout (evaluation).
        """
        if self.qkv_layout not in ("bshd_bshd_bshd", "sbhd_sbhd_sbhd"):
            raise NotImplementedError(f"DotProductAttention: qkv_layout {self.qkv_layout!r}; "
                                      f"separate q, k, v tensors are supported")
        # seq-first tensors go in as they are: the fused kernels read sbhd natively
        qkv_format = "sbhd" if self.transpose_batch_sequence else "bshd"
        rng = None
        if self.attention_dropout > 0.0 and not deterministic:
            rng = self.make_rng(self.dropout_rng_name)
        dtype = query.dtype
        if self.float32_logits:
            query, key = query.astype(jnp.float32), key.astype(jnp.float32)
        out = fused_attn(query, key, value.astype(query.dtype), mask, bias, self.scale_factor,
                         self.attn_mask_type if mask is not None or "causal" in
                         self.attn_mask_type else "no_mask",
                         0.0 if deterministic else self.attention_dropout, rng,
                         self.window_size, qkv_format=qkv_format).astype(dtype)
        return out


class RelativePositionBiases(nn.Module):
    """T5-style bucketed relative position bias, ``[1, heads, q_len, k_len]``.

    Parameters
    ----------
    num_buckets : int
        Number of relative-distance buckets.
    max_distance : int
        Distances beyond this share the last bucket.
    num_attention_heads : int
        Number of heads (one bias per head and bucket).
    embedding_init : callable, default variance scaling (fan-avg, uniform)
        Initialiser of the ``[heads, num_buckets]`` table.
    embedding_axes : tuple of str, default ('heads', 'relpos_buckets')
        Logical axis names of the table.
    dtype : jax.numpy.dtype, default float32
        dtype of the result.
    """
    num_buckets: int
    max_distance: int
    num_attention_heads: int
    embedding_init: Callable[..., Any] = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
    embedding_axes: Tuple[str, ...] = ("heads", "relpos_buckets")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_seqlen, k_seqlen, bidirectional=True):
        """The bias for ``q_seqlen`` queries and ``k_seqlen`` keys.

        Parameters
        ----------
        q_seqlen : int
            Number of query positions.
        k_seqlen : int
            Number of key positions.
        bidirectional : bool, default True
            Separate buckets for keys before and after the query (encoders); False for causal
            decoders.
        """
        rel = jnp.arange(k_seqlen)[None, :] - jnp.arange(q_seqlen)[:, None]
        n = self.num_buckets
        bucket = jnp.zeros_like(rel)
        neg = -rel
        if bidirectional:
            n //= 2
            bucket = bucket + (neg < 0).astype(jnp.int32) * n
            neg = jnp.abs(neg)
        else:
            neg = jnp.maximum(neg, 0)
        exact = n // 2
        large = exact + (jnp.log(jnp.maximum(neg, 1).astype(jnp.float32) / exact) /
                         math.log(self.max_distance / exact) * (n - exact)).astype(jnp.int32)
        bucket = bucket + jnp.where(neg < exact, neg, jnp.minimum(large, n - 1))
        table = self.param("rel_embedding", self.embedding_init,
                           (self.num_attention_heads, self.num_buckets), jnp.float32)
        values = table[:, bucket]  # [h, q, k]
        return values[None].astype(self.dtype)


def _rope(x, windows, transpose):
    """Rotate-half RoPE of x [b, s, h, d] with timescales between windows[0] and windows[1]."""
    d = x.shape[-1]
    s = x.shape[0] if transpose else x.shape[1]
    frac = 2 * jnp.arange(d // 2, dtype=jnp.float32) / d
    inv = 1.0 / (windows[0] * (windows[1] / windows[0]) ** frac)
    ang = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None, :]
    freqs = jnp.concatenate([ang, ang], axis=-1)
    return rope_forward(x, freqs, "sbhd" if transpose else "bshd")


class MultiHeadAttention(nn.Module):
    """Multi-head attention: optional norm, QKV projection, attention, output projection.

    The projections are :class:`LayerNormDenseGeneral`/:class:`DenseGeneral` (FP8 under
    ``fp8_autocast``); ``__call__`` returns ``(output, norm_output or None)``.

    Parameters
    ----------
    head_dim : int
        Size of each head.
    num_attention_heads : int
        Number of query heads.
    num_gqa_groups : int, optional
        Number of key/value heads (grouped-query attention); ``None`` means one per query head.
    attention_dropout : float, default 0.0
        Dropout probability on the attention probabilities.
    dropout_rng_name : str, default 'dropout'
        Name of the PRNG stream for dropout (pass it in ``rngs`` of ``apply``).
    input_layernorm : bool, default True
        Normalise the query input before the projection.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    layernorm_epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero): the output is scaled by
        ``1 + gamma``.
    return_layernorm_output : bool, default False
        Return the norm's output as the second element of the result (else None there).
    use_bias : bool, default False
        Whether the layer has a bias.
    bias_init : callable, default zeros
        Initialiser of the bias.
    kernel_init : callable, optional
        Initialiser of the projection kernels.
    attn_mask_type : str, default 'causal'
        ``'no_mask'``, ``'padding'``, ``'causal'``, ``'padding_causal'`` or
        ``'causal_bottom_right'`` (see :func:`transformer_engine.jax.fused_attn`).
    attn_bias_type : str, optional
        Accepted for compatibility; a bias passed to ``__call__`` is added to the scores.
    enable_rotary_pos_emb : bool, default False
        Apply rotary position embeddings (rotate-half) to queries and keys.
    rotary_pos_emb_windows : tuple of (int, int), default (1, 10000)
        Smallest and largest timescale of the rotary frequencies.
    fuse_qkv_params : bool, default True
        One fused QKV projection for self-attention instead of separate query and key/value ones.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    scale_attn_logits : bool, default False
        Scale the attention scores by ``1 / sqrt(head_dim)`` explicitly.
    scaled_query_init : bool, default True
        Whether scores are scaled by ``1 / sqrt(head_dim)`` (NVIDIA TE's convention: the scaling
        is folded into the query); with both this and ``scale_attn_logits`` False no scaling is
        applied.
    float32_logits : bool, default False
        Compute the scores and softmax in float32.
    window_size : tuple of (int, int), optional
        Sliding-window attention ``(left, right)``; -1 is unbounded.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    """
    head_dim: int
    num_attention_heads: int
    num_gqa_groups: Optional[int] = None
    attention_dropout: float = 0.0
    dropout_rng_name: str = "dropout"
    input_layernorm: bool = True
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    return_layernorm_output: bool = False
    use_bias: bool = False
    bias_init: Callable[..., Any] = nn.initializers.zeros
    kernel_init: Optional[Callable[..., Any]] = None
    attn_mask_type: str = "causal"
    attn_bias_type: Optional[str] = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: Tuple[int, int] = (1, 10000)
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    float32_logits: bool = False
    window_size: Optional[Tuple[int, int]] = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, mask=None, bias=None, *, decode: bool = False,
                 deterministic: bool = False):
        """Apply the attention block.

        Parameters
        ----------
        inputs_q : jax.Array
            Query input ``[batch, seq_q, hidden]``.
        inputs_kv : jax.Array
            Key/value input ``[batch, seq_k, hidden]``; pass ``inputs_q`` itself for self-attention.
        mask : jax.Array, optional
            Boolean ``[batch, 1, seq_q, seq_k]``, True where masked out.
        bias : jax.Array, optional
            Added to the attention scores.
        decode : bool, default False
            Incremental decoding with a KV cache is not implemented (NotImplementedError).
        deterministic : bool, default False
            Disable dropout (evaluation).
        """
        if decode:
            raise NotImplementedError("MultiHeadAttention: decode (KV cache) is not implemented "
                                      "in the JAX frontend yet")
        h, d = self.num_attention_heads, self.head_dim
        g = self.num_gqa_groups or h
        init = self.kernel_init or _default_init()
        common = dict(layernorm_type=self.layernorm_type, epsilon=self.layernorm_epsilon,
                      zero_centered_gamma=self.zero_centered_gamma, use_bias=self.use_bias,
                      bias_init=self.bias_init, kernel_init=init, dtype=self.dtype,
                      enable_layernorm=self.input_layernorm, return_layernorm_output=True)
        self_attn = inputs_kv is inputs_q
        if self_attn and self.fuse_qkv_params:
            qkv, ln_out = LayerNormDenseGeneral(features=(h + 2 * g) * d, name="qkv", **common)(inputs_q)
            q, k, v = jnp.split(qkv, [h * d, (h + g) * d], axis=-1)
        else:
            q, ln_out = LayerNormDenseGeneral(features=h * d, name="query", **common)(inputs_q)
            kv_in = ln_out if self_attn else inputs_kv
            kv = DenseGeneral(features=2 * g * d, use_bias=self.use_bias, kernel_init=init,
                              bias_init=self.bias_init, dtype=self.dtype, name="kv")(kv_in)
            k, v = jnp.split(kv, 2, axis=-1)
        q = q.reshape(q.shape[:-1] + (h, d))
        k = k.reshape(k.shape[:-1] + (g, d))
        v = v.reshape(v.shape[:-1] + (g, d))
        if self.enable_rotary_pos_emb:
            q = _rope(q, self.rotary_pos_emb_windows, self.transpose_batch_sequence)
            k = _rope(k, self.rotary_pos_emb_windows, self.transpose_batch_sequence)
        scale = 1.0 if not self.scale_attn_logits and self.scaled_query_init is False else None
        x = DotProductAttention(head_dim=d, num_attention_heads=h, num_gqa_groups=g,
                                attention_dropout=self.attention_dropout,
                                attn_mask_type=self.attn_mask_type,
                                dropout_rng_name=self.dropout_rng_name,
                                float32_logits=self.float32_logits, scale_factor=scale,
                                transpose_batch_sequence=self.transpose_batch_sequence,
                                window_size=self.window_size)(q, k, v, mask, bias,
                                                              deterministic=deterministic)
        x = x.reshape(x.shape[:-2] + (h * d,))
        out = DenseGeneral(features=inputs_q.shape[-1], use_bias=self.use_bias, kernel_init=init,
                           bias_init=self.bias_init, dtype=self.dtype, name="out")(x)
        return out, (ln_out if self.return_layernorm_output else None)


class TransformerLayer(nn.Module):
    """One Transformer encoder or decoder block (Flax module), FP8 under ``fp8_autocast``.

    Pre-norm by default: ``h = x + drop(attn(norm(x)))``, a decoder then adds
    ``h + drop(cross_attn(norm(h), encoded))``, and ``out = h + drop(mlp(norm(h)))``.

    Parameters
    ----------
    hidden_size : int, default 512
        Size of the last dimension of the input and of the output.
    mlp_hidden_size : int, default 2048
        Intermediate size of the MLP.
    num_attention_heads : int, default 8
        Number of query heads; must divide ``hidden_size``.
    num_gqa_groups : int, optional
        Number of key/value heads (grouped-query attention); ``None`` means one per query head.
    layernorm_type : {'layernorm', 'rmsnorm'}, default 'layernorm'
        The normalisation.
    layernorm_epsilon : float, default 1e-6
        Added to the variance (or mean square) before the square root.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero): the output is scaled by
        ``1 + gamma``.
    hidden_dropout : float, default 0.1
        Dropout probability on the outputs of attention and MLP.
    hidden_dropout_dims : sequence of int, default ()
        Dimensions along which the hidden dropout mask is broadcast.
    attention_dropout : float, default 0.1
        Dropout probability on the attention probabilities.
    intermediate_dropout : float, default 0.1
        Dropout probability inside the MLP, after the activation.
    intermediate_dropout_dims : sequence of int, default ()
        Dimensions along which the intermediate dropout mask is broadcast.
    dropout_rng_name : str, default 'dropout'
        Name of the PRNG stream for dropout (pass it in ``rngs`` of ``apply``).
    mha_kernel_init : callable, optional
        Initialiser of the attention kernels.
    mlp_kernel_init : callable, optional
        Initialiser of the MLP kernels.
    mlp_activations : sequence of str, default ('relu',)
        The MLP activation (see :class:`LayerNormMLP`).
    use_bias : bool, default False
        Whether the layer has a bias.
    bias_init : callable, default zeros
        Initialiser of the bias.
    apply_residual_connection_post_layernorm : bool, default False
        Each residual connection starts at the norm's output instead of its input.
    output_layernorm : bool, default False
        Post-norm: no norm before the attention, a final norm after the block.
    float32_attention_logits : bool, default False
        Compute the attention scores and softmax in float32.
    layer_type : TransformerLayerType, default ENCODER
        ``DECODER`` adds cross-attention to ``encoded``.
    self_attn_mask_type : str, default 'causal'
        Mask type of the self-attention (see :class:`DotProductAttention`).
    self_attn_bias_type : str, optional
        Accepted for compatibility; a bias passed to ``__call__`` is added to the scores.
    enable_relative_embedding : bool, default True
        Add a T5-style relative position bias to the self-attention scores.
    relative_embedding : flax.linen.Module, optional
        The module producing that bias (default: a :class:`RelativePositionBiases` with 32
        buckets and maximum distance 128).
    enable_rotary_pos_emb : bool, default False
        Apply rotary position embeddings (rotate-half) to queries and keys.
    rotary_pos_emb_windows : tuple of (int, int), default (1, 10000)
        Smallest and largest timescale of the rotary frequencies.
    transpose_batch_sequence : bool, default False
        Inputs are ``[seq, batch, ...]`` instead of ``[batch, seq, ...]``.
    scale_attn_logits : bool, default False
        Scale the attention scores by ``1 / sqrt(head_dim)`` explicitly.
    scaled_query_init : bool, default True
        Whether scores are scaled by ``1 / sqrt(head_dim)`` (NVIDIA TE's convention: the scaling
        is folded into the query); with both this and ``scale_attn_logits`` False no scaling is
        applied.
    window_size : tuple of (int, int), optional
        Sliding-window attention ``(left, right)``; -1 is unbounded.
    dtype : jax.numpy.dtype, default float32
        dtype of the parameters and of the computation (e.g. ``jnp.bfloat16``); inputs are cast
        to it.
    """
    hidden_size: int = 512
    mlp_hidden_size: int = 2048
    num_attention_heads: int = 8
    num_gqa_groups: Optional[int] = None
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    hidden_dropout: float = 0.1
    hidden_dropout_dims: Sequence[int] = ()
    attention_dropout: float = 0.1
    intermediate_dropout: float = 0.1
    intermediate_dropout_dims: Sequence[int] = ()
    dropout_rng_name: str = "dropout"
    mha_kernel_init: Optional[Callable[..., Any]] = None
    mlp_kernel_init: Optional[Callable[..., Any]] = None
    mlp_activations: Sequence[str] = ("relu",)
    use_bias: bool = False
    bias_init: Callable[..., Any] = nn.initializers.zeros
    apply_residual_connection_post_layernorm: bool = False
    output_layernorm: bool = False
    float32_attention_logits: bool = False
    layer_type: TransformerLayerType = TransformerLayerType.ENCODER
    self_attn_mask_type: str = "causal"
    self_attn_bias_type: Optional[str] = None
    enable_relative_embedding: bool = True
    relative_embedding: Optional[nn.Module] = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: Tuple[int, int] = (1, 10000)
    transpose_batch_sequence: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    window_size: Optional[Tuple[int, int]] = None
    dtype: Any = jnp.float32

    def _dropout(self, x, deterministic):
        return nn.Dropout(rate=self.hidden_dropout, broadcast_dims=tuple(self.hidden_dropout_dims),
                          rng_collection=self.dropout_rng_name)(x, deterministic=deterministic)

    @nn.compact
    def __call__(self, inputs, encoded=None, attention_mask=None, encoder_decoder_mask=None,
                 deterministic: bool = False, decode: bool = False, max_decode_length=None):
        """Apply the block.

        Parameters
        ----------
        inputs : jax.Array
            ``[batch, seq, hidden_size]`` (seq first with ``transpose_batch_sequence``).
        encoded : jax.Array, optional
            The encoder's output, for a decoder layer's cross-attention.
        attention_mask : jax.Array, optional
            Boolean self-attention mask ``[batch, 1, seq, seq]``, True where masked out.
        encoder_decoder_mask : jax.Array, optional
            Boolean cross-attention mask ``[batch, 1, seq, seq_enc]``.
        deterministic : bool, default False
            Disable dropout (evaluation).
        decode : bool, default False
            Incremental decoding is not implemented (NotImplementedError).
        max_decode_length : int, optional
            Unused (incremental decoding).
        """
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"TransformerLayer: hidden_size {self.hidden_size} is not a multiple "
                             f"of num_attention_heads {self.num_attention_heads}")
        d = self.hidden_size // self.num_attention_heads
        seq_axis = 0 if self.transpose_batch_sequence else 1
        bias = None
        if self.enable_relative_embedding:
            rel = self.relative_embedding or RelativePositionBiases(
                num_buckets=32, max_distance=128, num_attention_heads=self.num_attention_heads,
                dtype=self.dtype, name="relpos_bias")
            s = inputs.shape[seq_axis]
            bias = rel(s, s, self.layer_type == TransformerLayerType.ENCODER)
        mha = dict(head_dim=d, num_attention_heads=self.num_attention_heads,
                   num_gqa_groups=self.num_gqa_groups, attention_dropout=self.attention_dropout,
                   dropout_rng_name=self.dropout_rng_name, layernorm_type=self.layernorm_type,
                   layernorm_epsilon=self.layernorm_epsilon,
                   zero_centered_gamma=self.zero_centered_gamma, use_bias=self.use_bias,
                   bias_init=self.bias_init, kernel_init=self.mha_kernel_init,
                   enable_rotary_pos_emb=self.enable_rotary_pos_emb,
                   rotary_pos_emb_windows=self.rotary_pos_emb_windows,
                   transpose_batch_sequence=self.transpose_batch_sequence,
                   scale_attn_logits=self.scale_attn_logits,
                   scaled_query_init=self.scaled_query_init,
                   float32_logits=self.float32_attention_logits, window_size=self.window_size,
                   dtype=self.dtype, return_layernorm_output=True)
        x, ln_out = MultiHeadAttention(attn_mask_type=self.self_attn_mask_type,
                                       input_layernorm=not self.output_layernorm,
                                       name="attention", **mha)(
            inputs, inputs, attention_mask, bias, deterministic=deterministic)
        residual = ln_out if self.apply_residual_connection_post_layernorm and ln_out is not None \
            else inputs
        x = self._dropout(x, deterministic) + residual
        if self.layer_type == TransformerLayerType.DECODER:
            if encoded is None:
                raise ValueError("TransformerLayer: a decoder layer needs `encoded`")
            y, ln_y = MultiHeadAttention(attn_mask_type="padding", input_layernorm=True,
                                         fuse_qkv_params=False, name="encoder_decoder_attention",
                                         **{**mha, "enable_rotary_pos_emb": False})(
                x, encoded, encoder_decoder_mask, None, deterministic=deterministic)
            res = ln_y if self.apply_residual_connection_post_layernorm else x
            x = self._dropout(y, deterministic) + res
        y, ln_mlp = LayerNormMLP(intermediate_dim=self.mlp_hidden_size,
                                 layernorm_type=self.layernorm_type,
                                 epsilon=self.layernorm_epsilon,
                                 zero_centered_gamma=self.zero_centered_gamma,
                                 kernel_init=self.mlp_kernel_init, use_bias=self.use_bias,
                                 bias_init=self.bias_init, activations=self.mlp_activations,
                                 intermediate_dropout_rng_name=self.dropout_rng_name,
                                 intermediate_dropout_rate=self.intermediate_dropout,
                                 intermediate_hidden_dropout_dims=self.intermediate_dropout_dims,
                                 return_layernorm_output=True, dtype=self.dtype, name="mlp")(
            x, deterministic=deterministic)
        res = ln_mlp if self.apply_residual_connection_post_layernorm else x
        out = self._dropout(y, deterministic) + res
        if self.output_layernorm:
            out = LayerNorm(layernorm_type=self.layernorm_type, epsilon=self.layernorm_epsilon,
                            zero_centered_gamma=self.zero_centered_gamma, dtype=self.dtype,
                            name="output_layernorm")(out)
        return out
