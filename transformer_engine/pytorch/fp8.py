"""NVIDIA Transformer Engine's older module path for the FP8 autocast API (the names now live
in transformer_engine.pytorch.quantization); re-exports of this library's implementation."""
from ..common.recipe import (  # noqa: F401
    DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format, MXFP8BlockScaling,
    NVFP4BlockScaling, Recipe)
from .quantization import (  # noqa: F401
    FP8GlobalStateManager, autocast, check_fp8_block_scaling_support, check_fp8_support,
    check_mxfp8_support, check_nvfp4_support, check_recipe_support, fp8_autocast, fp8_model_init,
    get_default_fp8_recipe, is_fp8_available, quantized_model_init)
from .quantization import get_fp8_max, get_fp8_torch_dtype  # noqa: F401
