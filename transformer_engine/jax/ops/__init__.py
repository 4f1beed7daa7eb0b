from .cast import cast_transpose, dequantize, fp8_dtype, quantize, transpose  # noqa: F401
from .scaling import delayed_scaling_update  # noqa: F401
from .gemm import general_gemm  # noqa: F401
