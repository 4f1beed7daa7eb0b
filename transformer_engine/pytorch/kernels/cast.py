"""FP8 casts with per-tensor scaling: quantize, dequantize, amax, transpose, cast+transpose.

Each op runs the native kernel for CUDA/ROCm tensors when the native core is built for this
torch, and its reference (plain torch, defined next to it) otherwise. Both compute the same bits:
  quantize(x) = saturate(x.float() * scale) rounded to nearest even in fp8_dtype,
  scale_inv = 1 / scale, amax = max(amax, max|x|)  (NaN in x gives a NaN amax).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ...common import fp8_formats
from .. import native
from ..native import describe
from ._checks import check_fp8_dtype, check_scalar_fp32, check_tensor


def fp8_max_of(fp8_dtype: torch.dtype) -> float:
    fmt, flavor = fp8_formats.format_of_dtype_name(str(fp8_dtype).replace("torch.", ""))
    return fp8_formats.fp8_max(fmt, flavor)


# ----- references ----------------------------------------------------------------------------

def quantize_reference(x, scale, fp8_dtype):
    """(data, scale_inv, amax) computed with plain torch ops."""
    limit = fp8_max_of(fp8_dtype)
    data = (x.float() * scale).clamp(-limit, limit).to(fp8_dtype)
    amax = x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
    return data, (1.0 / scale).reshape(1), amax.reshape(1)


def dequantize_reference(data, scale_inv, out_dtype):
    return (data.float() * scale_inv).to(out_dtype)


# ----- ops -----------------------------------------------------------------------------------

def _prepare(op, x, scale, fp8_dtype, amax, scale_inv):
    check_tensor(op, "x", x, native.HP_DTYPES)
    check_scalar_fp32(op, "scale", scale, x.device)
    check_fp8_dtype(op, fp8_dtype, x.device)
    if amax is not None:
        check_scalar_fp32(op, "amax", amax, x.device)
    if scale_inv is None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    else:
        check_scalar_fp32(op, "scale_inv", scale_inv, x.device)
    return scale_inv


def _merge_reference_meta(ref_scale_inv, ref_amax, amax, scale_inv):
    scale_inv.copy_(ref_scale_inv.reshape(scale_inv.shape))
    if amax is not None:
        amax.copy_(torch.maximum(amax.reshape(1), ref_amax).reshape(amax.shape)
                   if not torch.isnan(ref_amax).any() else ref_amax.reshape(amax.shape))


def quantize(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype,
             amax: Optional[torch.Tensor] = None, scale_inv: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Casts x to fp8_dtype with `scale` (one fp32 value on x's device).

    Returns (data, scale_inv). `amax`, if given, is updated in place with max|x|; `scale_inv`, if
    given, is written in place; `out` receives the data when given (same shape, fp8_dtype).
    """
    op = "quantize"
    scale_inv = _prepare(op, x, scale, fp8_dtype, amax, scale_inv)
    if out is None:
        out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    else:
        check_tensor(op, "out", out, (fp8_dtype,))
        if out.shape != x.shape:
            raise ValueError(f"{op}: out has shape {tuple(out.shape)}; expected {tuple(x.shape)}")
    if native.use_native(x):
        native.native_for_torch().quantize(
            native.describe(x), native.describe(out, amax, scale, scale_inv), native.stream_of(x))
        return out, scale_inv
    data, ref_scale_inv, ref_amax = quantize_reference(x, scale, fp8_dtype)
    out.copy_(data)
    _merge_reference_meta(ref_scale_inv, ref_amax, amax, scale_inv)
    return out, scale_inv


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float(data) * scale_inv, returned in out_dtype (float32, float16 or bfloat16)."""
    op = "dequantize"
    check_tensor(op, "data", data, native.FP8_DTYPES)
    check_scalar_fp32(op, "scale_inv", scale_inv, data.device)
    if out_dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: out_dtype is {out_dtype}; expected float32, float16 or bfloat16")
    if native.use_native(data):
        out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
        native.native_for_torch().dequantize(
            native.describe(data, scale_inv=scale_inv), native.describe(out), native.stream_of(data))
        return out
    return dequantize_reference(data, scale_inv, out_dtype)


def compute_amax(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """amax <- max(amax, max|x|), in place; returns amax."""
    op = "compute_amax"
    check_tensor(op, "x", x, native.HP_DTYPES)
    check_scalar_fp32(op, "amax", amax, x.device)
    if native.use_native(x):
        native.native_for_torch().compute_amax(native.describe(x), amax.data_ptr(), native.stream_of(x))
        return amax
    if x.numel():
        cur = x.abs().amax().float().reshape(amax.shape)
        amax.copy_(cur if torch.isnan(cur).any() else torch.maximum(amax, cur))
    return amax


def _as_2d_shape(x: torch.Tensor) -> Tuple[int, int]:
    if x.dim() == 0:
        return 1, 1
    return math.prod(x.shape[:-1]), x.shape[-1]


def transpose(x: torch.Tensor) -> torch.Tensor:
    """Row-major transpose of x viewed as [prod(shape[:-1]), shape[-1]] (1, 2 or 4-byte dtypes)."""
    op = "transpose"
    check_tensor(op, "x", x)
    rows, cols = _as_2d_shape(x)
    if native.use_native(x) and x.element_size() in (1, 2, 4):
        out = torch.empty((cols, rows), dtype=x.dtype, device=x.device)
        native.native_for_torch().transpose(native.describe(x), native.describe(out), native.stream_of(x))
        return out
    return x.reshape(rows, cols).t().contiguous()


def cast_transpose(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype,
                   amax: Optional[torch.Tensor] = None, scale_inv: Optional[torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, data_t, scale_inv): x quantized as in `quantize`, plus the quantized transpose of x
    viewed as 2-D ([cols, rows]), made in one pass over x."""
    op = "cast_transpose"
    scale_inv = _prepare(op, x, scale, fp8_dtype, amax, scale_inv)
    rows, cols = _as_2d_shape(x)
    out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    out_t = torch.empty((cols, rows), dtype=fp8_dtype, device=x.device)
    if native.use_native(x):
        native.native_for_torch().cast_transpose(
            native.describe(x), native.describe(out, amax, scale, scale_inv), native.describe(out_t),
            native.stream_of(x))
        return out, out_t, scale_inv
    data, ref_scale_inv, ref_amax = quantize_reference(x, scale, fp8_dtype)
    out.copy_(data)
    out_t.copy_(data.reshape(rows, cols).t())
    _merge_reference_meta(ref_scale_inv, ref_amax, amax, scale_inv)
    return out, out_t, scale_inv


