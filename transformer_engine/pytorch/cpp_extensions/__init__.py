"""NVIDIA Transformer Engine's cpp_extensions entry points, on this library's kernels."""
from .gemm import general_gemm  # noqa: F401

__all__ = ["general_gemm"]
