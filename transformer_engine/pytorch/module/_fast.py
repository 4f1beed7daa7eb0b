"""The eager hot path of the modules on a GPU with the native core: direct calls into the
bindings with descriptors built inline, no argument checks (the module validated shapes and
dtypes once per call) and no per-call scale tensors (scale/amax are passed as pointers into the
module's recipe state), plus the fused FP8 cast+transpose kernels (with the bias gradient, the
activation or its derivative folded in). Linear goes further: one native call per direction
with flat integer arguments (csrc/bindings/linear_fast.cpp), its operands in arenas and the
per-stream call scratch below. Everything else (reference backend, torch.compile
tracing, a checkpoint recompute's forward, calibration, power-of-2 scales) goes through the
checked ops. The FP8 data and scales are the same bits either way; a bias gradient summed by a
fused kernel may differ in its last bit from the checked path's fp32 column sum (another order)."""
from __future__ import annotations

import math

import torch

from .. import native
from ..kernels.gemm import EPILOGUE_BGRADB, EPILOGUE_BIAS, EPILOGUE_NONE, gemm_workspace_raw

_CODE = native.DTYPE_CODE


class NativeCall:
    """The native module, stream and GEMM workspace of one module call."""
    __slots__ = ("mod", "stream", "ws", "ws_ptr", "ws_size", "device", "env")

    def __init__(self, mod, device):
        self.mod, self.device = mod, device
        self.stream = native.stream_handle(device.index)
        # one workspace per (device, stream): GEMMs on two streams may run at the same time. The
        # buffer is held here, so that one made under graph capture (not cached) or dropped from
        # the cache outlives the calls that use it
        self.ws, self.ws_ptr, self.ws_size = gemm_workspace_raw(device.index, self.stream)
        # the Linear bindings take these three as one tuple (csrc/bindings/linear_fast.cpp)
        self.env = (self.ws_ptr, self.ws_size, self.stream)


# (device index, stream) -> its NativeCall, made once: a module call then costs one stream query
# and a lookup instead of building the object and looking up the workspace (host time). Calls
# made while a graph is captured are not kept (their workspace belongs to the graph's pool, see
# gemm_workspace_raw); the table is cleared past _MAX_CALLS streams, like the workspaces.
_CALLS: dict = {}
_MAX_CALLS = 16
_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def native_call(x: torch.Tensor):
    """A NativeCall when x runs on the native core in eager mode, else None."""
    if not x.is_cuda or torch.compiler.is_compiling():
        return None
    mod = native.native_for_torch()
    if mod is None:
        return None
    index = x.get_device()
    key = (index, native.stream_handle(index))
    nc = _CALLS.get(key)
    if nc is None:
        nc = NativeCall(mod, x.device)
        if not stream_capturing(nc.stream):
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = nc
    return nc


def native_call_again(forward_call, x: torch.Tensor):
    """For a backward: its forward's NativeCall when the current stream is still the forward's
    (autograd may run the backward on another: then that stream's call, as native_call), unless
    the backward is traced."""
    if forward_call is None or torch.compiler.is_compiling():
        return native_call(x)
    if native.stream_handle(forward_call.device.index) != forward_call.stream:
        return native_call(x)
    return forward_call


def stream_capturing(stream: int) -> bool:
    """Whether the current stream (handle `stream`) is being captured into a graph. The legacy
    default stream (handle 0) never is (CUDA refuses it): no query there."""
    if not stream:
        return False
    return _is_capturing() if _is_capturing is not None else torch.cuda.is_current_stream_capturing()


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
    ptrs = rs._ptrs or rs._pointers()
    hist, scale, sinv_state, fp8_max, counter, skipped = ptrs[0] if forward else ptrs[1]
    off = 4 * slot  # fp32 and int32 slots alike
    if rs.delayed:
        return (rs.fwd_dtype if forward else rs.bwd_dtype), hist + off, scale + off
    nc.mod.current_scaling_scales([x_desc], hist + off, counter, scale + off, sinv_state + off,
                                  fp8_max, nc.stream, skipped + off)
    return (rs.fwd_dtype if forward else rs.bwd_dtype), 0, scale + off


# ----- arenas: several outputs of a step in one allocation ---------------------------------------
# torch.empty costs several microseconds of host time on a slow host, more than a launch; the
# Linear step makes its FP8 operands (data, transpose, scale_inv, workspaces) as regions of a
# few uint8 buffers, grouped by lifetime (forward-only scratch, kept for backward), and passes
# the regions' addresses to the kernels (one native call per direction). Every region, a 4-byte
# scale_inv too, starts on a 256-byte boundary (the vectorised kernels want 16 bytes, cuBLASLt
# more for FP8 scale pointers; the caching allocator's blocks are 512-aligned).
_ALIGN = 256


def aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) & -_ALIGN


def arena(nbytes: int, device) -> torch.Tensor:
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


# Buffers that live only within one fused native call (linear_fast.cpp: the forward's FP8 x and W,
# read by its GEMM; the backward's FP8 dy, its transpose and the bias-gradient workspace) reuse one
# buffer per device and stream instead of an allocation per call. Safe because such a call
# launches all its kernels while holding the GIL (no other Python thread launches in between) and
# the stream runs the next call's writes after this call's reads. Not while a graph is captured
# (a replay runs apart from eager calls), and only up to _SCRATCH_MAX bytes: past that the kernels
# outlast an allocation, and a buffer kept for good would hold memory others could use.
_SCRATCH: dict = {}
_SCRATCH_MAX = 16 << 20


def call_scratch(nc, nbytes: int) -> torch.Tensor:
    """A buffer of at least nbytes for the kernels of one fused native call (see above)."""
    if nbytes > _SCRATCH_MAX or stream_capturing(nc.stream):
        return arena(nbytes, nc.device)
    key = (nc.device, nc.stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < nbytes:
        # the buffer it replaces goes back to the allocator, which lends it on this stream only,
        # after the kernels queued so far
        buf = _SCRATCH[key] = arena(nbytes, nc.device)
    return buf


# The gradients a small step returns (dx, dW, db) share one allocation: each torch.empty costs
# about 6 us of host time on an H100 host, an as_strided view of a shared buffer a third of
# that. Only up to _GRADS_SHARED_MAX bytes: the views keep the whole buffer alive as long as any
# of them lives (dW and db as parameter gradients, typically until zero_grad).
_GRADS_SHARED_MAX = 4 << 20


def step_grads(device, dtype, shapes):
    """Contiguous tensors of dtype for `shapes` (a tuple; None entries give None): views of one
    allocation, each on a 256-byte boundary, when they are small together, else one each."""
    key = (dtype, shapes)
    layout = _GRAD_LAYOUTS.get(key)
    if layout is None:
        if len(_GRAD_LAYOUTS) >= 256:  # varying token counts: keep the table small
            _GRAD_LAYOUTS.clear()
        layout = _GRAD_LAYOUTS[key] = _grad_layout(dtype, shapes)
    total, views = layout
    if total is None:
        return [torch.empty(shape, dtype=dtype, device=device) if shape is not None else None
                for shape in shapes]
    buf = torch.empty(total, dtype=dtype, device=device)
    return [buf.as_strided(*v) if v is not None else None for v in views]


# (dtype, shapes) -> (elements of the shared buffer or None, [(shape, stride, offset) or None]):
# the arithmetic of step_grads, done once per problem
_GRAD_LAYOUTS: dict = {}


def _grad_layout(dtype, shapes):
    item = dtype.itemsize
    sizes = [math.prod(shape) if shape is not None else 0 for shape in shapes]
    total = sum(aligned(n * item) for n in sizes)
    if total > _GRADS_SHARED_MAX:
        return None, None
    views, offset = [], 0
    for shape, n in zip(shapes, sizes):
        if shape is None:
            views.append(None)
            continue
        stride = (shape[1], 1) if len(shape) == 2 else (1,)
        views.append((shape, stride, offset))
        offset += aligned(n * item) // item
    return max(total // item, 1), views


def region_view(buf: torch.Tensor, offset: int, shape, dtype) -> torch.Tensor:
    """A region of an arena as a tensor (only where a tensor object is needed: checked ops)."""
    n = 1
    for d in shape:
        n *= d
    return buf[offset:offset + n * dtype.itemsize].view(dtype).view(shape)


def dbias_workspace_elems(nc, rows: int, cols: int, in_code: int, fp8_code: int, dbias_dtype) -> int:
    """fp32 elements of the workspace of cast_transpose_dbias on a [rows, cols] input, asked
    once per problem and kept. The size query checks descriptors but reads no memory: a dummy
    aligned address stands in for the buffers (not allocated yet: their size is the answer)."""
    key = ("ctdb", rows, cols, in_code, fp8_code, dbias_dtype)
    shape = _WS_SHAPES.get(key)
    if shape is None:
        p = _ALIGN
        shape = _WS_SHAPES[key] = tuple(nc.mod.cast_transpose_dbias_workspace(
            (p, (rows, cols), in_code, 0, 0, 0), (p, (rows, cols), fp8_code, 0, p, p),
            (p, (cols, rows), fp8_code, 0, 0, 0), (p, (cols,), _CODE[dbias_dtype], 0, 0, 0)))
    n = 1
    for d in shape:
        n *= d
    return n


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
