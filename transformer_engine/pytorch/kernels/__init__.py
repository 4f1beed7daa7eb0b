"""Functional ops: native kernels on a supported GPU, plain-torch references elsewhere."""
from .cast import (  # noqa: F401
    cast_transpose, compute_amax, dequantize, dequantize_reference, quantize, quantize_reference,
    transpose)
from .cast_fused import act_cast_transpose, cast_transpose_dbias, dact_dbias_cast_transpose  # noqa: F401
from .scaling import delayed_scaling_update, delayed_scaling_update_reference  # noqa: F401
from .gemm import GemmOutput, gemm_reference, general_gemm  # noqa: F401
from .activation import activation_backward, activation_forward, apply_activation, dbias, dbias_dactivation, dbias_reference  # noqa: F401,E501
from .rope import apply_rotary_pos_emb, rope_backward, rope_forward, rope_reference  # noqa: F401
from .normalization import NormOutput, layernorm, layernorm_bwd, layernorm_fwd, rmsnorm, rmsnorm_bwd, rmsnorm_fwd  # noqa: F401,E501
from .softmax import scaled_masked_softmax, scaled_masked_softmax_backward, scaled_masked_softmax_forward, scaled_softmax, scaled_softmax_backward, scaled_softmax_forward, scaled_upper_triang_masked_softmax, scaled_upper_triang_masked_softmax_backward, scaled_upper_triang_masked_softmax_forward  # noqa: F401,E501
from .attention import AttentionConfig, FusedAttention, attention_reference, fused_attention_backward, fused_attention_forward, native_attention_support  # noqa: F401,E501
