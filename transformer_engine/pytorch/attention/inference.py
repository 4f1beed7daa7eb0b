"""KV cache for incremental decoding (the non-paged cache of NVIDIA TE's InferenceParams).

Usage: make one InferenceParams for the model, pass it to every layer's forward; each attention
layer (keyed by its layer_number) writes the new keys/values at positions
[sequence_len_offset, sequence_len_offset + s) of its cache and attends over everything cached so
far. After the whole model has run a step, advance the offset:
`inference_params.sequence_len_offset += s` (or `inference_params.step(s)`).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch


class InferenceParams:
    """Decoding state for incremental generation: capacity, current position and the KV caches.

    Pass it as ``inference_params`` to :class:`DotProductAttention`, :class:`MultiheadAttention`
    or :class:`TransformerLayer` (each with its own ``layer_number``): each call appends its keys
    and values to the layer's cache at the current position and attends over everything cached.
    Call :meth:`step` after each model step. The caches are ``[max_batch_size,
    max_sequence_length, heads, dim]``, allocated on first use. Works on every backend.

    Parameters
    ----------
    max_batch_size : int
        Most sequences decoded at once.
    max_sequence_length : int
        Most tokens per sequence (prompt plus generated).
    num_heads_kv : int, optional
        Key/value heads per layer (taken from the first keys when omitted).
    head_dim_k : int, optional
        Key head size (taken from the first keys when omitted).
    dtype : torch.dtype, optional
        dtype of the caches (default: the keys' dtype).
    head_dim_v : int, optional
        Value head size (taken from the first values when omitted).
    is_paged : bool, default False
        A paged KV cache is not implemented: True raises NotImplementedError.
    **unused
        Other keyword arguments of NVIDIA TE's InferenceParams (paged-cache settings) are
        accepted and ignored.
    """

    def __init__(self, max_batch_size: int, max_sequence_length: int,
                 num_heads_kv: Optional[int] = None, head_dim_k: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None, head_dim_v: Optional[int] = None,
                 is_paged: bool = False, **unused):
        if is_paged:
            raise NotImplementedError("InferenceParams: is_paged=True (a paged KV cache) is not "
                                      "implemented; use the contiguous cache (is_paged=False)")
        if max_batch_size < 1 or max_sequence_length < 1:
            raise ValueError(f"InferenceParams: max_batch_size {max_batch_size} and "
                             f"max_sequence_length {max_sequence_length} must be >= 1")
        self.max_batch_size = int(max_batch_size)
        self.max_sequence_length = int(max_sequence_length)
        self.num_heads_kv, self.head_dim_k, self.head_dim_v = num_heads_kv, head_dim_k, head_dim_v
        self.dtype = dtype
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        self.key_value_memory_dict: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, num_tokens: int) -> None:
        """Advance the write position after a whole-model step.

        Parameters
        ----------
        num_tokens : int
            Number of new tokens per sequence in the step just run.
        """
        self.sequence_len_offset += int(num_tokens)

    def reset(self) -> None:
        """Rewind to an empty cache: the write position and batch offset go back to 0."""
        self.sequence_len_offset = 0
        self.batch_size_offset = 0

    def swap_key_value_dict(self, batch_indices) -> None:
        """Reorder the cached sequences, e.g. after a beam-search step.

        Parameters
        ----------
        batch_indices : sequence of int or torch.Tensor
            Slot ``i`` of every cache takes the sequence that was in slot ``batch_indices[i]``.
        """
        for layer, (k, v) in self.key_value_memory_dict.items():
            idx = torch.as_tensor(batch_indices, device=k.device, dtype=torch.long)
            self.key_value_memory_dict[layer] = (k[idx].contiguous(), v[idx].contiguous())

    def _cache_for(self, layer_number: int, k: torch.Tensor, v: torch.Tensor, batch: int):
        cache = self.key_value_memory_dict.get(layer_number)
        if cache is None:
            dtype = self.dtype or k.dtype
            shape_k = (self.max_batch_size, self.max_sequence_length, k.shape[-2], k.shape[-1])
            shape_v = (self.max_batch_size, self.max_sequence_length, v.shape[-2], v.shape[-1])
            cache = (torch.zeros(shape_k, dtype=dtype, device=k.device),
                     torch.zeros(shape_v, dtype=dtype, device=v.device))
            self.key_value_memory_dict[layer_number] = cache
        return cache

    def update_and_read(self, layer_number: int, k_bshd: torch.Tensor, v_bshd: torch.Tensor):
        """Write a step's keys and values into a layer's cache and return all cached ones.

        Parameters
        ----------
        layer_number : int
            The layer whose cache is used.
        k_bshd : torch.Tensor
            This step's keys ``[batch, seq, heads, dim]``.
        v_bshd : torch.Tensor
            This step's values ``[batch, seq, heads, dim]``.

        Returns
        -------
        tuple of torch.Tensor
            The cached keys and values of positions ``[0, offset + seq)``.
        """
        op = "InferenceParams"
        b, s = k_bshd.shape[0], k_bshd.shape[1]
        start, end = self.sequence_len_offset, self.sequence_len_offset + s
        b0, b1 = self.batch_size_offset, self.batch_size_offset + b
        if end > self.max_sequence_length or b1 > self.max_batch_size:
            raise ValueError(f"{op}: step of {s} tokens at offset {start} for batch slots "
                             f"[{b0}, {b1}) exceeds the cache ({self.max_batch_size} sequences of "
                             f"{self.max_sequence_length} tokens)")
        k_cache, v_cache = self._cache_for(layer_number, k_bshd, v_bshd, b)
        if k_cache.shape[2:] != k_bshd.shape[2:] or v_cache.shape[2:] != v_bshd.shape[2:]:
            raise ValueError(f"{op}: layer {layer_number} caches heads/dims {tuple(k_cache.shape[2:])}, "
                             f"got keys of {tuple(k_bshd.shape[2:])}; give each layer its own layer_number")
        k_cache[b0:b1, start:end] = k_bshd.detach().to(k_cache.dtype)
        v_cache[b0:b1, start:end] = v_bshd.detach().to(v_cache.dtype)
        return k_cache[b0:b1, :end], v_cache[b0:b1, :end]
