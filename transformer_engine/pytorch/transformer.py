"""TransformerLayer: one encoder or decoder block from MultiheadAttention and te.LayerNormMLP.

Pre-LN (default, GPT/Llama): h = x + drop(attn(LN(x))); [decoder: h = h + drop(xattn(LN(h), enc))];
out = h + drop(mlp(LN(h))).
apply_residual_connection_post_layernorm: the residual of each block is the norm's output instead
of its input. output_layernorm (BERT post-LN, with the previous flag): the attention takes x
un-normalised and a final norm is applied to the block's output:
h = x + drop(attn(x)); out = LN_out(LN(h) + drop(mlp(LN(h)))).
parallel_attention_mlp (Falcon/GPT-J): out = x + drop(attn(LN1(x)) + mlp(LN2(x))).
drop(.) is dropout (hidden_dropout) then drop-path (stochastic depth, per sample, drop_path_rate).
Where drop(.) is the identity (eval, or both rates 0) and the residual is the block input, the
residual adds ride the output GEMMs (attention projection, FC2: their C operand) and FC2's
residual gradient rides the second norm's backward, so the connections cost no add kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .attention.multi_head_attention import MultiheadAttention
from .attention.dot_product_attention import set_context_parallel_group_of
from .module_parts import side_stream, weight_cast_beside
from .module_parts.input_check import call_checked
from .module import LayerNorm, LayerNormMLP, RMSNorm
from .module_parts.nv_options import check_off

_OP = "TransformerLayer"


def _drop_path(x: torch.Tensor, rate: float, training: bool, batch_dim: int) -> torch.Tensor:
    """Stochastic depth: drop the whole branch of a sample with probability `rate`."""
    if rate <= 0.0 or not training:
        return x
    if rate >= 1.0:
        return x * 0.0  # every sample's branch dropped (no rescale: 1 - rate is 0)
    shape = [1] * x.dim()
    shape[batch_dim] = x.shape[batch_dim]
    keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - rate)
    return x * keep / (1.0 - rate)


class TransformerLayer(torch.nn.Module):
    """One Transformer encoder or decoder block: attention and MLP with residual connections.

    Pre-norm by default (GPT, Llama): ``h = x + drop(attn(norm(x)))``, for a decoder then
    ``h = h + drop(cross_attn(norm(h), encoder_output))``, and ``out = h + drop(mlp(norm(h)))``.
    ``apply_residual_connection_post_layernorm`` and ``output_layernorm`` give the post-norm
    (BERT) variants, ``parallel_attention_mlp`` the parallel one (GPT-J, Falcon):
    ``out = x + drop(attn(norm1(x)) + mlp(norm2(x)))``. ``drop`` is dropout
    (``hidden_dropout``) followed by stochastic depth (``drop_path_rate``). All GEMMs run in FP8
    under :func:`autocast`.

    Parameters
    ----------
    hidden_size : int
        Size of the last dimension of the input and of the output.
    ffn_hidden_size : int
        Intermediate size of the MLP.
    num_attention_heads : int
        Number of query heads, over all tensor-parallel ranks.
    num_gqa_groups : int, optional
        Number of key/value heads for grouped-query attention (1 is multi-query attention). Must
        divide ``num_attention_heads``. ``None`` (default) means one per query head.
    layernorm_epsilon : float, default 1e-5
        Epsilon of every norm in the block.
    hidden_dropout : float, default 0.1
        Dropout probability on the output of the attention and of the MLP, in [0, 1).
    attention_dropout : float, default 0.1
        Dropout probability applied to the attention probabilities during training, in [0, 1).
    init_method : callable, optional
        Called as ``init_method(weight)`` to initialise each weight in place. Default: normal with
        mean 0 and standard deviation 0.023.
    output_layer_init_method : callable, optional
        Initialises the output projections (attention output, FC2) (default: as ``init_method``).
    layer_number : int, optional
        Index of the layer in the model (from 1); it keys this layer's entries in the KV cache of
        ``inference_params`` and is required when one is used.
    kv_channels : int, optional
        Head dimension (default ``hidden_size // num_attention_heads``).
    self_attn_mask_type : str, default 'causal'
        Mask type of the self-attention (see :class:`DotProductAttention`).
    window_size : tuple of (int, int), optional
        Sliding-window attention: each query sees keys from ``left`` positions before it to
        ``right`` after it; -1 means unbounded on that side. ``None`` (default) is no window
        (``(-1, 0)`` under a causal mask).
    enc_dec_attn_mask_type : str, default 'no_mask'
        Mask type of the cross-attention of a decoder layer.
    enc_dec_window_size : tuple of (int, int), optional
        Sliding window of the cross-attention.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel process group. ``None`` (default) means no tensor parallelism.
    tp_size : int, default 1
        Number of ranks in ``tp_group``; taken from the group when one is given. Any
        ``torch.distributed`` backend (NCCL on NVIDIA, RCCL on AMD, gloo on the CPU).
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``): float32, bfloat16 or
        float16. The compute dtype follows the input (or ``torch.autocast``).
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker`; weight initialisation and dropout fork it so
        that tensor-parallel ranks draw different numbers.
    fuse_wgrad_accumulation : bool, default False
        Accumulate weight gradients into ``weight.main_grad`` (a float32 tensor the caller
        allocates, as Megatron-style optimizers do) instead of writing ``weight.grad``.
    seq_length : int, optional
        Sequence length, recorded for compatibility (shapes are taken from the input).
    micro_batch_size : int, optional
        Micro-batch size, recorded for compatibility.
    sequence_parallel : bool, default False
        With tensor parallelism (``tp_size > 1``), the input and output of the module are split
        along the sequence dimension across the tensor-parallel group, and the module gathers or
        reduce-scatters them around its GEMMs. Has no effect when ``tp_size`` is 1.
    apply_residual_connection_post_layernorm : bool, default False
        Each residual connection starts at the norm's output instead of its input.
    output_layernorm : bool, default False
        Post-norm: no norm before the attention, a final norm after the block.
    parallel_attention_mlp : bool, default False
        Compute attention and MLP from the same input in parallel and add both (encoder layers
        without ``output_layernorm`` only).
    layer_type : {'encoder', 'decoder'}, default 'encoder'
        A decoder layer adds cross-attention to ``encoder_output``.
    drop_path_rate : float, default 0.0
        Stochastic depth: probability of dropping a sample's attention or MLP branch in
        training, in [0, 1).
    set_parallel_mode : bool, default False
        With tensor parallelism, split the QKV projection by columns and the output projection by
        rows over the group and FC1 by columns, FC2 by rows (the Megatron-style split).
    fuse_qkv_params : bool, default False
        Keep the query, key and value projections in one weight parameter (``qkv``) instead of
        separate named parameters.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero), which keeps it precise in low
        precision formats; the output is ``... * (1 + gamma)``.
    qkv_weight_interleaved : bool, default True
        With ``fuse_qkv_params``, lay the fused weight out per head (q, k, v of head 0, then of
        head 1, ...) rather than all queries, then all keys, then all values.
    bias : bool, default True
        Whether the projections have biases.
    normalization : {'LayerNorm', 'RMSNorm'}, default 'LayerNorm'
        The normalisation applied to the input.
    device : torch.device or str, optional
        Where the parameters are created: default the current CUDA/ROCm device when one exists,
        else the CPU. ``'meta'`` defers allocation: call ``to_empty()`` and then
        ``reset_parameters()`` to materialise the module.
    rotary_pos_interleaved : bool, default False
        Rotary embeddings rotate adjacent pairs of channels (interleaved, GPT-J style) instead of
        the two halves of the head dimension.
    activation : str, default 'gelu'
        The MLP activation (see :class:`LayerNormMLP` for the supported names).
    attn_input_format : {'sbhd', 'bshd', 'thd'}, default 'sbhd'
        Layout of ``hidden_states``: ``[seq, batch, hidden]``, ``[batch, seq, hidden]`` or packed
        ``[tokens, hidden]`` with ``cu_seqlens_q``/``cu_seqlens_kv``.
    name : str, optional
        A name for the module, used in debug logging only.
    softmax_scale : float, optional
        Factor applied to ``q @ k^T`` before the softmax (default ``1 / sqrt(head_dim_qk)``).
    ub_tp_comm_overlap, ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad : bool, default False
        Overlap of tensor-parallel communication with the GEMMs through NVIDIA's userbuffers.
        Not implemented: only False is accepted; True raises NotImplementedError. The
        tensor-parallel communication runs as separate ``torch.distributed`` collectives.
    activation_params : dict, optional
        Parameters of the MLP activation. Only ``activation='clamped_swiglu'`` takes them:
        ``{'limit': float, 'alpha': float}`` (defaults 7.0 and 1.702; a finite limit > 0): the
        gate is clamped to at most ``limit`` and the linear half to ``[-limit, limit]``, and the
        output is ``gate * sigmoid(alpha * gate) * (linear + 1)``. Any other activation with
        parameters raises ValueError.
    bottom_right_diagonal : bool, optional
        Align the causal diagonal to the last key explicitly. Not implemented as an option: only
        None is accepted; the mask type decides the alignment (the ``*_bottom_right`` types).
    enc_dec_bottom_right_diagonal : bool, optional
        As ``bottom_right_diagonal``, for the cross-attention: only None is accepted.
    qk_norm_type : str, optional
        Normalisation of the queries and keys before the attention. Not implemented: only None
        is accepted (a value raises NotImplementedError).
    qk_norm_eps : float, default 1e-6
        Epsilon of that normalisation; without effect (it is not implemented).
    qk_norm_before_rope : bool, default False
        Apply that normalisation before the rotary embedding; without effect.
    softmax_type : str, default 'vanilla'
        Only ``'vanilla'`` (the plain softmax) is implemented; other values (NVIDIA TE's
        ``'off-by-one'`` and ``'learnable'``) raise NotImplementedError.
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5,
                 hidden_dropout: float = 0.1, attention_dropout: float = 0.1,
                 init_method=None, output_layer_init_method=None, layer_number: Optional[int] = None,
                 kv_channels: Optional[int] = None, self_attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, enc_dec_attn_mask_type: str = "no_mask",
                 enc_dec_window_size: Optional[Tuple[int, int]] = None, tp_group=None, tp_size: int = 1,
                 params_dtype: Optional[torch.dtype] = None, get_rng_state_tracker=None,
                 fuse_wgrad_accumulation: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, sequence_parallel: bool = False,
                 apply_residual_connection_post_layernorm: bool = False, output_layernorm: bool = False,
                 parallel_attention_mlp: bool = False, layer_type: str = "encoder",
                 drop_path_rate: float = 0.0, set_parallel_mode: bool = False,
                 fuse_qkv_params: bool = False, rotary_pos_interleaved: bool = False,
                 zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 bias: bool = True, activation: str = "gelu", normalization: str = "LayerNorm",
                 device=None, attn_input_format: str = "sbhd", name: Optional[str] = None,
                 softmax_scale: Optional[float] = None, activation_params: Optional[dict] = None,
                 bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_bottom_right_diagonal: Optional[bool] = None,
                 ub_tp_comm_overlap: bool = False, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 qk_norm_type: Optional[str] = None, qk_norm_eps: float = 1e-6,
                 qk_norm_before_rope: bool = False, softmax_type: str = "vanilla"):
        super().__init__()
        check_off(_OP, ub_tp_comm_overlap=ub_tp_comm_overlap, ub_overlap_ag=ub_overlap_ag,
                  ub_overlap_rs=ub_overlap_rs, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                  ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad,
                  bottom_right_diagonal=bottom_right_diagonal,
                  enc_dec_bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                  qk_norm_type=qk_norm_type, softmax_type=softmax_type)
        if layer_type not in ("encoder", "decoder"):
            raise ValueError(f"{_OP}: layer_type is {layer_type!r}; expected 'encoder' or 'decoder'")
        if parallel_attention_mlp and (layer_type == "decoder" or output_layernorm):
            raise ValueError(f"{_OP}: parallel_attention_mlp works with layer_type 'encoder' and "
                             "output_layernorm=False only")
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"{_OP}: normalization is {normalization!r}; expected LayerNorm or RMSNorm")
        if not 0.0 <= hidden_dropout < 1.0:
            raise ValueError(f"{_OP}: hidden_dropout is {hidden_dropout}; expected [0, 1)")
        if not 0.0 <= drop_path_rate <= 1.0:
            raise ValueError(f"{_OP}: drop_path_rate is {drop_path_rate}; expected [0, 1]")
        if attn_input_format not in ("sbhd", "bshd", "thd"):
            raise ValueError(f"{_OP}: attn_input_format is {attn_input_format!r}; expected sbhd, bshd or thd")
        self.layer_type, self.output_layernorm = layer_type, output_layernorm
        self.post_ln_residual = apply_residual_connection_post_layernorm
        self.parallel_attention_mlp = parallel_attention_mlp
        self.hidden_dropout, self.drop_path_rate = hidden_dropout, drop_path_rate
        self.attn_input_format = attn_input_format
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        # post-LN residual needs the norm's output back from the fused norm+GEMM modules
        want_ln_out = apply_residual_connection_post_layernorm and not output_layernorm
        common = dict(layernorm_epsilon=layernorm_epsilon, init_method=init_method,
                      output_layer_init_method=output_layer_init_method, layer_number=layer_number,
                      tp_group=tp_group, tp_size=tp_size, num_gqa_groups=num_gqa_groups,
                      fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                      get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
                      params_dtype=params_dtype, return_layernorm_output=want_ln_out,
                      set_parallel_mode=set_parallel_mode, fuse_qkv_params=fuse_qkv_params,
                      zero_centered_gamma=zero_centered_gamma, qkv_weight_interleaved=qkv_weight_interleaved,
                      bias=bias, normalization=normalization, device=device, qkv_format=attn_input_format,
                      rotary_pos_interleaved=rotary_pos_interleaved, softmax_scale=softmax_scale)
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, kv_channels=kv_channels,
            attention_dropout=attention_dropout, attn_mask_type=self_attn_mask_type,
            window_size=window_size, input_layernorm=not output_layernorm, attention_type="self",
            **common)
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size, num_attention_heads, kv_channels=kv_channels,
                attention_dropout=attention_dropout, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, input_layernorm=True, attention_type="cross", **common)
        self.layernorm_mlp = LayerNormMLP(
            hidden_size, ffn_hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
            get_rng_state_tracker=get_rng_state_tracker, tp_group=tp_group, tp_size=tp_size,
            init_method=init_method, output_layer_init_method=output_layer_init_method, bias=bias,
            activation=activation, normalization=normalization, params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            zero_centered_gamma=zero_centered_gamma, set_parallel_mode=set_parallel_mode,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation, device=device,
            activation_params=activation_params)
        if output_layernorm:
            norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = norm_cls(hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
                                      params_dtype=params_dtype, zero_centered_gamma=zero_centered_gamma,
                                      device=device)

    def _drop_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return residual + x
        if self.hidden_dropout > 0.0:
            x = F.dropout(x, self.hidden_dropout, True)
        # packed tokens (thd): per-token depth drop is meaningless
        if self.drop_path_rate > 0.0 and self.attn_input_format != "thd":
            x = _drop_path(x, self.drop_path_rate, True, 1 if self.attn_input_format == "sbhd" else 0)
        return residual + x

    def _weight_casts_beside(self, hidden_states, is_first_microbatch):
        """Under FP8 with sequence parallelism: the call that casts the attention projection's
        and the MLP's weights on a side stream right before the core attention, for their
        forwards to take (module_parts/weight_cast_beside.py); None where it cannot apply."""
        proj = getattr(self.self_attention, "proj", None)
        mlp = self.layernorm_mlp
        # side_stream.usable first: eager calls under the default schedule (host-bound) stop
        # here, before building the items cast_beside would then drop one by one
        if (not side_stream.usable(hidden_states) or proj is None
                or not isinstance(mlp, LayerNormMLP) or is_first_microbatch is not None
                or not proj.sequence_parallel or proj.tp_size < 2 or proj.parallel_mode != "row"):
            return None
        items = ((proj, proj._parameters.get("weight"), 1),
                 (mlp, mlp._parameters.get("fc1_weight"), 1),
                 (mlp, mlp._parameters.get("fc2_weight"), 3))
        # cast_beside keeps the items that apply (none: nothing is launched)
        return lambda: weight_cast_beside.cast_beside(items)

    def _residual_in_gemms(self) -> bool:
        """Whether the residual adds can ride the output GEMMs (attention projection, FC2): only
        when nothing acts on a branch between its GEMM and the add (dropout, drop-path) and the
        residual is the block input (pre-norm)."""
        if self.post_ln_residual or self.parallel_attention_mlp:
            return False
        return not self.training or (self.hidden_dropout == 0.0 and (
            self.drop_path_rate == 0.0 or self.attn_input_format == "thd"))

    @staticmethod
    def _split(outputs, want_ln_out: bool):
        if want_ln_out:
            return outputs[0], outputs[-1]
        return outputs, None

    def set_context_parallel_group(self, cp_group, cp_global_ranks=None, cp_stream=None,
                                   cp_comm_type: str = "p2p") -> None:
        """Splits the sequence over a context-parallel group: every
        :class:`DotProductAttention` inside this module gets the group (see
        :meth:`DotProductAttention.set_context_parallel_group` for the layout, the supported
        configurations and what runs where).

        ``hidden_states`` then holds this rank's part of the sequence in the two-chunk layout,
        and a ``rotary_pos_emb`` must hold the angles of those same positions (the whole table
        split along its first dimension the same way), as each rank rotates its local positions.

        Parameters
        ----------
        cp_group : torch.distributed.ProcessGroup or None
            The group the sequence is split over. ``None``, or a group of one rank, turns
            context parallelism off.
        cp_global_ranks : list of int, optional
            The global ranks of the group's members, in the group's rank order, which is the
            ring's order: rank ``r`` sends K/V to ``cp_global_ranks[r + 1]`` and receives from
            ``cp_global_ranks[r - 1]`` (cyclically). Default: the group's own ranks. Its length
            must be the group's size.
        cp_stream : torch.cuda.Stream, optional
            Accepted for NVIDIA TE's signature and stored; the ring's transfers already overlap
            its compute, so no extra stream is used.
        cp_comm_type : str, default 'p2p'
            How K/V travel: only ``'p2p'`` (ring attention with point-to-point transfers) is
            implemented; other values (NVIDIA TE's ``'all_gather'``, ``'a2a'``, ``'a2a+p2p'``)
            raise ValueError.
        """
        set_context_parallel_group_of(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None,
                self_attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                encoder_output: Optional[torch.Tensor] = None, enc_dec_attn_mask=None,
                enc_dec_attn_mask_type: Optional[str] = None,
                enc_dec_window_size: Optional[Tuple[int, int]] = None,
                is_first_microbatch: Optional[bool] = None, checkpoint_core_attention: bool = False,
                inference_params=None, rotary_pos_emb=None, core_attention_bias_type: str = "no_bias",
                core_attention_bias=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                max_seqlen_q=None, max_seqlen_kv=None, fast_zero_fill: bool = True) -> torch.Tensor:
        """Apply the block to ``hidden_states``.

        Parameters
        ----------
        hidden_states : torch.Tensor
            Input in the layout ``attn_input_format``, float32, bfloat16 or float16.
        attention_mask : torch.Tensor or tuple of torch.Tensor, optional
            For padding mask types: a bool tensor ``[batch, 1, 1, seq]`` that is True at padded
            positions (sequences are right-padded), or a pair of them for queries and keys; ignored
            when
            ``cu_seqlens_*`` are given. For ``'arbitrary'``: a bool tensor broadcastable to
            ``[batch, heads, seq_q, seq_kv]``, True where attention is masked out.
        self_attn_mask_type : str, optional
            Overrides the constructor's self-attention mask type for this call.
        window_size : tuple of (int, int), optional
            Overrides the constructor's window for this call.
        encoder_output : torch.Tensor, optional
            The encoder's output, attended to by a decoder layer's cross-attention.
        enc_dec_attn_mask : torch.Tensor, optional
            Mask of the cross-attention (see ``attention_mask``).
        enc_dec_attn_mask_type : str, optional
            Overrides the constructor's cross-attention mask type for this call.
        enc_dec_window_size : tuple of (int, int), optional
            Overrides the cross-attention's window for this call.
        is_first_microbatch : bool, optional
            With gradient accumulation over micro-batches: ``True`` on the first micro-batch of a
            step
            (the FP8 copy of the weight is cast and cached), ``False`` on the later ones (the cached
            copy is reused, as the weights do not change within a step). ``None`` (default) casts
            the
            weight on every call.
        checkpoint_core_attention : bool, default False
            Recompute the attention in the backward pass instead of saving its intermediate results
            (activation checkpointing of the core attention only).
        inference_params : InferenceParams, optional
            A KV cache for incremental decoding: the call's keys and values are appended to this
            layer's cache (keyed by ``layer_number``) and attention runs over all cached tokens.
            Supported with ``'sbhd'`` and ``'bshd'``.
        rotary_pos_emb : torch.Tensor or tuple of torch.Tensor, optional
            Rotary position embedding frequencies ``[seq, 1, 1, dim]`` from
            :class:`RotaryPositionEmbedding`, applied to queries and keys (a pair applies the first
            to
            the queries and the second to the keys).
        core_attention_bias_type : {'no_bias', 'post_scale_bias'}, default 'no_bias'
            ``'post_scale_bias'`` adds ``core_attention_bias`` to the scaled scores before the
            softmax. The ALiBi types of NVIDIA TE are not implemented (NotImplementedError).
        core_attention_bias : torch.Tensor, optional
            The bias, broadcastable to ``[batch, heads, seq_q, seq_kv]``.
        alibi_slopes : torch.Tensor, optional
            Not implemented; must be ``None``.
        cu_seqlens_q : torch.Tensor, optional
            int32 tensor ``[batch + 1]`` of cumulative query sequence lengths (starting at 0), on
            the
            tensors' device; required with ``'thd'`` and accepted with padding mask types.
        cu_seqlens_kv : torch.Tensor, optional
            The same for keys and values (default: ``cu_seqlens_q``).
        max_seqlen_q : int, optional
            Longest query sequence in the batch (derived from ``cu_seqlens_q`` when omitted; passing
            it avoids a device-to-host copy).
        max_seqlen_kv : int, optional
            Longest key/value sequence in the batch.
        fast_zero_fill : bool, default True
            Accepted for compatibility; outputs at padded query positions are always zero.

        Returns
        -------
        torch.Tensor
            The block's output, of the input's shape.
        """
        kind = hidden_states.device.type
        if torch.is_autocast_enabled(kind):
            # the residual stream in the autocast dtype too, so the block's output is in it
            hidden_states = hidden_states.to(torch.get_autocast_dtype(kind))
        want_ln_out = self.post_ln_residual and not self.output_layernorm
        fused = self._residual_in_gemms()
        attn = self.self_attention(
            hidden_states, attention_mask=attention_mask, attn_mask_type=self_attn_mask_type,
            window_size=window_size, is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention, inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb, core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, fast_zero_fill=fast_zero_fill,
            _residual=hidden_states if fused else None,
            _before_core=self._weight_casts_beside(hidden_states, is_first_microbatch))
        attn_out, ln_out = self._split(attn, want_ln_out)
        residual = ln_out if want_ln_out else hidden_states
        if self.parallel_attention_mlp:
            mlp_out, mlp_ln = self._split(self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch),
                                          self.post_ln_residual)
            return self._drop_add(attn_out + mlp_out, residual)
        hidden = attn_out if fused else self._drop_add(attn_out, residual)
        if self.layer_type == "decoder":
            cross = self.inter_attention(
                hidden, attention_mask=enc_dec_attn_mask, encoder_output=encoder_output,
                attn_mask_type=enc_dec_attn_mask_type, window_size=enc_dec_window_size,
                is_first_microbatch=is_first_microbatch,
                checkpoint_core_attention=checkpoint_core_attention, fast_zero_fill=fast_zero_fill,
                _residual=hidden if fused else None)
            cross_out, cross_ln = self._split(cross, want_ln_out)
            hidden = cross_out if fused else self._drop_add(cross_out, cross_ln if want_ln_out else hidden)
        if fused and self.layernorm_mlp.residual_in_gemm():
            out = self.layernorm_mlp(hidden, is_first_microbatch=is_first_microbatch, _add_input=True)
            return self.layernorm(out) if self.output_layernorm else out
        mlp = self.layernorm_mlp(hidden, is_first_microbatch=is_first_microbatch)
        mlp_out, mlp_ln = self._split(mlp, self.post_ln_residual)
        out = self._drop_add(mlp_out, mlp_ln if self.post_ln_residual else hidden)
        if self.output_layernorm:
            out = self.layernorm(out)
        return out

    def __call__(self, *args, **kwargs):
        """Runs the layer (``torch.nn.Module.__call__``: hooks, then :meth:`forward`) after
        checking its input.

        Parameters
        ----------
        *args : tuple
            Passed to :meth:`forward`; the first must be a float32, float16 or bfloat16 tensor
            (else ValueError naming the module).
        **kwargs : dict
            Passed to :meth:`forward`; ````hidden_states```` may be given here by keyword instead.

        Returns
        -------
        What :meth:`forward` returns.
        """
        return call_checked(self, "hidden_states", torch.nn.Module.__call__, args, kwargs)
