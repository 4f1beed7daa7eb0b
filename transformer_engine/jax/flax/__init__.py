"""Flax modules of Transformer Engine's JAX frontend (argument names of NVIDIA TE's API)."""
from .module import DenseGeneral, LayerNorm, LayerNormDenseGeneral, LayerNormMLP  # noqa: F401
from .transformer import (  # noqa: F401
    DotProductAttention, MultiHeadAttention, RelativePositionBiases, TransformerLayer,
    TransformerLayerType)
from ..sharding import extend_logical_axis_rules  # noqa: F401
