"""QuantizedTensor: the base class of tensors stored in a low-precision format plus the scaling
data needed to read them back (Float8Tensor is the one this library makes).

Its dtype is the nominal (high-precision) dtype; `dequantize()` gives the value. Python
attributes set on such a tensor (a Parameter's `sequence_parallel`, `tensor_model_parallel`,
`main_grad`, ...) are carried over to the tensors that detach, alias, clone and `.to()` make,
so they survive `module.apply`, `.to()` and `.cuda()`.
"""
from __future__ import annotations

from typing import Optional

import torch

# Attributes a quantized tensor keeps about its own storage: never copied as user attributes.
_STORAGE_ATTRS = frozenset({"_data", "_scale_inv", "_transpose_cache", "_quantizer", "_is_param",
                            "_columnwise", "_pow2_scales"})


class QuantizedTensor(torch.Tensor):
    """Base class of quantized tensors (:class:`Float8Tensor` is the one this library makes);
    a subclass defines the storage, :meth:`dequantize`, :meth:`quantize_` and how torch
    operations see it."""

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The value in high precision.

        Parameters
        ----------
        dtype : torch.dtype, optional
            The result's dtype; default the tensor's nominal dtype.

        Returns
        -------
        torch.Tensor
        """
        raise NotImplementedError(f"{type(self).__name__}.dequantize is not implemented")

    def quantize_(self, tensor: torch.Tensor) -> "QuantizedTensor":
        """Overwrites the value with ``tensor``, quantized in this tensor's format.

        Parameters
        ----------
        tensor : torch.Tensor
            The new value, of this tensor's shape.

        Returns
        -------
        QuantizedTensor
            This tensor.
        """
        raise NotImplementedError(f"{type(self).__name__}.quantize_ is not implemented")


def copy_user_attributes(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Python attributes of src (not its storage) onto dst; returns dst."""
    for k, v in getattr(src, "__dict__", {}).items():
        if k not in _STORAGE_ATTRS and k not in dst.__dict__:
            dst.__dict__[k] = v
    return dst
