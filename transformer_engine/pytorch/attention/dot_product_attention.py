"""DotProductAttention: softmax(scale * q k^T + mask) v behind the backend dispatcher."""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.utils.checkpoint

from ..module_parts.input_check import call_checked
from ..module_parts.nv_options import check_off
from ...common import config as env
from ..kernels import attention as attn_ops
from ..kernels._checks import check_tensor
from . import masks
from .backend_selection import get_attention_backend
from .context_parallel import check_context_parallel, context_parallel_attention
from .sdpa import sdpa_attention
from .unfused import unfused_attention

_OP = "DotProductAttention"
_BIAS_TYPES = ("no_bias", "post_scale_bias")


def _tp_world_size(tp_group, tp_size: int) -> int:
    if tp_group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(tp_group)
    return int(tp_size)


def _cu_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)


def _check_cu_seqlens(items) -> None:
    """cu_seqlens of the thd format: on the tokens' device, starting at 0, non-decreasing, and
    ending within the token count (the values are checked in one read from the device; skipped
    while a CUDA graph is captured or torch.compile traces, where no value can be read)."""
    for name, cu, x in items:
        if cu.device != x.device:
            raise ValueError(f"{_OP}: {name} is on {cu.device}; expected the device of the "
                             f"tokens ({x.device})")
        if cu.numel() < 2:
            raise ValueError(f"{_OP}: {name} has {cu.numel()} values; expected [b + 1] with b >= 1")
    if torch.compiler.is_compiling() or (items[0][1].is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    checks = []
    for _, cu, x in items:
        checks += [cu[0] != 0, (cu[1:] < cu[:-1]).any(), cu[-1] > x.shape[0]]
    flags = torch.stack([c.reshape(()) for c in checks]).tolist()
    for i, (name, cu, x) in enumerate(items):
        first, decreasing, beyond = flags[3 * i:3 * i + 3]
        if first:
            raise ValueError(f"{_OP}: {name} starts at {int(cu[0])}; expected 0")
        if decreasing:
            raise ValueError(f"{_OP}: {name} is not non-decreasing ({cu.tolist()[:16]}); expected "
                             f"cumulative sequence lengths")
        if beyond:
            raise ValueError(f"{_OP}: {name} ends at {int(cu[-1])}, beyond the {x.shape[0]} tokens "
                             f"of the thd input")


class DotProductAttention(torch.nn.Module):
    """Scaled dot-product attention over already projected queries, keys and values.

    Computes ``softmax(q k^T * softmax_scale + bias, masked) v`` per head, with optional dropout on
    the probabilities. The output has the queries' layout with the heads flattened:
    ``[s, b, h * d_v]``, ``[b, s, h * d_v]`` or ``[t, h * d_v]``.

    The backend is chosen per call from the call's configuration (dtype, head size, mask, layout,
    GQA, window, dropout, device): on NVIDIA cuDNN's fused attention, PyTorch's SDPA kernels, a
    portable native kernel or the unfused path; on AMD PyTorch's SDPA (AOTriton/CK kernels) or the
    unfused path; on the CPU the unfused reference. ``NVTE_FUSED_ATTN``, ``NVTE_FLASH_ATTN``,
    ``NVTE_SDPA_ATTN`` and ``NVTE_UNFUSED_ATTN`` (0/1) switch backends off and ``NVTE_DEBUG=1`` logs the choice and why the
    others were rejected. Deterministic kernels only are used when
    ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``.

    Parameters
    ----------
    num_attention_heads : int
        Number of query heads, over all tensor-parallel ranks.
    kv_channels : int or tuple of (int, int)
        Head dimension, or ``(head_dim_qk, head_dim_v)`` when the value heads are of another size.
    num_gqa_groups : int, optional
        Number of key/value heads for grouped-query attention (1 is multi-query attention). Must
        divide ``num_attention_heads``. ``None`` (default) means one per query head.
    attention_dropout : float, default 0.0
        Dropout probability applied to the attention probabilities during training, in [0, 1).
    qkv_format : {'sbhd', 'bshd', 'thd'}, default 'sbhd'
        Layout of the tensors: ``[seq, batch, heads, dim]``, ``[batch, seq, heads, dim]``, or
        ``'thd'``: the sequences of a batch packed one after another without padding
        (``[tokens, heads, dim]``, with ``cu_seqlens_q``/``cu_seqlens_kv``).
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
    sequence_parallel : bool, default False
        Recorded for compatibility; the core attention itself is local to each rank.
    tp_size : int, default 1
        Tensor-parallel size: each rank holds ``num_attention_heads / tp_size`` query heads.
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker` whose fork is used for the dropout mask, so that
        tensor-parallel ranks draw different masks.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel group (its size overrides ``tp_size``).
    layer_number : int, optional
        Index of the layer in the model (from 1); it keys this layer's entries in the KV cache of
        ``inference_params`` and is required when one is used.
    attention_type : {'self', 'cross'}, default 'self'
        Self-attention (keys and values from the same sequence as the queries) or cross-attention
        (keys and values from ``encoder_output``).
    cp_group : torch.distributed.ProcessGroup, optional
        Context parallelism: the group the sequence is split over (ring attention, K/V passed
        point to point; see :meth:`set_context_parallel_group`). Each rank passes its part of
        q/k/v in the balanced two-chunk layout of ``split_for_context_parallel``. Masks
        ``'causal'`` and ``'no_mask'``, formats ``'bshd'``/``'sbhd'``, no dropout or bias.
    cp_global_ranks : list of int, optional
        The global ranks of ``cp_group``, in ring order (default: the group's own order).
    cp_stream : torch.cuda.Stream, optional
        Accepted for NVIDIA TE's signature; the ring's transfers already overlap its compute.
    cp_comm_type : str, default 'p2p'
        Only ``'p2p'`` (the ring) is implemented.
    softmax_scale : float, optional
        Factor applied to ``q @ k^T`` before the softmax (default ``1 / sqrt(head_dim_qk)``).
    softmax_type : str, default 'vanilla'
        Only ``'vanilla'`` (the plain softmax) is implemented; other values (NVIDIA TE's
        ``'off-by-one'`` and ``'learnable'``) raise NotImplementedError.
    bottom_right_diagonal : bool, optional
        Align the causal diagonal to the last key explicitly. Not implemented as an option: only
        None is accepted (a value raises NotImplementedError); the mask type decides the
        alignment (the ``*_bottom_right`` types).
    return_max_logit : bool, default False
        Also return the largest attention logit per head. Not implemented: only False is
        accepted (True raises NotImplementedError).
    name : str, optional
        A name for the module, used in debug logging only.
    """

    def __init__(self, num_attention_heads: int, kv_channels: Union[int, Tuple[int, int]],
                 num_gqa_groups: Optional[int] = None, attention_dropout: float = 0.0,
                 qkv_format: str = "sbhd", attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, sequence_parallel: bool = False,
                 tp_size: int = 1, get_rng_state_tracker=None, tp_group=None,
                 layer_number: Optional[int] = None, attention_type: str = "self",
                 cp_group=None, cp_global_ranks=None, cp_stream=None, cp_comm_type: str = "p2p",
                 softmax_scale: Optional[float] = None, softmax_type: str = "vanilla",
                 bottom_right_diagonal: Optional[bool] = None, return_max_logit: bool = False,
                 name: Optional[str] = None):
        super().__init__()
        check_off(_OP, bottom_right_diagonal=bottom_right_diagonal, return_max_logit=return_max_logit)
        self.name = name
        if softmax_type != "vanilla":
            raise NotImplementedError(f"{_OP}: softmax_type {softmax_type!r}: only 'vanilla' is implemented")
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OP}: attention_type is {attention_type!r}; expected 'self' or 'cross'")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"{_OP}: attention_dropout is {attention_dropout}; expected [0, 1)")
        tp = _tp_world_size(tp_group, tp_size)
        num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        for name, heads in (("num_attention_heads", num_attention_heads), ("num_gqa_groups", num_gqa_groups)):
            if heads < 1 or heads % tp:
                raise ValueError(f"{_OP}: {name} is {heads}; expected a positive multiple of the "
                                 f"tensor-parallel size {tp}")
        if num_attention_heads % num_gqa_groups:
            raise ValueError(f"{_OP}: num_attention_heads {num_attention_heads} is not a multiple "
                             f"of num_gqa_groups {num_gqa_groups}")
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.heads_q = num_attention_heads // tp           # per tensor-parallel rank
        self.heads_kv = num_gqa_groups // tp
        if isinstance(kv_channels, (tuple, list)):
            self.head_dim_qk, self.head_dim_v = int(kv_channels[0]), int(kv_channels[1])
        else:
            self.head_dim_qk = self.head_dim_v = int(kv_channels)
        self.qkv_format = masks.check_qkv_format(_OP, qkv_format)
        self.attn_mask_type = masks.canonical_mask_type(_OP, attn_mask_type)
        masks.canonical_window(_OP, window_size, self.attn_mask_type)   # validate now
        self.window_size = window_size   # as given: a forward may change the mask type
        self.attention_dropout = float(attention_dropout)
        self.softmax_scale = (1.0 / math.sqrt(self.head_dim_qk)) if softmax_scale is None else float(softmax_scale)
        self.layer_number = layer_number
        self.attention_type = attention_type
        self.get_rng_state_tracker = get_rng_state_tracker
        self.sequence_parallel = sequence_parallel
        self.last_backend_report = None    # the report of the latest forward (for inspection)
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
        # per-call host work is paid once per geometry: every training step repeats the same call
        self._checked, self._configs = set(), {}

    def set_context_parallel_group(self, cp_group, cp_global_ranks=None, cp_stream=None,
                                   cp_comm_type: str = "p2p") -> None:
        """Splits the sequence over a context-parallel group (ring attention).

        With a group of ``cp`` ranks, every rank holds ``1 / cp`` of the sequence of ``q``, ``k``
        and ``v``: the sequence is cut into ``2 * cp`` equal chunks and rank ``r`` holds chunks
        ``r`` and ``2 * cp - 1 - r``, concatenated in that order along the sequence dimension
        (this balances the work of a causal mask over the ranks;
        ``transformer_engine.pytorch.attention.context_parallel.split_for_context_parallel``
        makes this layout from a whole sequence). Each forward then runs ``cp`` steps: the local
        queries attend to the K/V chunk of one rank while the next chunk travels around the ring,
        and the partial results are merged by their log-sum-exp; the backward repeats the ring,
        and the K/V gradients return to their owner. The output is this rank's part, in the same
        layout.

        Supported: ``attn_mask_type`` ``'causal'`` or ``'no_mask'``, ``qkv_format`` ``'bshd'`` or
        ``'sbhd'``, no dropout, no ``core_attention_bias``, no sliding window, no KV cache,
        ``attention_mask`` or ``cu_seqlens``, and an even local sequence length (the whole
        sequence a multiple of ``2 * cp``); anything else raises ValueError on every rank before
        any transfer. Each chunk runs on a native fused attention kernel where one accepts it
        (NVIDIA: the cuDNN backend, then the portable kernel; AMD: the ``'cudnn'``-named fused
        backend only, the portable kernel's FMA build being slower there than plain torch),
        else in plain torch (float32 maths), which is also what CPU tensors use (gloo).

        Parameters
        ----------
        cp_group : torch.distributed.ProcessGroup or None
            The group the sequence is split over. ``None``, or a group of one rank, turns
            context parallelism off.
        cp_global_ranks : list of int, optional
            The global ranks of the group's members in ring order, which is the group's rank
            order: rank ``r`` sends K/V to ``cp_global_ranks[r + 1]`` and receives from
            ``cp_global_ranks[r - 1]`` (cyclically). Default: the group's own ranks. Its length
            must be the group's size (else ValueError at the first forward).
        cp_stream : torch.cuda.Stream, optional
            Accepted for NVIDIA TE's signature and stored; the ring's transfers already overlap
            its compute, so no extra stream is used.
        cp_comm_type : str, default 'p2p'
            How K/V travel: only ``'p2p'`` (point-to-point transfers around the ring) is
            implemented; other values (NVIDIA TE's ``'all_gather'``, ``'a2a'``, ``'a2a+p2p'``)
            raise ValueError.
        """
        if cp_comm_type != "p2p":
            raise ValueError(f"{_OP}: cp_comm_type {cp_comm_type!r}; only 'p2p' (ring) is implemented")
        self.cp_group, self.cp_global_ranks, self.cp_stream = cp_group, cp_global_ranks, cp_stream

    def _context_parallel(self) -> bool:
        return (self.cp_group is not None and torch.distributed.is_available()
                and torch.distributed.is_initialized() and torch.distributed.get_world_size(self.cp_group) > 1)

    # ----- argument handling ------------------------------------------------------------------

    def _check_qkv(self, q, k, v, qkv_format):
        dims = 3 if qkv_format == "thd" else 4
        for name, t in (("query_layer", q), ("key_layer", k), ("value_layer", v)):
            check_tensor(_OP, name, t, (torch.float32, torch.float16, torch.bfloat16), contiguous=False)
            if t.dim() != dims:
                raise ValueError(f"{_OP}: {name} has shape {tuple(t.shape)}; expected {dims} dims "
                                 f"for qkv_format {qkv_format!r}")
        if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
            raise ValueError(f"{_OP}: query/key/value must share dtype and device; got "
                             f"{q.dtype}/{k.dtype}/{v.dtype} on {q.device}/{k.device}/{v.device}")
        want = ((self.heads_q, self.head_dim_qk), (self.heads_kv, self.head_dim_qk),
                (self.heads_kv, self.head_dim_v))
        for (name, t), (h, d) in zip((("query_layer", q), ("key_layer", k), ("value_layer", v)), want):
            if tuple(t.shape[-2:]) != (h, d):
                raise ValueError(f"{_OP}: {name} has shape {tuple(t.shape)}; expected [..., {h} "
                                 f"heads, head dim {d}] (num_attention_heads/num_gqa_groups/"
                                 "kv_channels per tensor-parallel rank)")
        if qkv_format != "thd":
            bq = q.shape[0] if qkv_format == "bshd" else q.shape[1]
            sk_axis, b_axis = (1, 0) if qkv_format == "bshd" else (0, 1)
            if k.shape[b_axis] != bq or v.shape[b_axis] != bq or k.shape[sk_axis] != v.shape[sk_axis]:
                raise ValueError(f"{_OP}: key/value shapes {tuple(k.shape)}/{tuple(v.shape)} do not "
                                 f"match query {tuple(q.shape)} in batch or each other in sequence")

    def _lengths(self, q, k, qkv_format, mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv):
        """Per-sequence lengths for padding types (from cu_seqlens or a padding mask), and the
        cu_seqlens the fused kernels take."""
        if qkv_format == "thd":
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError(f"{_OP}: qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv")
            for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
                check_tensor(_OP, name, cu, (torch.int32,))
            if cu_seqlens_q.numel() != cu_seqlens_kv.numel() or cu_seqlens_q.dim() != 1:
                raise ValueError(f"{_OP}: cu_seqlens_q/cu_seqlens_kv have shapes "
                                 f"{tuple(cu_seqlens_q.shape)}/{tuple(cu_seqlens_kv.shape)}; expected [b + 1] each")
            _check_cu_seqlens((("cu_seqlens_q", cu_seqlens_q, q), ("cu_seqlens_kv", cu_seqlens_kv, k)))
            return None, None, cu_seqlens_q, cu_seqlens_kv
        if not masks.is_padding(mask_type):
            return None, None, None, None
        b = q.shape[0] if qkv_format == "bshd" else q.shape[1]
        sq, sk = (q.shape[1], k.shape[1]) if qkv_format == "bshd" else (q.shape[0], k.shape[0])
        if cu_seqlens_q is not None and cu_seqlens_kv is not None:
            return masks.seqlens_from_cu(cu_seqlens_q), masks.seqlens_from_cu(cu_seqlens_kv), \
                cu_seqlens_q.to(torch.int32), cu_seqlens_kv.to(torch.int32)
        if attention_mask is None:
            raise ValueError(f"{_OP}: attn_mask_type {mask_type!r} needs attention_mask (True = "
                             "padded) or cu_seqlens_q/cu_seqlens_kv")
        if isinstance(attention_mask, (tuple, list)):
            mask_q, mask_kv = attention_mask
        else:
            if sq != sk:
                raise ValueError(f"{_OP}: with sq {sq} != sk {sk}, attention_mask must be a tuple "
                                 "(query padding mask, key padding mask)")
            mask_q = mask_kv = attention_mask
        lq = masks.seqlens_from_padding_mask(_OP, "attention_mask (query)", mask_q, sq)
        lk = masks.seqlens_from_padding_mask(_OP, "attention_mask (key)", mask_kv, sk)
        if lq.numel() != b or lk.numel() != b:
            raise ValueError(f"{_OP}: attention_mask has batch {lq.numel()}; expected {b}")
        return lq, lk, _cu_from_lengths(lq), _cu_from_lengths(lk)

    def _arbitrary_mask(self, attention_mask, q_shape_b, sq, sk):
        if attention_mask is None or isinstance(attention_mask, (tuple, list)):
            raise ValueError(f"{_OP}: attn_mask_type 'arbitrary' needs attention_mask, a bool "
                             f"tensor [b or 1, h or 1, {sq}, {sk}] with True = masked out")
        check_tensor(_OP, "attention_mask", attention_mask, (torch.bool,), contiguous=False)
        m = attention_mask
        if m.dim() != 4 or m.shape[0] not in (1, q_shape_b) or m.shape[1] not in (1, self.heads_q) \
                or tuple(m.shape[2:]) != (sq, sk):
            raise ValueError(f"{_OP}: attention_mask has shape {tuple(m.shape)}; expected "
                             f"[{q_shape_b} or 1, {self.heads_q} or 1, {sq}, {sk}]")
        return m

    def _rng_context(self):
        if self.get_rng_state_tracker is None:
            return None
        return lambda: self.get_rng_state_tracker().fork()

    # ----- forward ----------------------------------------------------------------------------

    # NVIDIA TE keeps FP8 attention metadata under core_attention._extra_state; the key exists
    # here too, so state_dicts line up both ways. FP8 attention is not implemented (fp8_dpa is
    # refused by the recipes), so there is no state to save and a loaded one has no use.
    def get_extra_state(self):
        """The module's extra state for ``state_dict``: None, as no FP8 attention state exists
        (the ``_extra_state`` key is kept so that checkpoints line up with NVIDIA TE's).

        Returns
        -------
        None
        """
        return None

    def set_extra_state(self, state) -> None:
        """Accepts the extra state of a loaded ``state_dict`` and ignores it (FP8 attention is
        not implemented, so a saved FP8 attention state has no use here).

        Parameters
        ----------
        state : object
            The saved ``_extra_state`` value (None, or NVIDIA TE's FP8 metadata).
        """
        return None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if prefix + "_extra_state" in missing_keys:
            missing_keys.remove(prefix + "_extra_state")  # saved without it

    def __call__(self, *args, **kwargs):
        """Runs the attention (``torch.nn.Module.__call__``: hooks, then :meth:`forward`) with the
        GPU of its first input current.

        Parameters
        ----------
        *args : tuple
            Passed to :meth:`forward`; the first is the query tensor.
        **kwargs : dict
            Passed to :meth:`forward`; ``query_layer`` may be given here by keyword instead.

        Returns
        -------
        What :meth:`forward` returns.
        """
        return call_checked(self, "query_layer", torch.nn.Module.__call__, args, kwargs, float_input=False)

    def forward(self, query_layer: torch.Tensor, key_layer: torch.Tensor, value_layer: torch.Tensor,
                attention_mask=None, qkv_format: Optional[str] = None,
                cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_kv: Optional[torch.Tensor] = None,
                cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
                max_seqlen_q: Optional[int] = None, max_seqlen_kv: Optional[int] = None,
                attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                checkpoint_core_attention: bool = False, core_attention_bias_type: str = "no_bias",
                core_attention_bias: Optional[torch.Tensor] = None, alibi_slopes=None,
                fast_zero_fill: bool = True, inference_params=None) -> torch.Tensor:
        """Attend from ``query_layer`` to ``key_layer``/``value_layer``.

        Parameters
        ----------
        query_layer : torch.Tensor
            Queries ``[..., heads, head_dim_qk]`` in the layout ``qkv_format``; float32, bfloat16 or
            float16.
        key_layer : torch.Tensor
            Keys ``[..., num_gqa_groups, head_dim_qk]``.
        value_layer : torch.Tensor
            Values ``[..., num_gqa_groups, head_dim_v]``.
        attention_mask : torch.Tensor or tuple of torch.Tensor, optional
            For padding mask types: a bool tensor ``[batch, 1, 1, seq]`` that is True at padded
            positions (sequences are right-padded), or a pair of them for queries and keys; ignored
            when
            ``cu_seqlens_*`` are given. For ``'arbitrary'``: a bool tensor broadcastable to
            ``[batch, heads, seq_q, seq_kv]``, True where attention is masked out.
        qkv_format : {'sbhd', 'bshd', 'thd'}, optional
            Overrides the constructor's layout for this call.
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
        cu_seqlens_q_padded : torch.Tensor, optional
            Not implemented (packed sequences with gaps); must be ``None``.
        cu_seqlens_kv_padded : torch.Tensor, optional
            Not implemented; must be ``None``.
        attn_mask_type : str, optional
            Overrides the constructor's mask type for this call (see the constructor).
        window_size : tuple of (int, int), optional
            Overrides the constructor's window for this call.
        checkpoint_core_attention : bool, default False
            Recompute the attention in the backward pass instead of saving its intermediate results
            (activation checkpointing of the core attention only).
        core_attention_bias_type : {'no_bias', 'post_scale_bias'}, default 'no_bias'
            ``'post_scale_bias'`` adds ``core_attention_bias`` to the scaled scores before the
            softmax. The ALiBi types of NVIDIA TE are not implemented (NotImplementedError).
        core_attention_bias : torch.Tensor, optional
            The bias, broadcastable to ``[batch, heads, seq_q, seq_kv]``.
        alibi_slopes : torch.Tensor, optional
            Not implemented; must be ``None``.
        fast_zero_fill : bool, default True
            Accepted for compatibility; outputs at padded query positions are always zero.
        inference_params : InferenceParams, optional
            A KV cache for incremental decoding: the call's keys and values are appended to this
            layer's cache (keyed by ``layer_number``) and attention runs over all cached tokens.
            Supported with ``'sbhd'`` and ``'bshd'``.

        Returns
        -------
        torch.Tensor
            The attention output with the heads flattened into the last dimension.
        """
        qkv_format = masks.check_qkv_format(_OP, qkv_format or self.qkv_format)
        mask_type = self.attn_mask_type if attn_mask_type is None else masks.canonical_mask_type(_OP, attn_mask_type)
        window = masks.canonical_window(_OP, self.window_size if window_size is None else window_size,
                                        mask_type)
        if alibi_slopes is not None or core_attention_bias_type not in _BIAS_TYPES:
            raise NotImplementedError(f"{_OP}: core_attention_bias_type {core_attention_bias_type!r} / "
                                      f"alibi_slopes: only {', '.join(_BIAS_TYPES)} are implemented")
        if cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None:
            raise NotImplementedError(f"{_OP}: cu_seqlens_*_padded (thd with gaps between "
                                      "sequences) is not implemented")
        q, k, v = query_layer, key_layer, value_layer
        geometry = None
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
            geometry = (qkv_format, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                        q.device, k.device, v.device)
        if geometry is None or geometry not in self._checked:
            self._check_qkv(q, k, v, qkv_format)
            if len(self._checked) >= 64:
                self._checked.clear()
            self._checked.add(geometry)
        out_format = qkv_format
        if self._context_parallel():
            sdim = 1 if qkv_format == "bshd" else 0
            check_context_parallel(mask_type, qkv_format, self.attention_dropout if self.training else 0.0,
                                   core_attention_bias_type != "no_bias", window, q.shape[sdim],
                                   torch.distributed.get_world_size(self.cp_group))
            if inference_params is not None or attention_mask is not None or cu_seqlens_q is not None:
                raise ValueError(f"{_OP}: context parallelism takes no KV cache, attention_mask or cu_seqlens")
            out = context_parallel_attention(
                q, k, v, qkv_format=qkv_format, mask_type=mask_type, softmax_scale=self.softmax_scale,
                cp_group=self.cp_group, cp_global_ranks=self.cp_global_ranks,
                dropout_p=self.attention_dropout if self.training else 0.0,
                has_bias=core_attention_bias_type != "no_bias", window_size=window)
            return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])
        if inference_params is not None:
            q, k, v, qkv_format, mask_type = self._use_kv_cache(inference_params, q, k, v, qkv_format, mask_type)
        bias = None
        if core_attention_bias_type == "post_scale_bias":
            if core_attention_bias is None:
                raise ValueError(f"{_OP}: core_attention_bias_type 'post_scale_bias' needs core_attention_bias")
            bias = core_attention_bias
        lq, lk, cu_q, cu_kv = self._lengths(q, k, qkv_format, mask_type, attention_mask,
                                            cu_seqlens_q, cu_seqlens_kv)
        if qkv_format == "thd":
            max_seqlen_q = int(masks.seqlens_from_cu(cu_q).max()) if max_seqlen_q is None else int(max_seqlen_q)
            max_seqlen_kv = int(masks.seqlens_from_cu(cu_kv).max()) if max_seqlen_kv is None else int(max_seqlen_kv)
        arbitrary = None
        if mask_type == "arbitrary":
            b = q.shape[0] if qkv_format == "bshd" else q.shape[1]
            sq, sk = (q.shape[1], k.shape[1]) if qkv_format == "bshd" else (q.shape[0], k.shape[0])
            if qkv_format == "thd":
                raise ValueError(f"{_OP}: attn_mask_type 'arbitrary' takes a dense mask; use bshd or sbhd")
            arbitrary = self._arbitrary_mask(attention_mask, b, sq, sk)
        dropout_p = self.attention_dropout if self.training else 0.0
        env_state = env.attention_env()   # every attention variable, read once per call
        deterministic = not env_state.allow_nondeterministic
        if inference_params is not None:   # q/k/v are the cache's now
            geometry = (qkv_format, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                        q.device, k.device, v.device)
        key = (geometry, mask_type, window, dropout_p, bias is not None, deterministic,
               None if cu_q is None else cu_q.numel(), max_seqlen_q, max_seqlen_kv)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = attn_ops.AttentionConfig.from_tensors(
                q, k, v, qkv_format=qkv_format, mask_type=mask_type, window_size=window,
                dropout_p=dropout_p, has_bias=bias is not None, deterministic=deterministic,
                cu_seqlens_q=cu_q, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
            if len(self._configs) >= 64:
                self._configs.clear()
            self._configs[key] = cfg
        report = get_attention_backend(cfg, env_state)
        # straight into the instance dict: nn.Module.__setattr__'s parameter/submodule/buffer
        # bookkeeping (a report is none of them) costs more than the cached backend lookup
        self.__dict__["last_backend_report"] = report
        rng_context = self._rng_context() if dropout_p > 0.0 else None

        def core(q_, k_, v_):
            if report.chosen == "unfused":
                return unfused_attention(
                    q_, k_, v_, qkv_format=qkv_format, mask_type=mask_type, window=window,
                    softmax_scale=self.softmax_scale, dropout_p=dropout_p, training=self.training,
                    cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=max_seqlen_q,
                    max_seqlen_kv=max_seqlen_kv, seqlens_q=lq, seqlens_kv=lk,
                    arbitrary_mask=arbitrary, bias=bias, rng_context=rng_context)
            if report.chosen == "sdpa":
                return sdpa_attention(
                    q_, k_, v_, qkv_format=qkv_format, mask_type=mask_type, window=window,
                    softmax_scale=self.softmax_scale, dropout_p=dropout_p, seqlens_q=lq,
                    seqlens_kv=lk, arbitrary_mask=arbitrary, rng_context=rng_context)
            # strided q/k/v (e.g. views of a packed projection) go in as they are: the op copies
            # only what its backend cannot read in place
            return attn_ops.FusedAttention.apply(
                q_, k_, v_, report.chosen, qkv_format,
                mask_type, window, self.softmax_scale, dropout_p, cu_q, cu_kv, max_seqlen_q,
                max_seqlen_kv, cfg.deterministic)

        if checkpoint_core_attention and torch.is_grad_enabled():
            out = torch.utils.checkpoint.checkpoint(core, q, k, v, use_reentrant=False)
        else:
            out = core(q, k, v)
        if inference_params is not None and out_format == "sbhd":
            out = out.transpose(0, 1)
        return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])

    def _use_kv_cache(self, inference_params, q, k, v, qkv_format, mask_type):
        """Append this step's k/v to the layer's cache and attend over the whole cache (bshd).
        The causal diagonal is anchored bottom-right: new query i sits at position offset + i."""
        if qkv_format == "thd":
            raise NotImplementedError(f"{_OP}: inference_params with qkv_format 'thd' is not implemented")
        if self.layer_number is None:
            raise ValueError(f"{_OP}: inference_params needs layer_number (the cache key of this layer)")
        if qkv_format == "sbhd":
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        k, v = inference_params.update_and_read(self.layer_number, k, v)
        mask_type = {"causal": "causal_bottom_right",
                     "padding_causal": "padding_causal_bottom_right"}.get(mask_type, mask_type)
        return q, k, v, "bshd", mask_type


def set_context_parallel_group_of(module: torch.nn.Module, cp_group, cp_global_ranks=None, cp_stream=None,
                                  cp_comm_type: str = "p2p") -> None:
    """Give every DotProductAttention inside `module` the context-parallel group (what
    MultiheadAttention.set_context_parallel_group and TransformerLayer's do)."""
    for m in module.modules():
        if isinstance(m, DotProductAttention):
            m.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)
