"""Rotary position embedding: the module that makes the angle table, and the differentiable apply
(the fused kernel of kernels/rope.py on a supported GPU, its reference elsewhere)."""
from __future__ import annotations

from typing import Optional

import torch

from ..kernels import rope as _rope_kernels


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         interleaved: bool = False, fused: bool = True,
                         cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1,
                         cp_rank: int = 0) -> torch.Tensor:
    """NVIDIA TE's apply_rotary_pos_emb (kernels.rope.apply_rotary_pos_emb does the work).
    cp_size / cp_rank (context parallelism) are accepted at 1 / 0 only: this library has no
    context parallelism."""
    if cp_size != 1 or cp_rank != 0:
        raise NotImplementedError(f"apply_rotary_pos_emb: cp_size={cp_size}, cp_rank={cp_rank}: context "
                                  "parallelism is not implemented; expected cp_size=1, cp_rank=0")
    return _rope_kernels.apply_rotary_pos_emb(t, freqs, tensor_format, interleaved, fused, cu_seqlens)


class RotaryPositionEmbedding(torch.nn.Module):
    """The angle table of rotary position embeddings (RoPE).

    ``forward(max_seq_len)`` returns float32 angles ``[max_seq_len, 1, 1, R]`` for
    :func:`apply_rotary_pos_emb` and the ``rotary_pos_emb`` argument of the attention layers, where
    ``R = dim * rotary_percent`` rounded down to an even number and the inverse frequencies are
    ``rotary_base ** (-2 i / R)``.

    Parameters
    ----------
    dim : int
        The head dimension the embedding applies to.
    rotary_percent : float, default 1.0
        Share of the head dimension that is rotated, in (0, 1]; the rest passes through.
    seq_len_interpolation_factor : float, optional
        Divide positions by this factor (position interpolation for longer contexts).
    pretrained_max_position_embeddings : int, optional
        With ``seq_len_interpolation_factor``: the context length of pretraining; sequences longer
        than it divided by the factor are stretched to fit instead.
    rotary_base : float, default 10000.0
        Base of the inverse frequencies.
    interleaved : bool, default False
        Produce the angle layout of interleaved (GPT-J style) rotation instead of rotate-half.
    """

    def __init__(self, dim: int, rotary_percent: float = 1.0,
                 seq_len_interpolation_factor: Optional[float] = None,
                 pretrained_max_position_embeddings: Optional[int] = None,
                 rotary_base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        if not 0.0 < rotary_percent <= 1.0:
            raise ValueError(f"RotaryPositionEmbedding: rotary_percent is {rotary_percent}; expected (0, 1]")
        rot = int(dim * rotary_percent) // 2 * 2
        if rot < 2:
            raise ValueError(f"RotaryPositionEmbedding: dim {dim} x rotary_percent {rotary_percent} "
                             "leaves fewer than 2 rotary channels")
        self.rotary_dim = rot
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.interleaved = interleaved
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """The angles of positions ``offset`` to ``offset + max_seq_len - 1``.

        Parameters
        ----------
        max_seq_len : int
            Number of positions.
        offset : int, default 0
            First position (e.g. the decoding position with a KV cache).

        Returns
        -------
        torch.Tensor
            float32 ``[max_seq_len, 1, 1, R]``.
        """
        pos = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        if (self.pretrained_max_position_embeddings is not None
                and self.seq_len_interpolation_factor is not None
                and max_seq_len > self.pretrained_max_position_embeddings / self.seq_len_interpolation_factor):
            # the sequence outgrows the interpolated range: stretch to cover it
            factor = max_seq_len / self.pretrained_max_position_embeddings
        else:
            factor = self.seq_len_interpolation_factor
        if factor is not None:
            pos = pos / factor
        angles = torch.outer(pos, self.inv_freq.float())                     # [s, R/2]
        if self.interleaved:
            table = angles.repeat_interleave(2, dim=-1)
        else:
            table = torch.cat((angles, angles), dim=-1)
        return table.view(max_seq_len, 1, 1, self.rotary_dim)
