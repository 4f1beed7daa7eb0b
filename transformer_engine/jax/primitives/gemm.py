"""General GEMM with FP8 scale_inv and the bias / GELU epilogues: an XLA FFI custom call over
nvte_gemm on the GPU, the jnp reference (transformer_engine.jax.kernels.general_gemm, same
signature and semantics) elsewhere.

The custom call serves the epilogue combinations nvte_gemm has (none, bias, gelu, bias+gelu,
dgelu, dgelu+bias grad) without accumulation; other requests (accumulate_into, a bias gradient
without dgelu, FP8 operands in a layout other than TN, which Hopper's cuBLASLt refuses) run the
jnp reference, on whatever device the arrays are."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import kernels
from ..kernels.gemm import GemmOutput, _is_fp8
from .registry import empty, f32, ffi, i64, native, scalar1, sds, use_custom_call

_F32 = jnp.float32
_EPILOGUE = {(False, False, False, False): 0, (True, False, False, False): 1,
             (False, True, False, False): 2, (True, True, False, False): 3,
             (False, False, True, False): 4, (False, False, True, True): 5}


def _rows_cols(x):
    if x.ndim == 0:
        return 1, 1
    return math.prod(x.shape[:-1]), x.shape[-1]


def _native_epilogue(bias, gelu, gelu_input, bias_grad, accumulate_into, fp8_in, layout):
    if accumulate_into is not None or (fp8_in and layout != "TN"):
        return None
    return _EPILOGUE.get((bias is not None, bool(gelu), gelu_input is not None, bool(bias_grad)))


def general_gemm(A, B, out_dtype=None, *, layout="TN", A_scale_inv=None, B_scale_inv=None,
                 bias=None, gelu=False, gelu_input=None, bias_grad=False, accumulate_into=None,
                 alpha=1.0, out_scale=None) -> GemmOutput:
    """out = op_b(B) @ op_a(A) (+ epilogue), see transformer_engine.jax.kernels.gemm."""
    kwargs = dict(layout=layout, A_scale_inv=A_scale_inv, B_scale_inv=B_scale_inv, bias=bias,
                  gelu=gelu, gelu_input=gelu_input, bias_grad=bias_grad,
                  accumulate_into=accumulate_into, alpha=alpha, out_scale=out_scale)
    fp8_in = _is_fp8(A.dtype)
    epilogue = _native_epilogue(bias, gelu, gelu_input, bias_grad, accumulate_into, fp8_in, layout)
    if epilogue is None or not use_custom_call("gemm"):
        return kernels.general_gemm(A, B, out_dtype, **kwargs)
    # The reference validates everything (layout, dtypes, FP8 sizes) and yields the output
    # shapes without computing anything when traced abstractly; its checks raise here too.
    ref = jax.eval_shape(lambda a, b: kernels.general_gemm(a, b, out_dtype, **kwargs), A, B)
    out_dtype = ref.out.dtype
    transa, transb = layout[0] == "T", layout[1] == "T"
    fp8_out = _is_fp8(out_dtype)
    side = jnp.bfloat16 if fp8_out else out_dtype     # bias dtype
    aux_dtype = jnp.float16 if fp8_out else out_dtype  # gelu input dtype
    m = ref.out.shape[-1] if ref.out.ndim else 1
    results = (sds(ref.out.shape, out_dtype),
               sds((m,) if bias_grad else (0,), side),
               sds(ref.out.shape if gelu else (0,), aux_dtype),
               sds((1,), _F32), sds((1,), _F32),
               sds((int(native().gemm_workspace_size()),), jnp.uint8))
    call = ffi("te_gemm_ffi", results, aliases={7: 4})
    out, dbias, pre, _, amax, _ = call(
        A, B,
        scalar1(A_scale_inv) if fp8_in else empty(),
        scalar1(B_scale_inv) if fp8_in else empty(),
        bias.astype(side) if bias is not None else empty(side),
        gelu_input.astype(aux_dtype) if gelu_input is not None else empty(aux_dtype),
        scalar1(out_scale) if fp8_out else empty(),
        jnp.zeros((1,), _F32),
        transa=i64(transa), transb=i64(transb), epilogue=i64(epilogue), alpha=f32(alpha),
        use_fast_accum=i64(fp8_in))
    return GemmOutput(out, dbias if bias_grad else None, pre if gelu else None,
                      amax if fp8_out else None)
