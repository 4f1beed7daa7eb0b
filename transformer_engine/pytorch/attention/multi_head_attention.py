"""MultiheadAttention: (optional input norm +) QKV projection, RoPE, DotProductAttention, output
projection, built from te.Linear / te.LayerNormLinear so FP8 autocast and tensor parallelism apply.

QKV parameter layouts (self attention; q_size = heads * head_dim, kv_size = gqa_groups * head_dim):
  fuse_qkv_params=True, qkv_weight_interleaved=True: one weight [q_size + 2 kv_size, hidden] whose
      rows are grouped per kv group: (the group's query heads, its key head, its value head);
  fuse_qkv_params=True, qkv_weight_interleaved=False: one weight, rows [all q | all k | all v];
  fuse_qkv_params=False: separate parameters query_weight, key_weight, value_weight (one module,
      `parameters_split`), i.e. the [q | k | v] layout.
Cross attention: a query projection (with the input norm) and a key_value projection of
encoder_output (key_weight, value_weight, or one fused weight with fuse_qkv_params).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..module_parts.input_check import call_checked
from ..module_parts.nv_options import check_off
from ..module import LayerNormLinear, Linear
from ..kernels.attention_packed import can_pack, split_packed_qkv
from .dot_product_attention import DotProductAttention, _tp_world_size, set_context_parallel_group_of
from .rope import apply_rotary_pos_emb

_OP = "MultiheadAttention"


class MultiheadAttention(torch.nn.Module):
    """Multi-head self- or cross-attention: optional norm, QKV projection, attention, projection.

    The projections are :class:`LayerNormLinear`/:class:`Linear` (FP8 under :func:`autocast`) and
    the core is :class:`DotProductAttention`, which picks the attention backend per call.

    Parameters
    ----------
    hidden_size : int
        Size of the last dimension of the input and of the output.
    num_attention_heads : int
        Number of query heads, over all tensor-parallel ranks.
    kv_channels : int, optional
        Head dimension (default ``hidden_size // num_attention_heads``).
    attention_dropout : float, default 0.1
        Dropout probability applied to the attention probabilities during training, in [0, 1).
    layernorm_epsilon : float, default 1e-5
        Epsilon of the input norm.
    init_method : callable, optional
        Called as ``init_method(weight)`` to initialise each weight in place. Default: normal with
        mean 0 and standard deviation 0.023.
    output_layer_init_method : callable, optional
        Initialises the output projection's weight (default: as ``init_method``).
    layer_number : int, optional
        Index of the layer in the model (from 1); it keys this layer's entries in the KV cache of
        ``inference_params`` and is required when one is used.
    attn_mask_type : str, default 'causal'
        ``'no_mask'``, ``'causal'`` (top-left aligned), ``'causal_bottom_right'`` (aligned to the
        last key, for queries shorter than keys), ``'padding'``, ``'padding_causal'``,
        ``'padding_causal_bottom_right'`` (padding types read the sequence lengths from
        ``cu_seqlens_*`` or from ``attention_mask``), or ``'arbitrary'`` (a full
        ``attention_mask``). All are supported on every backend; the dispatcher skips a fused
        kernel that lacks a type.
    window_size : tuple of (int, int), optional
        Sliding-window attention: each query sees keys from ``left`` positions before it to
        ``right`` after it; -1 means unbounded on that side. ``None`` (default) is no window
        (``(-1, 0)`` under a causal mask).
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel process group. ``None`` (default) means no tensor parallelism.
    tp_size : int, default 1
        Number of ranks in ``tp_group``; taken from the group when one is given. Any
        ``torch.distributed`` backend (NCCL on NVIDIA, RCCL on AMD, gloo on the CPU).
    num_gqa_groups : int, optional
        Number of key/value heads for grouped-query attention (1 is multi-query attention). Must
        divide ``num_attention_heads``. ``None`` (default) means one per query head.
    fuse_wgrad_accumulation : bool, default False
        Accumulate weight gradients into ``weight.main_grad`` (a float32 tensor the caller
        allocates, as Megatron-style optimizers do) instead of writing ``weight.grad``.
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker`; weight initialisation and attention dropout fork
        it so that tensor-parallel ranks draw different numbers.
    sequence_parallel : bool, default False
        With tensor parallelism (``tp_size > 1``), the input and output of the module are split
        along the sequence dimension across the tensor-parallel group, and the module gathers or
        reduce-scatters them around its GEMMs. Has no effect when ``tp_size`` is 1.
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``): float32, bfloat16 or
        float16. The compute dtype follows the input (or ``torch.autocast``).
    return_bias : bool, default False
        Do not add the output projection's bias; ``forward`` returns ``(output, bias)``.
    return_layernorm_output : bool, default False
        Also return the input norm's output (with ``input_layernorm``).
    input_layernorm : bool, default False
        Normalise the input before the QKV projection (pre-norm).
    attention_type : {'self', 'cross'}, default 'self'
        Self-attention (keys and values from the same sequence as the queries) or cross-attention
        (keys and values from ``encoder_output``).
    set_parallel_mode : bool, default False
        With tensor parallelism, split the QKV projection by columns and the output projection by
        rows over the group (the Megatron-style attention split).
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
    qkv_format : {'sbhd', 'bshd', 'thd'}, default 'sbhd'
        Layout of the tensors: ``[seq, batch, heads, dim]``, ``[batch, seq, heads, dim]``, or
        ``'thd'``: the sequences of a batch packed one after another without padding
        (``[tokens, heads, dim]``, with ``cu_seqlens_q``/``cu_seqlens_kv``).
    name : str, optional
        A name for the module, used in debug logging only.
    rotary_pos_interleaved : bool, default False
        Rotary embeddings rotate adjacent pairs of channels (interleaved, GPT-J style) instead of
        the two halves of the head dimension.
    softmax_scale : float, optional
        Factor applied to ``q @ k^T`` before the softmax (default ``1 / sqrt(head_dim_qk)``).
    ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad : bool, default False
        Overlap of tensor-parallel communication with the GEMMs through NVIDIA's userbuffers.
        Not implemented: only False is accepted; True raises NotImplementedError. The
        tensor-parallel communication runs as separate ``torch.distributed`` collectives.
    bottom_right_diagonal : bool, optional
        Align the causal diagonal to the last key explicitly. Not implemented as an option: only
        None is accepted; the mask type decides the alignment (the ``*_bottom_right`` types).
    qk_norm_type : str, optional
        Normalisation of the queries and keys before the attention. Not implemented: only None
        is accepted (a value raises NotImplementedError).
    qk_norm_eps : float, default 1e-6
        Epsilon of that normalisation; without effect (it is not implemented).
    qk_norm_before_rope : bool, default False
        Apply that normalisation before the rotary embedding; without effect.
    seq_length : int, optional
        Sequence length; a size hint of NVIDIA TE's userbuffers, stored without effect (shapes
        come from the input).
    micro_batch_size : int, optional
        Micro-batch size; stored without effect, like ``seq_length``.
    softmax_type : str, default 'vanilla'
        Only ``'vanilla'`` (the plain softmax) is implemented; other values (NVIDIA TE's
        ``'off-by-one'`` and ``'learnable'``) raise NotImplementedError.
    """

    def __init__(self, hidden_size: int, num_attention_heads: int, kv_channels: Optional[int] = None,
                 attention_dropout: float = 0.1, layernorm_epsilon: float = 1e-5,
                 init_method=None, output_layer_init_method=None, layer_number: Optional[int] = None,
                 attn_mask_type: str = "causal", window_size: Optional[Tuple[int, int]] = None,
                 tp_group=None, tp_size: int = 1, num_gqa_groups: Optional[int] = None,
                 fuse_wgrad_accumulation: bool = False, get_rng_state_tracker=None,
                 sequence_parallel: bool = False, params_dtype: Optional[torch.dtype] = None,
                 return_bias: bool = False, return_layernorm_output: bool = False,
                 input_layernorm: bool = False, attention_type: str = "self",
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False,
                 zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 bias: bool = True, normalization: str = "LayerNorm", device=None,
                 qkv_format: str = "sbhd", name: Optional[str] = None, rotary_pos_interleaved: bool = False,
                 softmax_scale: Optional[float] = None, bottom_right_diagonal: Optional[bool] = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, qk_norm_type: Optional[str] = None,
                 qk_norm_eps: float = 1e-6, qk_norm_before_rope: bool = False,
                 seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None,
                 softmax_type: str = "vanilla"):
        super().__init__()
        check_off(_OP, ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                  ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_dgrad=ub_bulk_dgrad,
                  ub_bulk_wgrad=ub_bulk_wgrad, bottom_right_diagonal=bottom_right_diagonal,
                  qk_norm_type=qk_norm_type, softmax_type=softmax_type)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size  # size hints only
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OP}: attention_type is {attention_type!r}; expected 'self' or 'cross'")
        if return_layernorm_output and not input_layernorm:
            raise ValueError(f"{_OP}: return_layernorm_output=True needs input_layernorm=True")
        kv_channels = kv_channels if kv_channels is not None else hidden_size // num_attention_heads
        num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        tp = _tp_world_size(tp_group, tp_size)
        self.hidden_size, self.head_dim = hidden_size, kv_channels
        self.num_attention_heads, self.num_gqa_groups = num_attention_heads, num_gqa_groups
        self.heads_q, self.heads_kv = num_attention_heads // max(tp, 1), num_gqa_groups // max(tp, 1)
        self.attention_type, self.input_layernorm = attention_type, input_layernorm
        self.return_bias, self.return_layernorm_output = return_bias, return_layernorm_output
        self.fuse_qkv_params, self.qkv_weight_interleaved = fuse_qkv_params, qkv_weight_interleaved
        self.qkv_format, self.layer_number = qkv_format, layer_number
        self.rotary_pos_interleaved = rotary_pos_interleaved
        # The core attention validates heads/GQA/mask/window arguments for the whole module.
        core_attention = DotProductAttention(
            num_attention_heads, kv_channels, num_gqa_groups=num_gqa_groups,
            attention_dropout=attention_dropout, qkv_format=qkv_format, attn_mask_type=attn_mask_type,
            window_size=window_size, sequence_parallel=sequence_parallel, tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker, tp_group=tp_group, layer_number=layer_number,
            attention_type=attention_type, softmax_scale=softmax_scale)
        q_size, kv_size = num_attention_heads * kv_channels, num_gqa_groups * kv_channels
        common = dict(sequence_parallel=sequence_parallel, fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                      tp_group=tp_group, tp_size=tp_size, get_rng_state_tracker=get_rng_state_tracker,
                      params_dtype=params_dtype, device=device, bias=bias)
        column = dict(common, init_method=init_method,
                      parallel_mode="column" if set_parallel_mode else None)
        norm = dict(eps=layernorm_epsilon, normalization=normalization,
                    zero_centered_gamma=zero_centered_gamma,
                    return_layernorm_output=return_layernorm_output)
        if attention_type == "self":
            split = None if fuse_qkv_params else ("query_", "key_", "value_")
            if input_layernorm:
                self.layernorm_qkv = LayerNormLinear(hidden_size, q_size + 2 * kv_size,
                                                     parameters_split=_split(split, q_size // tp, kv_size // tp),
                                                     **column, **norm)
            else:
                self.qkv = Linear(hidden_size, q_size + 2 * kv_size,
                                  parameters_split=_split(split, q_size // tp, kv_size // tp), **column)
        else:
            if input_layernorm:
                self.layernorm_query = LayerNormLinear(
                    hidden_size, q_size, parameters_split=None if fuse_qkv_params else ("query_",),
                    **column, **norm)
            else:
                self.query_layer = Linear(hidden_size, q_size, **column)
            split = None if fuse_qkv_params else {"key_": kv_size // tp, "value_": kv_size // tp}
            self.key_value = Linear(hidden_size, 2 * kv_size, parameters_split=split, **column)
        # registered between the projections, as NVIDIA TE does (state_dict key order)
        self.core_attention = core_attention
        self.proj = Linear(q_size, hidden_size, init_method=output_layer_init_method,
                           parallel_mode="row" if set_parallel_mode else None,
                           return_bias=return_bias, **common)

    # ----- projections ---------------------------------------------------------------------------

    def _project(self, module, x, is_first_microbatch):
        out = module(x, is_first_microbatch=is_first_microbatch)
        if isinstance(out, tuple):  # (projection, layernorm output)
            return out[0], out[-1]
        return out, None

    def _split_heads(self, x, heads):
        return x.view(*x.shape[:-1], heads, self.head_dim)

    def _qkv_self(self, hidden_states, is_first_microbatch, residual=None):
        """(q, k, v, norm output or None, residual): a residual that is hidden_states comes back
        as the fused norm+QKV module's view of it (LayerNormLinear _pass_input), so that its
        gradient rides that module's norm backward."""
        module = self.layernorm_qkv if self.input_layernorm else self.qkv
        if residual is not None and residual is hidden_states and self.input_layernorm:
            out, residual = module(hidden_states, is_first_microbatch=is_first_microbatch,
                                   _pass_input=True)
            mixed, ln_out = (out[0], out[-1]) if isinstance(out, tuple) else (out, None)
        else:
            mixed, ln_out = self._project(module, hidden_states, is_first_microbatch)
        hq, hkv, d = self.heads_q, self.heads_kv, self.head_dim
        interleaved = self.fuse_qkv_params and self.qkv_weight_interleaved
        if can_pack(mixed, hq, hkv, interleaved):
            # strided views, no copies; the attention backward can fill mixed's gradient in place
            q, k, v = split_packed_qkv(mixed, hq, hkv, d, interleaved)
        elif interleaved:
            per_group = hq // hkv
            grouped = mixed.view(*mixed.shape[:-1], hkv, per_group + 2, d)
            # one split (its backward is one concatenation, not three zero-filled scatters)
            q, k, v = torch.split(grouped, (per_group, 1, 1), dim=-2)
            q = q.reshape(*mixed.shape[:-1], hq, d)
            k, v = k.squeeze(-2), v.squeeze(-2)
        else:
            q, k, v = torch.split(mixed, (hq * d, hkv * d, hkv * d), dim=-1)
            q, k, v = self._split_heads(q, hq), self._split_heads(k, hkv), self._split_heads(v, hkv)
        return q, k, v, ln_out, residual

    def _qkv_cross(self, hidden_states, encoder_output, is_first_microbatch):
        if encoder_output is None:
            raise ValueError(f"{_OP}: cross attention needs encoder_output")
        module = self.layernorm_query if self.input_layernorm else self.query_layer
        q, ln_out = self._project(module, hidden_states, is_first_microbatch)
        kv, _ = self._project(self.key_value, encoder_output, is_first_microbatch)
        k, v = torch.split(kv, (self.heads_kv * self.head_dim,) * 2, dim=-1)
        return (self._split_heads(q, self.heads_q), self._split_heads(k, self.heads_kv),
                self._split_heads(v, self.heads_kv), ln_out)

    def _rope(self, q, k, rotary_pos_emb, qkv_format, inference_params, cu_seqlens_q, cu_seqlens_kv):
        q_freqs, k_freqs = (rotary_pos_emb if isinstance(rotary_pos_emb, (tuple, list))
                            else (rotary_pos_emb, rotary_pos_emb))
        if inference_params is not None:  # new tokens sit at positions offset, offset + 1, ...
            start = inference_params.sequence_len_offset
            sq = q.shape[0] if qkv_format == "sbhd" else q.shape[1]
            sk = k.shape[0] if qkv_format == "sbhd" else k.shape[1]
            q_freqs, k_freqs = q_freqs[start:start + sq], k_freqs[start:start + sk]
        q = apply_rotary_pos_emb(q, q_freqs, qkv_format, self.rotary_pos_interleaved, fused=True,
                                 cu_seqlens=cu_seqlens_q)
        k = apply_rotary_pos_emb(k, k_freqs, qkv_format, self.rotary_pos_interleaved, fused=True,
                                 cu_seqlens=cu_seqlens_kv)
        return q, k

    # ----- forward ---------------------------------------------------------------------------------

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

    def __call__(self, *args, **kwargs):
        """Runs the attention block (``torch.nn.Module.__call__``: hooks, then :meth:`forward`) with the
        GPU of its first input current.

        Parameters
        ----------
        *args : tuple
            Passed to :meth:`forward`; the first must be a float32, float16 or bfloat16 tensor
            (else ValueError naming the module).
        **kwargs : dict
            Passed to :meth:`forward`; ``hidden_states`` may be given here by keyword instead.

        Returns
        -------
        What :meth:`forward` returns.
        """
        return call_checked(self, "hidden_states", torch.nn.Module.__call__, args, kwargs)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None,
                encoder_output: Optional[torch.Tensor] = None, attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None, is_first_microbatch: Optional[bool] = None,
                checkpoint_core_attention: bool = False, inference_params=None,
                rotary_pos_emb: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias=None, alibi_slopes=None,
                cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                fast_zero_fill: bool = True, *, _residual: Optional[torch.Tensor] = None,
                _before_core=None):
        # _residual (internal: TransformerLayer's residual connection) is added to the output,
        # by the projection's GEMM where it can (Linear.residual_in_gemm); _before_core
        # (internal: TransformerLayer's weight casts made beside the core attention) is called
        # right before the core attention
        """Apply the attention block to ``hidden_states``.

        Parameters
        ----------
        hidden_states : torch.Tensor
            Input ``[seq, batch, hidden_size]`` (``'sbhd'``), ``[batch, seq, hidden_size]``
            (``'bshd'``) or ``[tokens, hidden_size]`` (``'thd'``).
        attention_mask : torch.Tensor or tuple of torch.Tensor, optional
            For padding mask types: a bool tensor ``[batch, 1, 1, seq]`` that is True at padded
            positions (sequences are right-padded), or a pair of them for queries and keys; ignored
            when
            ``cu_seqlens_*`` are given. For ``'arbitrary'``: a bool tensor broadcastable to
            ``[batch, heads, seq_q, seq_kv]``, True where attention is masked out.
        encoder_output : torch.Tensor, optional
            Keys and values come from this tensor for cross-attention (``attention_type='cross'``).
        attn_mask_type : str, optional
            Overrides the constructor's mask type for this call (see the constructor).
        window_size : tuple of (int, int), optional
            Overrides the constructor's window for this call.
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
        torch.Tensor or tuple
            The output, of the input's shape; with ``return_bias`` also the bias, and with
            ``return_layernorm_output`` also the norm's output.
        """
        if _residual is not None and self.return_bias:
            raise ValueError(f"{_OP}: _residual cannot be added to an output returned with its bias")
        want = 2 if self.qkv_format == "thd" else 3
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != want \
                or hidden_states.shape[-1] != self.hidden_size:
            shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states)
            raise ValueError(f"{_OP}: hidden_states has shape {shape}; expected {want} dims ending in "
                             f"hidden_size {self.hidden_size} for qkv_format {self.qkv_format!r}")
        # the projection's output has hidden_states' leading dims (this rank's rows under
        # sequence parallelism): whether its GEMM can add the residual is known now
        fusable = _residual is not None and self.proj.residual_fits_output(
            _residual, tuple(hidden_states.shape[:-1]), hidden_states.device)
        if self.attention_type == "self":
            # a residual the projection's GEMM will add comes back from the norm+QKV module
            q, k, v, ln_out, passed = self._qkv_self(hidden_states, is_first_microbatch,
                                                     _residual if fusable else None)
            if fusable:
                _residual = passed
        else:
            q, k, v, ln_out = self._qkv_cross(hidden_states, encoder_output, is_first_microbatch)
        if self.qkv_format == "thd" and self.attention_type == "self" and cu_seqlens_kv is None:
            cu_seqlens_kv = cu_seqlens_q
        if rotary_pos_emb is not None:
            q, k = self._rope(q, k, rotary_pos_emb, self.qkv_format, inference_params,
                              cu_seqlens_q, cu_seqlens_kv)
        if _before_core is not None:
            _before_core()
        context = self.core_attention(
            q, k, v, attention_mask=attention_mask, qkv_format=self.qkv_format,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, attn_mask_type=attn_mask_type, window_size=window_size,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes, fast_zero_fill=fast_zero_fill, inference_params=inference_params)
        if fusable:
            out = self.proj(context, is_first_microbatch=is_first_microbatch, _residual=_residual)
        else:
            out = self.proj(context, is_first_microbatch=is_first_microbatch)
            if _residual is not None:
                out = _residual + out
        outputs = tuple(out) if self.return_bias else (out,)
        if self.return_layernorm_output:
            outputs = outputs + (ln_out,)
        return outputs[0] if len(outputs) == 1 else outputs


def _split(names, q_size, kv_size):
    """parameters_split sizes of one tensor-parallel rank (the modules split out_features)."""
    if names is None:
        return None
    return dict(zip(names, (q_size, kv_size, kv_size)))
