"""The eager native call of the modules: the native module, stream and GEMM workspace of one call
(NativeCall), made once per (device, stream), and the buffers the unchecked calls write into
without a torch.empty per output: arenas (several outputs in one allocation), the per-stream
scratch of a fused call and the shared gradient buffer of a small step. The per-family files
(gemm.py, cast.py, normalization.py, ...) and linear_step.py take a NativeCall; None means the
checked op serves (reference backend, torch.compile tracing)."""
from __future__ import annotations

import math

import torch

from .. import native
from .gemm import gemm_workspace_raw

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
        # the Linear step's bindings take these three as one tuple (csrc/bindings/linear_step.cpp)
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


def stream_capturing(stream: int) -> bool:
    """Whether the current stream (handle `stream`) is being captured into a graph. The legacy
    default stream (handle 0) never is (CUDA refuses it): no query there."""
    if not stream:
        return False
    return _is_capturing() if _is_capturing is not None else torch.cuda.is_current_stream_capturing()


# ----- arenas: several outputs of a step in one allocation ---------------------------------------
# torch.empty costs several microseconds of host time on a slow host, more than a launch; the
# Linear step makes its FP8 operands (data, transpose, scale_inv, workspaces) as regions of a
# few uint8 buffers, grouped by lifetime (forward-only scratch, kept for backward), laid out by
# the step's native plan (csrc/bindings/linear_step.h). Regions start on 256-byte boundaries
# (the vectorised kernels want 16 bytes, cuBLASLt more for FP8 scale pointers; the caching
# allocator's blocks are 512-aligned).
_ALIGN = 256


def aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) & -_ALIGN


def arena(nbytes: int, device) -> torch.Tensor:
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


# Buffers that live only within one fused native call (linear_step.cpp: the forward's FP8 x and W,
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
