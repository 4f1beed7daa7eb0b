"""General GEMM in jnp with the semantics of nvte_gemm and the torch op
(transformer_engine.pytorch.kernels.gemm): row-major

    out = op_b(B) @ op_a(A),   op_a(A) = A.T if layout[0] == "T" else A,  op_b likewise,

16-bit operands multiplied in their own dtype and FP8 ones widened (exactly) to bf16, with fp32
accumulation (the products are exact in fp32, so this equals the fp32 product of the upcast
operands up to summation order, and XLA runs it on the GPU's tensor cores: a partitioned step
under a mesh uses this path), FP8 results scaled by both scale_inv after the sum; fp32 operands at full fp32 precision; then the epilogue
(bias, tanh GELU with its input returned, dGELU with the bias gradient), accumulation into a given
buffer, and the cast (FP8 out: saturate(result * out_scale), amax of the unscaled result).
Functional: everything is returned, nothing is updated in place.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ...common import fp8_formats

_GELU_C = math.sqrt(2.0 / math.pi)


class GemmOutput(NamedTuple):
    out: jnp.ndarray
    bias_grad: Optional[jnp.ndarray]
    gelu_input: Optional[jnp.ndarray]
    amax: Optional[jnp.ndarray]  # FP8 out only: max|result| before scaling, shape [1]


def gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3)))


def dgelu_tanh(x):
    t = jnp.tanh(_GELU_C * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)


def _is_fp8(dtype) -> bool:
    return jnp.dtype(dtype).name.startswith("float8")


def _as_2d(x):
    return x.reshape(1, 1) if x.ndim == 0 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def general_gemm(A, B, out_dtype=None, *, layout: str = "TN", A_scale_inv=None, B_scale_inv=None,
                 bias=None, gelu: bool = False, gelu_input=None, bias_grad: bool = False,
                 accumulate_into=None, alpha: float = 1.0, out_scale=None) -> GemmOutput:
    op = "general_gemm"
    if len(layout) != 2 or any(c not in "TN" for c in layout):
        raise ValueError(f"{op}: layout is {layout!r}; expected e.g. 'TN', 'NN', 'NT'")
    transa, transb = layout[0] == "T", layout[1] == "T"
    fp8_in = _is_fp8(A.dtype)
    if fp8_in != _is_fp8(B.dtype):
        raise ValueError(f"{op}: A ({A.dtype}) and B ({B.dtype}) must both be FP8 or both high precision")
    if fp8_in and (A_scale_inv is None or B_scale_inv is None):
        raise ValueError(f"{op}: A_scale_inv and B_scale_inv are required for FP8 operands")
    if out_dtype is None:
        out_dtype = (accumulate_into.dtype if accumulate_into is not None
                     else (jnp.bfloat16 if fp8_in else A.dtype))
    low = fp8_in or jnp.dtype(A.dtype) == jnp.dtype(B.dtype) and jnp.dtype(A.dtype).itemsize == 2
    # FP8 operands widened to bf16 first: exact (every E4M3/E5M2 value, FNUZ too, is a bf16
    # value), a pair of FP8 formats XLA may not multiply directly, and no fast FP8 accumulation
    wide = jnp.bfloat16 if fp8_in else (A.dtype if low else jnp.float32)
    a2 = _as_2d(A.astype(wide))
    b2 = _as_2d(B.astype(wide))
    op_a = a2.T if transa else a2
    op_b = b2.T if transb else b2
    if op_b.shape[1] != op_a.shape[0]:
        raise ValueError(f"{op}: A {A.shape} and B {B.shape} disagree on the reduction dimension")
    if fp8_in and any(d % 16 for d in (op_a.shape[1], op_b.shape[0], op_a.shape[0])):
        raise ValueError(f"{op}: FP8 GEMM needs m, n and k to be multiples of 16")
    m = op_a.shape[1]
    out_shape = (tuple(B.shape[:-1]) + (m,)) if (not transb and B.ndim >= 1) else (op_b.shape[0], m)

    if low:
        # 16-bit products are exact in fp32 and the sum is fp32 (preferred_element_type): the
        # tensor cores' own bf16/fp16 GEMM, as nvte_gemm's
        r = jax.lax.dot_general(op_b, op_a, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
    else:
        r = jnp.matmul(op_b, op_a, precision="highest")
    if fp8_in:
        r = r * (jnp.asarray(A_scale_inv, jnp.float32).reshape(())
                 * jnp.asarray(B_scale_inv, jnp.float32).reshape(()))
    r = alpha * r
    if accumulate_into is not None:
        r = r + _as_2d(accumulate_into).astype(jnp.float32)
    if bias is not None:
        r = r + jnp.asarray(bias, jnp.float32).reshape(1, -1)
    pre = None
    if gelu:
        pre = r
        r = gelu_tanh(r)
    if gelu_input is not None:
        r = r * dgelu_tanh(_as_2d(gelu_input).astype(jnp.float32))
    dbias = r.sum(axis=0) if bias_grad else None
    amax = None
    if _is_fp8(out_dtype):
        if out_scale is None:
            raise ValueError(f"{op}: out_scale is required for an FP8 out_dtype")
        fmt, flavor = fp8_formats.format_of_dtype_name(jnp.dtype(out_dtype).name)
        limit = fp8_formats.fp8_max(fmt, flavor)
        amax = (jnp.max(jnp.abs(r)) if r.size else jnp.float32(0)).reshape(1)
        r = jnp.clip(r * jnp.asarray(out_scale, jnp.float32).reshape(()), -limit, limit)
    side = out_dtype if not _is_fp8(out_dtype) else jnp.bfloat16
    aux_dtype = out_dtype if not _is_fp8(out_dtype) else jnp.float16
    return GemmOutput(
        r.astype(out_dtype).reshape(out_shape),
        dbias.astype(side) if dbias is not None else None,
        pre.astype(aux_dtype).reshape(out_shape) if pre is not None else None,
        amax)
