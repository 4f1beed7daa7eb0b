"""Quantized tensor types."""
from .float8_tensor import Float8Tensor  # noqa: F401
