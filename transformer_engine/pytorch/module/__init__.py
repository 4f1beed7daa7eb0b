"""Transformer Engine's PyTorch modules."""
from .base import TransformerEngineBaseModule  # noqa: F401
from .linear import Linear  # noqa: F401
from .layernorm import LayerNorm  # noqa: F401
from .rmsnorm import RMSNorm  # noqa: F401
from .layernorm_linear import LayerNormLinear  # noqa: F401
from .layernorm_mlp import LayerNormMLP  # noqa: F401
from .grouped_linear import GroupedLinear, is_module_grouped_tensor_path_supported  # noqa: F401
from .fp8_padding import Fp8Padding, Fp8Unpadding  # noqa: F401
