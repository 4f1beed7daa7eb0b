"""The eager hot path of the modules on a GPU with the native core: direct calls into the
bindings with descriptors built inline, no argument checks (the module validated shapes and
dtypes once per call) and no per-call scale tensors (scale/amax are passed as pointers into the
module's recipe state), plus the fused FP8 cast+transpose kernels (with the bias gradient, the
activation or its derivative folded in). Linear goes further: one native call per direction
(kernels/linear_step.py). Everything else (reference backend, torch.compile
tracing, a checkpoint recompute's forward, calibration, power-of-2 scales) goes through the
checked ops. The FP8 data and scales are the same bits either way; a bias gradient summed by a
fused kernel may differ in its last bit from the checked path's fp32 column sum (another order)."""
from __future__ import annotations

import torch

from .. import native
from ..kernels.gemm import EPILOGUE_BGRADB, EPILOGUE_BIAS, EPILOGUE_NONE
from ..kernels.native_call import native_call, native_call_again  # noqa: F401

_CODE = native.DTYPE_CODE


def _ptr(t) -> int:
    """A tensor's address, 0 for None (an amax that a checkpoint recompute must not record)."""
    return t.data_ptr() if t is not None else 0


def _desc(t, amax=0, scale=0, scale_inv=0):
    return (t.data_ptr(), t.shape, _CODE[t.dtype], amax, scale, scale_inv)


def _epilogue(bias, bias_grad):
    """(epilogue, bias-side descriptor or None): bias added, or B's column sums into bias_grad."""
    if bias is not None:
        return EPILOGUE_BIAS, _desc(bias)
    if bias_grad is not None:
        return EPILOGUE_BGRADB, _desc(bias_grad)
    return EPILOGUE_NONE, None


def gemm(nc, A, transa, B, transb, out, A_sinv=None, B_sinv=None, bias=None, beta=0.0,
         fast_accum=True, bias_grad=None, *, addend=None):
    """out = op(B) @ op(A) (+ bias) (+ beta * out): see kernels/gemm.py for the layouts. bias_grad
    (layout NT, high precision: a wgrad) receives the column sums of B in the same GEMM.
    addend (out's shape and dtype, high-precision out): out = op(B) @ op(A) + addend (+ bias), the
    addend read by the GEMM as its C operand (beta 1; exclusive with beta != 0, accumulation
    into out). The C API checks the addend's shape and dtype."""
    a = (A.data_ptr(), A.shape, _CODE[A.dtype], 0, 0, A_sinv.data_ptr() if A_sinv is not None else 0)
    b = (B.data_ptr(), B.shape, _CODE[B.dtype], 0, 0, B_sinv.data_ptr() if B_sinv is not None else 0)
    epilogue, side = _epilogue(bias, bias_grad)
    if addend is None:
        nc.mod.gemm(a, transa, b, transb, _desc(out), side, None, epilogue, 1.0, beta, fast_accum,
                    nc.ws_ptr, nc.ws_size, nc.stream)
        return out
    if beta != 0.0:
        raise ValueError(f"gemm: addend and beta={beta} (accumulation into out) are exclusive")
    nc.mod.gemm(a, transa, b, transb, _desc(out), side, None, epilogue, 1.0, 1.0, fast_accum,
                nc.ws_ptr, nc.ws_size, nc.stream, _desc(addend))
    return out


def _scaling(nc, rs, x_desc, forward: bool, slot: int):
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


def _fp8_outputs(x, rows, cols, dtype, transpose: bool):
    device = x.device
    out = torch.empty(x.shape, dtype=dtype, device=device)
    out_t = torch.empty((cols, rows), dtype=dtype, device=device) if transpose else None
    return out, out_t, torch.empty(1, dtype=torch.float32, device=device)


def cast(nc, rs, x, forward: bool, slot: int, need_transpose: bool):
    """(data, data_t or None, scale_inv) of a 2-D tensor in the recipe's FP8 format."""
    x_desc = _desc(x)
    dtype, amax_ptr, scale_ptr = _scaling(nc, rs, x_desc, forward, slot)
    out, out_t, scale_inv = _fp8_outputs(x, x.shape[0], x.shape[1], dtype, need_transpose)
    out_desc = _desc(out, amax_ptr, scale_ptr, scale_inv.data_ptr())
    if need_transpose:
        nc.mod.cast_transpose(x_desc, out_desc, _desc(out_t), nc.stream)
    else:
        nc.mod.quantize(x_desc, out_desc, nc.stream)
    return out, out_t, scale_inv


_WS_SHAPES: dict = {}


