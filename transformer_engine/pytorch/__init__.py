"""PyTorch frontend of Transformer Engine."""
import torch  # noqa: F401  (the frontend needs torch; fail here with torch's own message)

from .. import __version__  # noqa: F401
from ..common import recipe  # noqa: F401
from . import kernels  # noqa: F401
from .native import capability, fp8_dtype  # noqa: F401
from .distributed import CudaRNGStatesTracker  # noqa: F401
from .quantization import (  # noqa: F401
    FP8GlobalStateManager, autocast, fp8_autocast, fp8_model_init, get_default_recipe,
    is_fp8_available, is_fp8_block_scaling_available, is_mxfp8_available, is_nvfp4_available,
    quantized_model_init)
from .device_info import get_device_compute_capability, is_bf16_available  # noqa: F401
from .constants import DType  # noqa: F401
from .tensor import (  # noqa: F401
    Float8BlockwiseQTensor, Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor,
    MXFP8Quantizer, MXFP8Tensor, QuantizedTensor, Quantizer)
from . import constants, cpp_extensions, float8_tensor, fp8, tensor, utils  # noqa: F401  (NV TE's module paths)
from .module import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm  # noqa: F401
from .attention import (  # noqa: F401
    DotProductAttention, InferenceParams, MultiheadAttention, RotaryPositionEmbedding,
    apply_rotary_pos_emb)
from .transformer import TransformerLayer  # noqa: F401
from .checkpoint import checkpoint  # noqa: F401
from .module import Fp8Padding, Fp8Unpadding, GroupedLinear  # noqa: F401
from .graph import make_graphed_callables  # noqa: F401
from . import ops  # noqa: F401,E402  (NV TE 2.x's fusible-operations API)
