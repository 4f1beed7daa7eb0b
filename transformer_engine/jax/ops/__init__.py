from .cast import cast_transpose, dequantize, fp8_dtype, quantize, transpose  # noqa: F401
from .scaling import delayed_scaling_update  # noqa: F401
from .gemm import general_gemm  # noqa: F401
from .activation import activation_backward, activation_forward, dbias_dactivation  # noqa: F401
from .rope import rope_backward, rope_forward  # noqa: F401