def _workspace(nc, key, query):
    """A float32 workspace of the shape `query()` returns, asked once per problem and kept."""
    shape = _WS_SHAPES.get(key)
    if shape is None:
        shape = _WS_SHAPES[key] = tuple(query())
    return torch.empty(shape, dtype=torch.float32, device=nc.device)


def cast_dbias(nc, rs, dy, slot: int, dbias_dtype):
    """(data, data_t, dbias, scale_inv) of an output gradient: FP8 cast, transpose and the
    bias gradient (column sums) in one pass over dy (backward slot)."""
    dy_desc = _desc(dy)
    dtype, amax_ptr, scale_ptr = _scaling(nc, rs, dy_desc, False, slot)
    rows, cols = dy.shape
    out, out_t, scale_inv = _fp8_outputs(dy, rows, cols, dtype, True)
    dbias = torch.empty(cols, dtype=dbias_dtype, device=dy.device)
    args = (dy_desc, _desc(out, amax_ptr, scale_ptr, scale_inv.data_ptr()), _desc(out_t), _desc(dbias))
    ws = _workspace(nc, ("ctdb", rows, cols, dy.dtype, dtype, dbias_dtype),
                    lambda: nc.mod.cast_transpose_dbias_workspace(*args))
    nc.mod.cast_transpose_dbias(*args, _desc(ws), nc.stream)
    return out, out_t, dbias, scale_inv


def act_cast_transpose(nc, rs, h, act_code: int, gated: bool, slot: int):
    """(act(h) in FP8, its transpose, scale_inv) in one pass (delayed scaling: the scale is known
    before the activation runs)."""
    h_desc = _desc(h)
    dtype, amax_ptr, scale_ptr = _scaling(nc, rs, h_desc, True, slot)
    rows, cols = h.shape[0], (h.shape[1] // 2 if gated else h.shape[1])
    out = torch.empty((rows, cols), dtype=dtype, device=h.device)
    out_t = torch.empty((cols, rows), dtype=dtype, device=h.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=h.device)
    nc.mod.act_cast_transpose(act_code, gated, h_desc, _desc(out, amax_ptr, scale_ptr, scale_inv.data_ptr()),
                              _desc(out_t), nc.stream)
    return out, out_t, scale_inv


def dact_dbias_cast_transpose(nc, rs, grad, h, act_code: int, gated: bool, slot: int, dbias_dtype):
    """(dh in FP8, its transpose, dbias or None, scale_inv): dh = grad * act'(h) (gated: both
    halves), cast, transposed and column-summed in one pass (delayed scaling). dbias_dtype None:
    no bias gradient."""
    h_desc = _desc(h)
    dtype, amax_ptr, scale_ptr = _scaling(nc, rs, h_desc, False, slot)
    rows, cols = h.shape
    out, out_t, scale_inv = _fp8_outputs(h, rows, cols, dtype, True)
    dbias = torch.empty(cols, dtype=dbias_dtype, device=h.device) if dbias_dtype is not None else None
    args = (act_code, gated, _desc(grad), h_desc, _desc(out, amax_ptr, scale_ptr, scale_inv.data_ptr()),
            _desc(out_t))
    ws = None
    if dbias is not None:
        ws = _workspace(nc, ("dact", act_code, gated, rows, cols, h.dtype, dtype, dbias_dtype),
                        lambda: nc.mod.dact_dbias_cast_transpose_workspace(*args, _desc(dbias)))
    nc.mod.dact_dbias_cast_transpose(*args, _desc(dbias) if dbias is not None else None,
                                     _desc(ws) if ws is not None else None, nc.stream)
    return out, out_t, dbias, scale_inv


def usable_backward(fi) -> bool:
    """Backward casts use the module's own backward scales, never recorded or replayed ones, so a
    checkpointed step takes the same backward kernels as a plain one (bit-exact equality); only
    power-of-2 current scaling takes the checked ops."""
    return fi.rs is None or fi.rs.delayed or not fi.rs.recipe.use_power_2_scales


def usable(fi) -> bool:
    """The fast path covers plain FP8/high-precision calls; calibration, checkpoint recompute
    and power-of-2 current scaling take the checked ops."""
    if fi.calibrating or fi.replay is not None or fi.record is not None:
        return False
    return fi.rs is None or fi.rs.delayed or not fi.rs.recipe.use_power_2_scales


def transpose(nc, x):
    """x.T (2-D) as a new contiguous tensor."""
    out = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device)
    nc.mod.transpose(_desc(x), _desc(out), nc.stream)
    return out


