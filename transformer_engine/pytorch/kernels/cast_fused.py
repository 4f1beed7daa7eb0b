"""Fusions of the FP8 cast+transpose: with the bias gradient, with an activation, with an
activation's backward (and its bias gradient).

Each returns the FP8 result both row-major and transposed (the 2-D view [rows, cols] and its
[cols, rows] transpose), as FP8 GEMMs need both for a tensor used in forward and wgrad. The
native kernels read every input once; the references (plain torch, next to each op) compute the
same bits as the unfused sequence of ops:
  cast_transpose_dbias:       v = x;                      dbias = column sums of x
  act_cast_transpose:         v = act(x) (plain name) or act(x[..., :N]) * x[..., N:] (gated)
  dact_dbias_cast_transpose:  v = the activation's backward at x applied to grad (as in
                              kernels.activation_backward);    dbias = column sums of v
then data = quantize(v) (saturate(v * scale) in fp8_dtype), data_t its transpose,
scale_inv = 1 / scale, amax = max(amax, max|v|). dbias is summed in fp32 from the unrounded v.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import native
from ..native import describe
from ._checks import check_tensor
from .activation import (ACTIVATIONS, GATED, _check_name, _gated_shapes, activation_fp32_reference,
                         dactivation_fp32_reference)
from .cast import (_merge_reference_meta, _prepare, fp8_outputs, quantize_reference,
                   recipe_scaling_unchecked, workspace_once)


def _rows_cols(shape) -> Tuple[int, int]:
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) else (1, 1)


def _result_shape(x: torch.Tensor, name: Optional[str], backward: bool) -> tuple:
    """Shape of v: x's, except the forward of a gated activation halves the last dim."""
    if name in GATED and not backward:
        return tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    return tuple(x.shape)


def _check_dbias_dtype(op, dbias_dtype):
    if dbias_dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: dbias_dtype is {dbias_dtype}; expected float32, float16 or "
                         "bfloat16")


# ----- references ------------------------------------------------------------------------------

def _quantize_transposed(v, scale, fp8_dtype, shape):
    """(data [shape], data_t [cols, rows], scale_inv, amax) of the fp32 values v."""
    data, scale_inv, amax = quantize_reference(v, scale, fp8_dtype)
    rows, cols = _rows_cols(shape)
    return data.reshape(shape), data.reshape(rows, cols).t().contiguous(), scale_inv, amax


def _column_sums(v, shape, dbias_dtype):
    return v.reshape(_rows_cols(shape)).sum(0).to(dbias_dtype)


def cast_transpose_dbias_reference(x, scale, fp8_dtype, dbias_dtype=None):
    """(data, data_t, dbias, scale_inv, amax) computed with plain torch ops."""
    data, data_t, scale_inv, amax = _quantize_transposed(x, scale, fp8_dtype, tuple(x.shape))
    dbias = _column_sums(x.float(), tuple(x.shape), dbias_dtype or x.dtype)
    return data, data_t, dbias, scale_inv, amax


def act_cast_transpose_reference(x, name, scale, fp8_dtype):
    """(data, data_t, scale_inv, amax) computed with plain torch ops."""
    v = activation_fp32_reference(x, name)
    return _quantize_transposed(v, scale, fp8_dtype, tuple(v.shape))


def dact_dbias_cast_transpose_reference(grad, x, name, scale, fp8_dtype, dbias_dtype=None):
    """(data, data_t, dbias, scale_inv, amax) computed with plain torch ops."""
    v = dactivation_fp32_reference(grad, x, name)
    data, data_t, scale_inv, amax = _quantize_transposed(v, scale, fp8_dtype, tuple(x.shape))
    return data, data_t, _column_sums(v, tuple(x.shape), dbias_dtype or x.dtype), scale_inv, amax


# ----- ops -------------------------------------------------------------------------------------

def _outputs(shape, fp8_dtype, device):
    rows, cols = _rows_cols(shape)
    return (torch.empty(shape, dtype=fp8_dtype, device=device),
            torch.empty((cols, rows), dtype=fp8_dtype, device=device))


def _workspace(shape, device):
    return torch.empty(tuple(shape), dtype=torch.float32, device=device)


