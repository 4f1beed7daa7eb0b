"""FP8 casts in jnp, bit-compatible with the native kernels and the torch references:
quantize(x) = saturate(float32(x) * scale) rounded to nearest even, scale_inv = 1 / scale,
amax = max|x| (NaN propagates). Functional: results are returned, nothing is updated in place."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ...common import fp8_formats


def fp8_dtype(fmt: str, flavor: str = fp8_formats.OCP):
    """jnp FP8 dtype of a format ('e4m3'/'e5m2') in a flavour ('ocp'/'fnuz')."""
    return jnp.dtype(getattr(jnp, fp8_formats.fp8_dtype_name(fmt, flavor)))


def _fp8_max(dtype) -> float:
    fmt, flavor = fp8_formats.format_of_dtype_name(jnp.dtype(dtype).name)
    return fp8_formats.fp8_max(fmt, flavor)


def _check_hp(op, x):
    if jnp.dtype(x.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"{op}: x has dtype {x.dtype}; expected float32, float16 or bfloat16")


def quantize(x, scale, fp8_dtype):
    """(data, scale_inv, amax) with scale a float32 scalar or [1] array."""
    _check_hp("quantize", x)
    limit = _fp8_max(fp8_dtype)
    scale = jnp.asarray(scale, jnp.float32).reshape(())
    data = jnp.clip(x.astype(jnp.float32) * scale, -limit, limit).astype(fp8_dtype)
    # XLA's GPU pipeline (with its default xla_allow_excess_precision) folds a float32 -> FP8 ->
    # float32 convert pair into nothing, which would drop the FP8 rounding wherever the data is
    # dequantized right away; the barrier keeps the FP8 values the consumers see.
    data = jax.lax.optimization_barrier(data)
    amax = jnp.max(jnp.abs(x.astype(jnp.float32))) if x.size else jnp.float32(0)
    return data, (1.0 / scale).reshape(1), amax.reshape(1)


def dequantize(data, scale_inv, out_dtype=jnp.float32):
    return (data.astype(jnp.float32) * jnp.asarray(scale_inv, jnp.float32).reshape(())).astype(out_dtype)


def transpose(x):
    cols = x.shape[-1] if x.ndim else 1
    return x.reshape(-1, cols).T


def cast_transpose(x, scale, fp8_dtype):
    """(data, data_t, scale_inv, amax): quantize plus the transposed copy of x viewed as 2-D."""
    data, scale_inv, amax = quantize(x, scale, fp8_dtype)
    return data, transpose(data), scale_inv, amax