def norm_fwd(nc, rms, x, gamma, beta, eps, zcg, fp8_dtype=None, scale=None, amax=None):
    """(out, mu or None, rsigma, scale_inv or None) of LayerNorm/RMSNorm over a 2-D x; FP8 out
    when fp8_dtype is given (scale and amax as tensors of the recipe state)."""
    rows, device = x.shape[0], x.device
    rsigma = torch.empty(rows, dtype=torch.float32, device=device)
    if fp8_dtype is not None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=device)
        out = torch.empty(x.shape, dtype=fp8_dtype, device=device)
        z = _desc(out, _ptr(amax), scale.data_ptr(), scale_inv.data_ptr())
    else:
        scale_inv, out = None, torch.empty(x.shape, dtype=x.dtype, device=device)
        z = _desc(out)
    if rms:
        nc.mod.rmsnorm_fwd(_desc(x), _desc(gamma), float(eps), zcg, z, _desc(rsigma), nc.stream)
        return out, None, rsigma, scale_inv
    mu = torch.empty(rows, dtype=torch.float32, device=device)
    nc.mod.layernorm_fwd(_desc(x), _desc(gamma), _desc(beta), float(eps), zcg, z, _desc(mu),
                         _desc(rsigma), nc.stream)
    return out, mu, rsigma, scale_inv


_NORM_BWD_WS: dict = {}
_NULL_WS = (0, (0,), _CODE[torch.uint8], 0, 0, 0)


def norm_bwd(nc, rms, dz, x, mu, rsigma, gamma, zcg, dresidual=None):
    """(dx, dgamma, dbeta or None), dresidual (or None) added into dx; the workspace size is
    asked once per problem and kept."""
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    dbeta = None if rms else torch.empty_like(gamma)
    if rms:
        args = [_desc(dz), _desc(x), _desc(rsigma), _desc(gamma), zcg, _desc(dx), _desc(dgamma)]
        fn = nc.mod.rmsnorm_bwd
    else:
        args = [_desc(dz), _desc(x), _desc(mu), _desc(rsigma), _desc(gamma), zcg, _desc(dx),
                _desc(dgamma), _desc(dbeta)]
        fn = nc.mod.layernorm_bwd
    key = (rms, tuple(x.shape), x.dtype, gamma.dtype, x.device)
    nbytes = _NORM_BWD_WS.get(key)
    if nbytes is None:
        nbytes = _NORM_BWD_WS[key] = fn(*args, _NULL_WS, None, nc.stream)
    ws = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    fn(*args, _desc(ws), _desc(dresidual) if dresidual is not None else None, nc.stream)
    return dx, dgamma, dbeta


def activation_fp8(nc, x, act_code, gated, fp8_dtype, scale, amax):
    """(act(x) in FP8, scale_inv): the activation kernel casts as it writes (delayed scaling)."""
    shape = (x.shape[0], x.shape[1] // 2) if gated else tuple(x.shape)
    out = torch.empty(shape, dtype=fp8_dtype, device=x.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    fn = nc.mod.gated_activation if gated else nc.mod.activation
    fn(act_code, _desc(x), _desc(out, _ptr(amax), scale.data_ptr(), scale_inv.data_ptr()), nc.stream)
    return out, scale_inv


def dbias(nc, dy, dbias_dtype):
    """The column sums of a contiguous 2-D dy (a bias gradient) in dbias_dtype: one binding call
    with flat arguments, the partial sums in the call's GEMM workspace (dbias_direct)."""
    rows, cols = dy.shape
    db = torch.empty(cols, dtype=dbias_dtype, device=dy.device)
    nc.mod.dbias_direct(dy.data_ptr(), rows, cols, _CODE[dy.dtype], db.data_ptr(), _CODE[dbias_dtype],
                        nc.env)
    return db


_DBIAS_WS: dict = {}


def dbias_dact_fp8(nc, grad, x, act_code, dbias_dtype, fp8_dtype, scale, amax):
    """(dx in FP8, dbias, scale_inv) of a plain activation in one pass."""
    out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    dbias = torch.empty(x.shape[-1], dtype=dbias_dtype, device=x.device)
    args = (_desc(grad), _desc(x), _desc(out, _ptr(amax), scale.data_ptr(), scale_inv.data_ptr()),
            _desc(dbias))
    key = (act_code, tuple(x.shape), x.dtype, fp8_dtype, dbias_dtype, x.device)
    ws_shape = _DBIAS_WS.get(key)
    if ws_shape is None:
        ws_shape = _DBIAS_WS[key] = nc.mod.dbias_dactivation_workspace(act_code, *args)
    ws = torch.empty(ws_shape, dtype=torch.float32, device=x.device)
    nc.mod.dbias_dactivation(act_code, *args, _desc(ws), nc.stream)
    return out, dbias, scale_inv
