"""NVIDIA Transformer Engine's older module path for the FP8 tensor type and its quantizers."""
from .tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor  # noqa: F401

__all__ = ["Float8Tensor", "Float8Quantizer", "Float8CurrentScalingQuantizer"]