# ----- the unchecked calls of the modules' eager path (nc: a NativeCall, kernels/eager.py) ------
def recipe_scaling_unchecked(nc, rs, x_desc, forward: bool, slot: int):
    """(fp8 dtype, amax pointer for the cast or 0, scale pointer) of one cast.

    DelayedScaling: the module's scale, amax recorded into the history row. Current scaling:
    one launch computes the amax and the scale (current_scaling_scales, with the 1-row history
    as its amax scratch), then the cast: two launches, no torch ops."""
    hist, scale, sinv_state, fp8_max, counter, skipped = rs.ptrs_fwd if forward else rs.ptrs_bwd
    off = 4 * slot  # fp32 and int32 slots alike
    if rs.delayed:
        return (rs.fwd_dtype if forward else rs.bwd_dtype), hist + off, scale + off
    nc.mod.current_scaling_scales([x_desc], hist + off, counter, scale + off, sinv_state + off,
                                  fp8_max, nc.stream, skipped + off)
    return (rs.fwd_dtype if forward else rs.bwd_dtype), 0, scale + off


def fp8_outputs(x, rows, cols, dtype, transpose: bool):
    """New (data, data_t or None, scale_inv) for an FP8 cast of x [rows, cols]."""
    device = x.device
    out = torch.empty(x.shape, dtype=dtype, device=device)
    out_t = torch.empty((cols, rows), dtype=dtype, device=device) if transpose else None
    return out, out_t, torch.empty(1, dtype=torch.float32, device=device)


def cast_unchecked(nc, rs, x, forward: bool, slot: int, need_transpose: bool,
                   band_rows: int = 0):
    """(data, data_t or None, scale_inv) of a 2-D tensor in the recipe's FP8 format. band_rows
    (with a transpose): one launch per band of that many rows (same bytes; work on another
    stream can get SMs between the bands)."""
    x_desc = describe(x)
    dtype, amax_ptr, scale_ptr = recipe_scaling_unchecked(nc, rs, x_desc, forward, slot)
    out, out_t, scale_inv = fp8_outputs(x, x.shape[0], x.shape[1], dtype, need_transpose)
    out_desc = describe(out, amax_ptr, scale_ptr, scale_inv.data_ptr())
    if need_transpose and 0 < band_rows < x.shape[0]:
        out_t_desc = describe(out_t)
        for begin in range(0, x.shape[0], band_rows):
            nc.mod.cast_transpose_rows(x_desc, out_desc, out_t_desc, begin,
                                       min(begin + band_rows, x.shape[0]), nc.stream)
    elif need_transpose:
        nc.mod.cast_transpose(x_desc, out_desc, describe(out_t), nc.stream)
    else:
        nc.mod.quantize(x_desc, out_desc, nc.stream)
    return out, out_t, scale_inv


def transpose_unchecked(nc, x, out=None):
    """x.T (2-D) into out (contiguous [x.shape[1], x.shape[0]], made when None), on nc's
    stream."""
    if out is None:
        out = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
    nc.mod.transpose(describe(x), describe(out), nc.stream)
    return out


_WS_SHAPES: dict = {}


def workspace_once(nc, key, query):
    """A float32 workspace of the shape `query()` returns, asked once per problem and device
    (the answer is the native module's of that device: tile sizes differ between builds) and
    kept."""
    key = (nc.device, key)
    shape = _WS_SHAPES.get(key)
    if shape is None:
        shape = _WS_SHAPES[key] = tuple(query())
    return torch.empty(shape, dtype=torch.float32, device=nc.device)
