"""Fusible operations, NVIDIA Transformer Engine 2.x's operation-based API
(``te.ops.Sequential``, ``te.ops.Linear``, ...), running on this library's kernels.

Build a model from basic operations in a :class:`Sequential`; adjacent operations that have a
fused implementation (a GEMM with its bias, a norm with the GEMM after it) run as one step.
"""
from .basic import *  # noqa: F401,F403
from .linear import Linear  # noqa: F401
from .op import BasicOperation, FusedOperation, FusibleOperation  # noqa: F401
from .sequential import Sequential  # noqa: F401
from .registration import (  # noqa: F401
    register_backward_fusion, register_forward_backward_fusion, register_forward_fusion)
from . import fused  # noqa: F401
