"""The basic operations: one step each, owning their parameters and FP8 state."""
from .activation import (  # noqa: F401
    GEGLU, GELU, GLU, QGEGLU, QGELU, ClampedSwiGLU, ReGLU, ReLU, SiLU, SReGLU, SReLU, SwiGLU)
from .basic_linear import BasicLinear  # noqa: F401
from .bias import Bias  # noqa: F401
from .collectives import AllGather, AllReduce, ReduceScatter  # noqa: F401
from .extra_tensors import AddExtraInput, MakeExtraOutput  # noqa: F401
from .l2normalization import L2Normalization  # noqa: F401
from .layer_norm import LayerNorm, RMSNorm  # noqa: F401
from .quantize import Quantize  # noqa: F401
from .shape_ops import ConstantScale, Dropout, Identity, Reshape  # noqa: F401
from .unsupported import (  # noqa: F401
    GroupedLinear, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU, SiTUGLU)

__all__ = ["AddExtraInput", "AllGather", "AllReduce", "BasicLinear", "Bias", "ClampedSwiGLU",
           "ConstantScale", "Dropout", "GEGLU", "GELU", "GLU", "GroupedLinear", "Identity",
           "L2Normalization", "LayerNorm", "MakeExtraOutput", "QGEGLU", "QGELU", "Quantize",
           "ReGLU", "ReLU", "ReduceScatter", "Reshape", "RMSNorm", "ScaledClampedQGeGLU",
           "ScaledSiTUGLU", "ScaledSReLU", "ScaledSwiGLU", "SiLU", "SiTUGLU", "SReGLU", "SReLU",
           "SwiGLU"]
