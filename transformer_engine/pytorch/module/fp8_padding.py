"""te.Fp8Padding / te.Fp8Unpadding: pad each row block of a grouped input to a multiple of the
FP8 GEMM alignment (16 rows) with zero rows, and drop those rows again after the GEMMs.

    Fp8Padding(num_gemms)(inp, m_splits)   -> (padded, padded_m_splits)
    Fp8Unpadding(num_gemms)(out, m_splits) -> out without the padding rows (m_splits: the
                                              original, unpadded sizes)

Zero rows add nothing to GroupedLinear's weight gradients and their outputs are dropped, so
padding changes no result. Both are differentiable (plain tensor ops: one copy each way).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

_DEFAULT_ALIGN = 16  # rows: every FP8 GEMM dimension is a multiple of 16


def _aligned_splits(who: str, m_splits: Sequence[int], num_gemms: int, align: int) -> List[int]:
    splits = [int(m) for m in m_splits]
    if len(splits) != num_gemms:
        raise ValueError(f"{who}.forward: m_splits has {len(splits)} entries; expected "
                         f"num_gemms={num_gemms}")
    if any(m < 0 for m in splits):
        raise ValueError(f"{who}.forward: m_splits {splits} has a negative entry")
    return [(m + align - 1) // align * align for m in splits]


def _check_init(who: str, num_gemms, align_size):
    if not isinstance(num_gemms, int) or num_gemms < 1:
        raise ValueError(f"{who}: num_gemms is {num_gemms!r}; expected a positive int")
    if align_size is not None and (not isinstance(align_size, int) or align_size < 1):
        raise ValueError(f"{who}: align_size is {align_size!r}; expected a positive int or None")


def _row_index(splits: List[int], padded: List[int], device) -> torch.Tensor:
    """Row of the padded tensor that each unpadded row maps to."""
    idx, start = [], 0
    for m, p in zip(splits, padded):
        idx.extend(range(start, start + m))
        start += p
    return torch.tensor(idx, dtype=torch.long, device=device)


class Fp8Padding(torch.nn.Module):
    """Pads each of ``num_gemms`` consecutive row blocks of an input with zero rows up to a
    multiple of ``align_size`` rows, as :class:`GroupedLinear` needs under FP8.
    :class:`Fp8Unpadding` removes the padding rows from the output afterwards. The zero rows add
    nothing to the weight gradients and their outputs are dropped, so padding changes no result.
    Differentiable.

    Parameters
    ----------
    num_gemms : int
        Number of row blocks; >= 1.
    align_size : int, optional
        The row alignment; default 16 (what FP8 GEMMs need).
    """

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        _check_init("Fp8Padding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int]):
        """Pads the row blocks of ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            The input; its first dimension holds the blocks' rows one after another.
        m_splits : sequence of int
            Rows of each block: ``num_gemms`` non-negative entries adding up to
            ``inp.shape[0]``.

        Returns
        -------
        tuple of (torch.Tensor, list of int)
            The padded tensor (``inp`` itself when no block needs padding) and the padded block
            sizes, to pass to :class:`GroupedLinear`.
        """
        align = self.align_size or _DEFAULT_ALIGN
        splits = [int(m) for m in m_splits]
        padded = _aligned_splits("Fp8Padding", splits, self.num_gemms, align)
        rows = inp.shape[0] if inp.dim() else 0
        if sum(splits) != rows:
            raise ValueError(f"Fp8Padding.forward: m_splits {splits} add up to {sum(splits)}; "
                             f"expected the input's {rows} rows (dim 0)")
        if padded == splits:
            return inp, padded
        out = inp.new_zeros((sum(padded),) + tuple(inp.shape[1:]))
        out = out.index_copy(0, _row_index(splits, padded, inp.device), inp)
        return out, padded


class Fp8Unpadding(torch.nn.Module):
    """Removes the rows that :class:`Fp8Padding` added.

    Parameters
    ----------
    num_gemms : int
        Number of row blocks; >= 1.
    align_size : int, optional
        The row alignment the padding used; default 16.
    """

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        _check_init("Fp8Unpadding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int]) -> torch.Tensor:
        """Drops the padding rows of ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            A padded tensor: the first dimension holds the padded blocks one after another.
        m_splits : sequence of int
            The original, unpadded block sizes (those given to :class:`Fp8Padding`).

        Returns
        -------
        torch.Tensor
            ``inp`` without the padding rows (``inp`` itself when there were none).
        """
        align = self.align_size or _DEFAULT_ALIGN
        splits = [int(m) for m in m_splits]
        padded = _aligned_splits("Fp8Unpadding", splits, self.num_gemms, align)
        rows = inp.shape[0] if inp.dim() else 0
        if sum(padded) != rows:
            raise ValueError(f"Fp8Unpadding.forward: the padded m_splits {padded} add up to "
                             f"{sum(padded)}; expected the input's {rows} rows (dim 0)")
        if padded == splits:
            return inp
        return inp.index_select(0, _row_index(splits, padded, inp.device))
