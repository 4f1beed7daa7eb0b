"""Utilities of NVIDIA TE's transformer_engine.pytorch.tensor.utils over this library's quantized
tensors."""
from __future__ import annotations

import torch

from .quantized_tensor import QuantizedTensor


def replace_raw_data(tensor: QuantizedTensor, new_raw_data: torch.Tensor) -> None:
    """Moves a quantized tensor's raw data into `new_raw_data` (e.g. a view of one flat buffer
    holding many parameters): the bytes are copied, then the tensor reads from the new buffer.
    Its value and every other attribute stay as they were."""
    if not isinstance(tensor, QuantizedTensor):
        raise TypeError(f"replace_raw_data: tensor must be a QuantizedTensor, got {type(tensor).__name__}")
    old = tensor._data
    if new_raw_data.shape != old.shape or new_raw_data.element_size() != old.element_size():
        raise ValueError(f"replace_raw_data: new_raw_data has shape {tuple(new_raw_data.shape)} and "
                         f"{new_raw_data.element_size()}-byte elements; expected {tuple(old.shape)} "
                         f"with {old.element_size()}-byte elements")
    if new_raw_data.device != old.device:
        raise ValueError(f"replace_raw_data: new_raw_data is on {new_raw_data.device}; expected {old.device}")
    new = new_raw_data if new_raw_data.dtype == old.dtype else new_raw_data.view(old.dtype)
    new.detach().copy_(old)
    tensor._data = new
