"""Quantized tensor types and the quantizers that make them (NVIDIA TE's
transformer_engine.pytorch.tensor)."""
from .quantized_tensor import QuantizedTensor  # noqa: F401
from .float8_tensor import Float8Tensor  # noqa: F401
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Quantizer  # noqa: F401
from .float8_blockwise_tensor import Float8BlockwiseQTensor  # noqa: F401
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor  # noqa: F401

__all__ = ["QuantizedTensor", "Float8Tensor", "Float8BlockwiseQTensor", "Quantizer", "Float8Quantizer",
           "Float8CurrentScalingQuantizer", "MXFP8Quantizer", "MXFP8Tensor"]
