"""FP8 cast, cast + transpose and the delayed-scaling update: XLA FFI custom calls on the GPU,
the jnp references (transformer_engine.jax.kernels) elsewhere. Same signatures and results."""
from __future__ import annotations

import jax.numpy as jnp

from .. import kernels
from ...common import fp8_formats
from .registry import f32, ffi, i64, scalar1, sds, use_custom_call

_F32 = jnp.float32


def _check_fp8(op, dtype):
    name = jnp.dtype(dtype).name
    try:
        fp8_formats.format_of_dtype_name(name)
    except ValueError:
        raise ValueError(f"{op}: fp8_dtype is {name}; expected an FP8 dtype") from None


def quantize(x, scale, fp8_dtype):
    """(data, scale_inv [1], amax [1]) of saturate(x * scale) in fp8_dtype."""
    if not use_custom_call("quantize"):
        return kernels.quantize(x, scale, fp8_dtype)
    kernels.cast._check_hp("quantize", x)
    _check_fp8("quantize", fp8_dtype)
    call = ffi("te_quantize_ffi", (sds(x.shape, fp8_dtype), sds((1,), _F32), sds((1,), _F32)),
               aliases={2: 2})
    return tuple(call(x, scalar1(scale), jnp.zeros((1,), _F32)))


def cast_transpose(x, scale, fp8_dtype):
    """(data, data_t, scale_inv, amax): quantize plus the transposed copy of x viewed as 2-D."""
    if not use_custom_call("cast_transpose"):
        return kernels.cast_transpose(x, scale, fp8_dtype)
    kernels.cast._check_hp("cast_transpose", x)
    _check_fp8("cast_transpose", fp8_dtype)
    cols = x.shape[-1] if x.ndim else 1
    rows = x.size // cols if cols else 0
    call = ffi("te_cast_transpose_ffi",
               (sds(x.shape, fp8_dtype), sds((cols, rows), fp8_dtype), sds((1,), _F32),
                sds((1,), _F32)), aliases={2: 3})
    return tuple(call(x, scalar1(scale), jnp.zeros((1,), _F32)))


_ALGOS = {"max": 0, "most_recent": 1}


def delayed_scaling_update(history, scale, fp8_max, algo="max", margin=0.0, skipped=None):
    """(new_history, new_scale, new_scale_inv) for history [L, n] and scale [n] (float32), and
    with `skipped` (int32 [n]) the new counts of updates skipped for a non-finite amax (see
    kernels.delayed_scaling_update: the custom call skips them the same way)."""
    if callable(algo) or not use_custom_call("delayed_scaling"):
        return kernels.delayed_scaling_update(history, scale, fp8_max, algo, margin, skipped)
    if algo not in _ALGOS:
        raise ValueError(f"delayed_scaling_update: algo is {algo!r}; expected 'max', "
                         f"'most_recent' or a callable")
    history = jnp.asarray(history, _F32)
    scale = jnp.asarray(scale, _F32)
    if history.ndim != 2 or scale.shape != (history.shape[1],):
        raise ValueError(f"delayed_scaling_update: history {history.shape} and scale {scale.shape}; "
                         f"expected [L, n] and [n]")
    call = ffi("te_delayed_scaling_update_ffi",
               (sds(history.shape, _F32), sds(scale.shape, _F32), sds(scale.shape, _F32)),
               aliases={0: 0, 1: 1})
    out = tuple(call(history, scale, fp8_max=f32(fp8_max), algo=i64(_ALGOS[algo]),
                     margin=f32(margin)))
    if skipped is None:
        return out
    return out + (skipped + (~jnp.isfinite(history[0])).astype(skipped.dtype),)

