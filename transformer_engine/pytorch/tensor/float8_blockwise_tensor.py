"""Float8BlockwiseQTensor: a 2-D weight stored in FP8 with one scale per 128x128 tile, the form
quantized_model_init gives the GEMM weights under the Float8BlockScaling recipe.

It keeps the tile-quantised data twice, row-wise (the forward GEMM's operand, blocks along the
input features) and of the transpose (dgrad's operand, blocks along the output features): both
are quantised from the high-precision value at once, so neither is a re-quantisation of the
other. Everything else (detach, clone, ``.to()``, in-place updates such as an optimizer's, which
re-quantise both) is Float8Tensor's behaviour.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .float8_tensor import Float8Tensor

_TILE_DIM = 2  # kernels/blockwise.py: block_dim 2 = 128x128 tiles


class Float8BlockwiseQTensor(Float8Tensor):
    """A 2-D tensor stored as FP8 data with one float32 inverse scale per 128x128 tile.

    Parameters
    ----------
    data : torch.Tensor
        The FP8 values, ``[rows, cols]``.
    scale_inv : torch.Tensor
        The tiles' inverse scales in the layout of ``kernels.blockwise`` (block_dim 2).
    dtype : torch.dtype
        The nominal (high-precision) dtype.
    requires_grad : bool, default False
        Whether autograd tracks the tensor.
    columnwise : tuple of torch.Tensor, optional
        ``(data, scale_inv)`` of the transpose, quantised in tiles from the same value.
    pow2_scales : bool, default True
        Whether the scales are powers of two (the recipe's ``fp8_quant_fwd_weight``).
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                requires_grad: bool = False, columnwise: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                pow2_scales: bool = True):
        t = Float8Tensor.__new__(cls, data, scale_inv, dtype, requires_grad)
        t._columnwise = columnwise
        t._pow2_scales = bool(pow2_scales)
        return t

    @classmethod
    def quantize_tiles(cls, x: torch.Tensor, fp8_dtype: torch.dtype, dtype: Optional[torch.dtype] = None,
                       pow2_scales: bool = True, requires_grad: bool = False) -> "Float8BlockwiseQTensor":
        """Quantise a 2-D ``x`` in 128x128 tiles, row-wise and transposed.

        Parameters
        ----------
        x : torch.Tensor
            The high-precision 2-D tensor.
        fp8_dtype : torch.dtype
            The FP8 dtype to store.
        dtype : torch.dtype, optional
            The nominal dtype (default ``x.dtype``).
        pow2_scales : bool, default True
            Round each tile's scale down to a power of two.
        requires_grad : bool, default False
            Whether autograd tracks the result.
        """
        if x.dim() != 2:
            raise ValueError("transformer_engine.pytorch.tensor.Float8BlockwiseQTensor: x must be "
                             f"2-D; got shape {tuple(x.shape)}")
        q, q_t = _quantize(x, fp8_dtype, pow2_scales)
        return cls(q.data, q.scale_inv, dtype or x.dtype, requires_grad, (q_t.data, q_t.scale_inv),
                   pow2_scales)

    def blocks(self):
        """``(row-wise, transposed)`` as ``kernels.blockwise.BlockQuantized`` GEMM operands."""
        from ..kernels.blockwise import BlockQuantized
        data_t, sinv_t = self._columnwise
        return (BlockQuantized(self._data, self._scale_inv, _TILE_DIM),
                BlockQuantized(data_t, sinv_t, _TILE_DIM))

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values in high precision (each tile's data times its inverse scale).

        Parameters
        ----------
        dtype : torch.dtype, optional
            The result's dtype (default the nominal dtype).
        """
        from ..kernels.blockwise import dequantize_blockwise
        return dequantize_blockwise(self.blocks()[0], dtype or self.dtype)

    def transpose_fp8(self) -> torch.Tensor:
        """FP8 data of the transpose (quantised in its own tiles: see :meth:`blocks`)."""
        return self._columnwise[0]

    def _map_storage(self, fn, dtype: torch.dtype) -> "Float8BlockwiseQTensor":
        data_t, sinv_t = self._columnwise
        return Float8BlockwiseQTensor(fn(self._data), fn(self._scale_inv), dtype, False,
                                      (fn(data_t), fn(sinv_t)), self._pow2_scales)

    def _copy_storage_from(self, src: "Float8BlockwiseQTensor") -> None:
        self._data.copy_(src._data)
        self._scale_inv.copy_(src._scale_inv)
        for mine, theirs in zip(self._columnwise, src._columnwise):
            mine.copy_(theirs)

    def _requantize_from(self, value: torch.Tensor, amax: Optional[torch.Tensor] = None) -> None:
        # (amax: the per-tensor scale of a shard group; tiles take their scales from their own
        # values, so a shard's tiles need no group-wide amax)
        q, q_t = _quantize(value.to(self.dtype), self._data.dtype, self._pow2_scales)
        self._data.copy_(q.data)
        self._scale_inv.copy_(q.scale_inv)
        self._columnwise[0].copy_(q_t.data)
        self._columnwise[1].copy_(q_t.scale_inv)

    def fsdp_pre_all_gather(self, *args, **kwargs):
        """Not implemented for tile-quantized weights: FSDP2 shards of 128x128 tiles would split
        tiles across ranks. Raises NotImplementedError.

        Parameters
        ----------
        *args
            FSDP2's arguments (mesh, shapes, module, ...), unused.
        **kwargs
            Unused.
        """
        raise NotImplementedError("transformer_engine.pytorch.tensor.Float8BlockwiseQTensor: FSDP2 "
                                  "sharding of tile-quantized weights is not implemented; build the "
                                  "model in high precision or with Float8CurrentScaling weights")

    def __repr__(self, *, tensor_contents=None):
        return (f"Float8BlockwiseQTensor(fp8_dtype={self._data.dtype}, tiles=128x128, "
                f"nominal_dtype={self.dtype}, data={self.dequantize()})")

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self._data, self._scale_inv, self.dtype, self.requires_grad,
                           self._columnwise, self._pow2_scales))


def _quantize(x: torch.Tensor, fp8_dtype: torch.dtype, pow2_scales: bool):
    from ..kernels.blockwise import quantize_blockwise
    return quantize_blockwise(x.detach().contiguous(), fp8_dtype, _TILE_DIM, pow2_scales, True)


def _rebuild(data, scale_inv, dtype, requires_grad, columnwise, pow2_scales):
    return Float8BlockwiseQTensor(data, scale_inv, dtype, requires_grad, columnwise, pow2_scales)
