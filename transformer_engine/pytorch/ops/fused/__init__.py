"""Fused operations: adjacent basic operations that run as one group. FUSIONS is tried in
order at each position of an operation list (see fuser.py)."""
from .linear_bias import LinearBias  # noqa: F401
from .linear_bias_gelu import LinearBiasGELU  # noqa: F401
from .norm_linear import NormLinear  # noqa: F401

FUSIONS = (NormLinear, LinearBiasGELU, LinearBias)
