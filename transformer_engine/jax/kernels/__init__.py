from .cast import cast_transpose, dequantize, fp8_dtype, quantize, transpose  # noqa: F401
from .scaling import delayed_scaling_update  # noqa: F401
from .gemm import general_gemm  # noqa: F401
from .activation import activation_backward, activation_forward, dbias_dactivation  # noqa: F401
from .rope import rope_backward, rope_forward  # noqa: F401
from .normalization import layernorm_bwd, layernorm_fwd, layernorm_fwd_fp8, rmsnorm_bwd, rmsnorm_fwd, rmsnorm_fwd_fp8  # noqa: F401,E501
from .softmax import scaled_masked_softmax_backward, scaled_masked_softmax_forward, scaled_softmax_backward, scaled_softmax_forward, scaled_upper_triang_masked_softmax_backward, scaled_upper_triang_masked_softmax_forward  # noqa: F401,E501