def cast_transpose_dbias(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype,
                         amax: Optional[torch.Tensor] = None,
                         scale_inv: Optional[torch.Tensor] = None,
                         dbias_dtype: Optional[torch.dtype] = None):
    """(data, data_t, dbias, scale_inv): kernels.cast_transpose of x plus dbias = x summed over all
    rows ([x.shape[-1]] in dbias_dtype, default x.dtype), in one pass over x."""
    op = "cast_transpose_dbias"
    scale_inv = _prepare(op, x, scale, fp8_dtype, amax, scale_inv)
    dbias_dtype = dbias_dtype or x.dtype
    _check_dbias_dtype(op, dbias_dtype)
    out, out_t = _outputs(tuple(x.shape), fp8_dtype, x.device)
    dbias = torch.empty(_rows_cols(tuple(x.shape))[1], dtype=dbias_dtype, device=x.device)
    if native.use_native(x):
        mod = native.native_for_torch()
        args = (native.describe(x), native.describe(out, amax, scale, scale_inv),
                native.describe(out_t), native.describe(dbias))
        ws = _workspace(mod.cast_transpose_dbias_workspace(*args), x.device)
        mod.cast_transpose_dbias(*args, native.describe(ws), native.stream_of(x))
        return out, out_t, dbias, scale_inv
    data, data_t, ref_dbias, ref_si, ref_amax = cast_transpose_dbias_reference(x, scale, fp8_dtype,
                                                                              dbias_dtype)
    out.copy_(data)
    out_t.copy_(data_t)
    dbias.copy_(ref_dbias)
    _merge_reference_meta(ref_si, ref_amax, amax, scale_inv)
    return out, out_t, dbias, scale_inv


def act_cast_transpose(x: torch.Tensor, name: str, scale: torch.Tensor, fp8_dtype: torch.dtype,
                       amax: Optional[torch.Tensor] = None,
                       scale_inv: Optional[torch.Tensor] = None):
    """(data, data_t, scale_inv): v = act(x) for a plain name, act(x[..., :N]) * x[..., N:] for a
    gated one (v [..., N]), quantized row-major and transposed in one pass over x."""
    op = f"act_cast_transpose({name})"
    _check_name(op, name)
    scale_inv = _prepare(op, x, scale, fp8_dtype, amax, scale_inv)
    _gated_shapes(op, x, name)
    shape = _result_shape(x, name, backward=False)
    out, out_t = _outputs(shape, fp8_dtype, x.device)
    if native.use_native(x):
        native.native_for_torch().act_cast_transpose(
            ACTIVATIONS[GATED.get(name, name)], name in GATED, native.describe(x),
            native.describe(out, amax, scale, scale_inv), native.describe(out_t),
            native.stream_of(x))
        return out, out_t, scale_inv
    data, data_t, ref_si, ref_amax = act_cast_transpose_reference(x, name, scale, fp8_dtype)
    out.copy_(data)
    out_t.copy_(data_t)
    _merge_reference_meta(ref_si, ref_amax, amax, scale_inv)
    return out, out_t, scale_inv


def dact_dbias_cast_transpose(grad: torch.Tensor, x: torch.Tensor, name: str,
                              scale: torch.Tensor, fp8_dtype: torch.dtype,
                              amax: Optional[torch.Tensor] = None,
                              scale_inv: Optional[torch.Tensor] = None,
                              with_dbias: bool = True,
                              dbias_dtype: Optional[torch.dtype] = None):
    """(data, data_t, dbias, scale_inv): v = the backward of act at x (the forward's input)
    applied to grad, as kernels.activation_backward computes it (grad [..., N] and v like x
    [..., 2N] for a gated name), quantized row-major and transposed, and dbias = v summed over
    all rows ([v.shape[-1]], dbias_dtype, default x.dtype; None when with_dbias is False)."""
    op = f"dact_dbias_cast_transpose({name})"
    _check_name(op, name)
    scale_inv = _prepare(op, x, scale, fp8_dtype, amax, scale_inv)
    check_tensor(op, "grad", grad, (x.dtype,))
    _gated_shapes(op, x, name)
    want = _result_shape(x, name, backward=False)
    if tuple(grad.shape) != want or grad.device != x.device:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} on {grad.device}; expected "
                         f"{want} on {x.device}")
    dbias_dtype = dbias_dtype or x.dtype
    _check_dbias_dtype(op, dbias_dtype)
    shape = tuple(x.shape)
    out, out_t = _outputs(shape, fp8_dtype, x.device)
    dbias = None
    if with_dbias:
        dbias = torch.empty(_rows_cols(shape)[1], dtype=dbias_dtype, device=x.device)
    if native.use_native(x):
        mod = native.native_for_torch()
        code, gated = ACTIVATIONS[GATED.get(name, name)], name in GATED
        args = (native.describe(grad), native.describe(x),
                native.describe(out, amax, scale, scale_inv), native.describe(out_t))
        ws = None
        if with_dbias:
            ws = _workspace(mod.dact_dbias_cast_transpose_workspace(
                code, gated, *args, native.describe(dbias)), x.device)
        mod.dact_dbias_cast_transpose(code, gated, *args,
                                      None if dbias is None else native.describe(dbias),
                                      None if ws is None else native.describe(ws),
                                      native.stream_of(x))
        return out, out_t, dbias, scale_inv
    data, data_t, ref_dbias, ref_si, ref_amax = dact_dbias_cast_transpose_reference(
        grad, x, name, scale, fp8_dtype, dbias_dtype)
    out.copy_(data)
    out_t.copy_(data_t)
    if dbias is not None:
        dbias.copy_(ref_dbias)
    _merge_reference_meta(ref_si, ref_amax, amax, scale_inv)
    return out, out_t, dbias, scale_inv


