"""The eager hot path of the modules on a GPU with the native core: direct calls into the
bindings with descriptors built inline, no argument checks (the module validated shapes and
dtypes once per call) and no per-call scale tensors (scale/amax are passed as pointers into the
module's recipe state). Everything else (reference backend, torch.compile tracing, checkpoint
recompute, calibration) goes through the checked ops. Same kernels, same bits either way."""
from __future__ import annotations

import torch

from .. import native
from ..ops.gemm import EPILOGUE_BIAS, EPILOGUE_NONE, gemm_workspace

_CODE = native.DTYPE_CODE
_AMAX_MOST_RECENT = 1


_raw_stream_of_index = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_WORKSPACES: dict = {}


def raw_stream(device: torch.device) -> int:
    """The current stream's handle (torch's raw query: no Stream object is made)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream_of_index is not None:
        return _raw_stream_of_index(index)
    return torch.cuda.current_stream(device).cuda_stream


class NativeCall:
    """The native module, stream and GEMM workspace of one module call."""
    __slots__ = ("mod", "stream", "ws_ptr", "ws_size", "device")

    def __init__(self, mod, device):
        self.mod, self.device = mod, device
        self.stream = raw_stream(device)
        ws = _WORKSPACES.get(device)
        if ws is None:
            w = gemm_workspace(device)
            ws = (w.data_ptr(), w.numel())
            if not torch.cuda.is_current_stream_capturing():
                _WORKSPACES[device] = ws
        self.ws_ptr, self.ws_size = ws


def native_call(x: torch.Tensor):
    """A NativeCall when x runs on the native core in eager mode, else None."""
    if not x.is_cuda or torch.compiler.is_compiling():
        return None
    mod = native.native_for_torch()
    return NativeCall(mod, x.device) if mod is not None else None


def _desc(t, amax=0, scale=0, scale_inv=0):
    return (t.data_ptr(), t.shape, _CODE[t.dtype], amax, scale, scale_inv)


def gemm(nc, A, transa, B, transb, out, A_sinv=None, B_sinv=None, bias=None, beta=0.0,
         fast_accum=True):
    """out = op(B) @ op(A) (+ bias) (+ beta * out): see ops/gemm.py for the layouts."""
    a = (A.data_ptr(), A.shape, _CODE[A.dtype], 0, 0, A_sinv.data_ptr() if A_sinv is not None else 0)
    b = (B.data_ptr(), B.shape, _CODE[B.dtype], 0, 0, B_sinv.data_ptr() if B_sinv is not None else 0)
    nc.mod.gemm(a, transa, b, transb, _desc(out), _desc(bias) if bias is not None else None, None,
                EPILOGUE_BIAS if bias is not None else EPILOGUE_NONE, 1.0, beta, fast_accum,
                nc.ws_ptr, nc.ws_size, nc.stream)
    return out


def cast(nc, rs, x, forward: bool, slot: int, need_transpose: bool):
    """(data, data_t or None, scale_inv) of a 2-D tensor in the recipe's FP8 format.

    DelayedScaling: the module's scale, amax recorded into the history row. Current scaling:
    amax into the (1-row) history, then the update kernel turns it into the scale (fp8_max /
    amax, clearing the row again), then the cast: three launches, no torch ops."""
    ptrs = rs._ptrs or rs._pointers()
    hist, scale, sinv_state, fp8_max = ptrs[0] if forward else ptrs[1]
    off = 4 * slot
    dtype = rs.fwd_dtype if forward else rs.bwd_dtype
    shape, device = x.shape, x.device
    x_desc = (x.data_ptr(), shape, _CODE[x.dtype], 0, 0, 0)
    if rs.delayed:
        amax_ptr = hist + off
    else:
        nc.mod.compute_amax(x_desc, hist + off, nc.stream)
        nc.mod.delayed_scaling_update([(hist + off, scale + off, sinv_state + off, 1, 1, fp8_max)],
                                      _AMAX_MOST_RECENT, 0.0, nc.stream)
        amax_ptr = 0
    scale_inv = torch.empty(1, dtype=torch.float32, device=device)
    out = torch.empty(shape, dtype=dtype, device=device)
    code = _CODE[dtype]
    out_desc = (out.data_ptr(), shape, code, amax_ptr, scale + off, scale_inv.data_ptr())
    if need_transpose:
        out_t = torch.empty((shape[1], shape[0]), dtype=dtype, device=device)
        nc.mod.cast_transpose(x_desc, out_desc, (out_t.data_ptr(), out_t.shape, code, 0, 0, 0), nc.stream)
        return out, out_t, scale_inv
    nc.mod.quantize(x_desc, out_desc, nc.stream)
    return out, None, scale_inv


def usable(fi) -> bool:
    """The fast path covers plain FP8/high-precision calls; calibration, checkpoint recompute
    and power-of-2 current scaling take the checked ops."""
    if fi.calibrating or fi.replay is not None or fi.record is not None:
        return False
    return fi.rs is None or fi.rs.delayed or not fi.rs.recipe.use_power_2_scales
