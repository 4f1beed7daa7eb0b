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
    """Pads each of num_gemms row blocks to a multiple of align_size (default 16) rows."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        _check_init("Fp8Padding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int]):
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
    """Removes the rows that Fp8Padding added (m_splits: the unpadded sizes)."""

    def __init__(self, num_gemms: int, align_size: Optional[int] = None) -> None:
        super().__init__()
        _check_init("Fp8Unpadding", num_gemms, align_size)
        self.num_gemms, self.align_size = num_gemms, align_size

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int]) -> torch.Tensor:
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