# ----- the unchecked calls of the modules' eager path (nc: a NativeCall, kernels/eager.py) ------
def cast_transpose_dbias_unchecked(nc, rs, dy, slot: int, dbias_dtype):
    """(data, data_t, dbias, scale_inv) of an output gradient: FP8 cast, transpose and the
    bias gradient (column sums) in one pass over dy (backward slot)."""
    dy_desc = describe(dy)
    dtype, amax_ptr, scale_ptr = recipe_scaling_unchecked(nc, rs, dy_desc, False, slot)
    rows, cols = dy.shape
    out, out_t, scale_inv = fp8_outputs(dy, rows, cols, dtype, True)
    dbias = torch.empty(cols, dtype=dbias_dtype, device=dy.device)
    args = (dy_desc, describe(out, amax_ptr, scale_ptr, scale_inv.data_ptr()), describe(out_t), describe(dbias))
    ws = workspace_once(nc, ("ctdb", rows, cols, dy.dtype, dtype, dbias_dtype),
                    lambda: nc.mod.cast_transpose_dbias_workspace(*args))
    nc.mod.cast_transpose_dbias(*args, describe(ws), nc.stream)
    return out, out_t, dbias, scale_inv


def act_cast_transpose_unchecked(nc, rs, h, act_code: int, gated: bool, slot: int):
    """(act(h) in FP8, its transpose, scale_inv) in one pass (delayed scaling: the scale is known
    before the activation runs)."""
    h_desc = describe(h)
    dtype, amax_ptr, scale_ptr = recipe_scaling_unchecked(nc, rs, h_desc, True, slot)
    rows, cols = h.shape[0], (h.shape[1] // 2 if gated else h.shape[1])
    out = torch.empty((rows, cols), dtype=dtype, device=h.device)
    out_t = torch.empty((cols, rows), dtype=dtype, device=h.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=h.device)
    nc.mod.act_cast_transpose(act_code, gated, h_desc, describe(out, amax_ptr, scale_ptr, scale_inv.data_ptr()),
                              describe(out_t), nc.stream)
    return out, out_t, scale_inv


def dact_dbias_cast_transpose_unchecked(nc, rs, grad, h, act_code: int, gated: bool, slot: int, dbias_dtype):
    """(dh in FP8, its transpose, dbias or None, scale_inv): dh = grad * act'(h) (gated: both
    halves), cast, transposed and column-summed in one pass (delayed scaling). dbias_dtype None:
    no bias gradient."""
    h_desc = describe(h)
    dtype, amax_ptr, scale_ptr = recipe_scaling_unchecked(nc, rs, h_desc, False, slot)
    rows, cols = h.shape
    out, out_t, scale_inv = fp8_outputs(h, rows, cols, dtype, True)
    dbias = torch.empty(cols, dtype=dbias_dtype, device=h.device) if dbias_dtype is not None else None
    args = (act_code, gated, describe(grad), h_desc, describe(out, amax_ptr, scale_ptr, scale_inv.data_ptr()),
            describe(out_t))
    ws = None
    if dbias is not None:
        ws = workspace_once(nc, ("dact", act_code, gated, rows, cols, h.dtype, dtype, dbias_dtype),
                        lambda: nc.mod.dact_dbias_cast_transpose_workspace(*args, describe(dbias)))
    nc.mod.dact_dbias_cast_transpose(*args, describe(dbias) if dbias is not None else None,
                                     describe(ws) if ws is not None else None, nc.stream)
    return out, out_t, dbias, scale_inv
