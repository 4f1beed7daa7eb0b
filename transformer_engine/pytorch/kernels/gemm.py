"""General GEMM with FP8 scaling and fused epilogues (nvte_gemm), in row-major torch terms.

    out = op_b(B) @ op_a(A)        op_a(A) = A.T if layout[0] == "T" else A
                                   op_b(B) = B.T if layout[1] == "T" else B

A is viewed as 2-D [prod(shape[:-1]), shape[-1]], B likewise. With transb = "N", out keeps
B's leading dimensions (out.shape = B.shape[:-1] + (m,)); with "T" it is [n, m]. A Linear layer
with weight W [out_features, in_features], input X [..., in] and output gradient dY [..., out]:

    fprop   Y  = X @ W.T     general_gemm(W, X, layout="TN", bias=b, gelu=...)
    dgrad   dX = dY @ W      general_gemm(W, dY, layout="NN", gelu_input=..., bias_grad=...)
    wgrad   dW = dY.T @ X    general_gemm(X2d, dY2d, layout="NT", out=main_grad, accumulate=True,
                             use_split_accumulator=True)

FP8 operands (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3) carry their scale_inv (value = stored *
scale_inv); m, n, k must then be multiples of 16, and NVIDIA GPUs before Blackwell take FP8 only
in the TN layout (make transposed copies with cast_transpose). FP8 output: out_scale quantises,
out_amax is updated with max|result| (before scaling) and out_scale_inv receives 1/out_scale.

Epilogues (r = alpha * product [+ out when accumulate] [+ addend], in fp32):
    bias                out = r + bias
    gelu=True           gelu_input = r (+ bias);  out = gelu(gelu_input)     (tanh GELU)
    gelu_input=x        out = r * gelu'(x)        [bias_grad=True: also sum(out, rows)]
    bias_grad=True      out = r;  bias_grad = sum(op_b(B), k)   (no gelu_input: layout "NT" and
                        high-precision operands; a Linear's wgrad with its bias gradient, B = dY)
    addend=t            r includes + t: added with the product, before the bias and the activation
                        (like bias: gelu=True gives gelu(product + addend + bias)). t has out's
                        shape and dtype (high-precision out only) and is read, never written; the
                        GEMM reads it as its C operand (nvte_gemm_with_c, beta = 1), so a residual
                        add costs no extra kernel:  Y = X @ W.T + b + residual  is
                        general_gemm(W, X, layout="TN", bias=b, addend=residual).
                        Exclusive with accumulate=True (which adds out itself).
Returns GemmOutput(out, bias_grad, gelu_input), None for the parts not asked for.

The native path runs on CUDA/ROCm tensors when the native core is built for this torch; the
reference (dequantize, matmul in fp32, epilogue, cast) runs everywhere else. A GEMM workspace
is allocated once per device and stream through torch's caching allocator and reused by every
call on that stream (see gemm_workspace_raw).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple, Optional

import torch

from .. import native
from ..native import DTYPE_CODE, describe
from ._checks import check_fp8_dtype, check_scalar_fp32, check_tensor
from .cast import fp8_max_of

OP = "general_gemm"

# NVTEGemmEpilogue values (transformer_engine/gemm.h).
EPILOGUE_NONE, EPILOGUE_BIAS, EPILOGUE_GELU_AUX, EPILOGUE_BIAS_GELU_AUX = 0, 1, 2, 3
EPILOGUE_DGELU, EPILOGUE_DGELU_BGRAD, EPILOGUE_BGRADB = 4, 5, 6

_GELU_C = math.sqrt(2.0 / math.pi)


class GemmOutput(NamedTuple):
    out: torch.Tensor
    bias_grad: Optional[torch.Tensor]
    gelu_input: Optional[torch.Tensor]


# ----- workspace -------------------------------------------------------------------------------

_WORKSPACES: "OrderedDict[tuple, tuple]" = OrderedDict()  # (device index, stream) -> workspace
_MAX_WORKSPACES = 8


def gemm_workspace_raw(index: int, stream: int):
    """(buffer, address, bytes) of the GEMM workspace of a device and stream
    (nvte_gemm_workspace_size() bytes), made once and reused.

    GEMMs on one stream run one after another, so one buffer per (device, stream) serves them
    all; GEMMs on two streams may overlap, and a shared buffer would let one overwrite the other's
    scratch mid-GEMM. The buffer is allocated on that stream (the current one), so when it is
    dropped (more than _MAX_WORKSPACES streams in use: the least recently used goes) the caching
    allocator reuses it only in that stream's order. A buffer first needed while a CUDA graph is
    being captured is not cached: it belongs to the graph's private memory pool."""
    key = (index, stream)
    entry = _WORKSPACES.get(key)
    if entry is not None:
        _WORKSPACES.move_to_end(key)
        return entry
    # index None: a CPU tensor, which only the emulated AMD build runs natively
    device = torch.device("cuda", index) if index is not None else torch.device("cpu")
    size = native.native_for_torch().gemm_workspace_size()
    if device.type == "cuda":
        ws = torch.empty(size, dtype=torch.uint8, device=device)
    else:  # the CPU allocator aligns to 64 bytes; the C API wants 256
        raw = torch.empty(size + 256, dtype=torch.uint8)
        offset = -raw.data_ptr() % 256
        ws = raw[offset:offset + size]
    entry = (ws, ws.data_ptr(), ws.numel())
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        _WORKSPACES[key] = entry
        if len(_WORKSPACES) > _MAX_WORKSPACES:
            _WORKSPACES.popitem(last=False)
    return entry


def gemm_workspace(device: torch.device) -> torch.Tensor:
    """The GEMM workspace of the device's current stream (see gemm_workspace_raw)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return gemm_workspace_raw(index, native.stream_handle(index))[0]


# ----- reference -------------------------------------------------------------------------------

def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + 0.044715 * x * x * x)))


def dgelu_tanh(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(_GELU_C * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    # explicit row count: reshape(-1, 0) is ambiguous for k = 0
    return t.reshape(1, 1) if t.dim() == 0 else t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def gemm_reference(A, B, transa, transb, out, *, A_scale_inv=None, B_scale_inv=None, bias=None,
                   aux=None, epilogue=EPILOGUE_NONE, alpha=1.0, beta=0.0, out_scale=None,
                   out_amax=None, out_scale_inv=None, bias_out=None, addend=None):
    """Plain-torch nvte_gemm_with_c: fills `out` (and aux / bias_out / the FP8 metadata) in place.
    The addend C is `addend`, or `out` itself when None (nvte_gemm); read when beta != 0."""
    a = A.float() * A_scale_inv if A_scale_inv is not None else A.float()
    b = B.float() * B_scale_inv if B_scale_inv is not None else B.float()
    a, b = _as_2d(a), _as_2d(b)
    r = alpha * ((b.t() if transb else b) @ (a.t() if transa else a))
    if beta != 0.0:
        r = r + beta * _as_2d(addend if addend is not None else out).float()
    if epilogue in (EPILOGUE_BIAS, EPILOGUE_BIAS_GELU_AUX):
        r = r + bias.float().reshape(1, -1)
    if epilogue in (EPILOGUE_GELU_AUX, EPILOGUE_BIAS_GELU_AUX):
        aux.copy_(r.reshape(aux.shape))
        r = gelu_tanh(r)
    if epilogue in (EPILOGUE_DGELU, EPILOGUE_DGELU_BGRAD):
        r = r * dgelu_tanh(_as_2d(aux).float())
    if epilogue == EPILOGUE_DGELU_BGRAD:
        bias_out.copy_(r.sum(0).reshape(bias_out.shape))
    if epilogue == EPILOGUE_BGRADB:  # sum over k of op_b(B) [n, k]
        bias_out.copy_((b.t() if transb else b).sum(1).reshape(bias_out.shape))
    if out.dtype in native.FP8_DTYPES:
        limit = fp8_max_of(out.dtype)
        if out_amax is not None and r.numel():
            cur = r.abs().amax().reshape(out_amax.shape)
            out_amax.copy_(cur if torch.isnan(cur).any() else torch.maximum(out_amax, cur))
        if out_scale_inv is not None:
            out_scale_inv.copy_((1.0 / out_scale).reshape(out_scale_inv.shape))
        r = (r * out_scale).clamp(-limit, limit)
    out.copy_(r.reshape(out.shape))
    return out


# ----- the op ----------------------------------------------------------------------------------

def _parse_layout(layout: str):
    if not isinstance(layout, str) or len(layout) != 2 or any(c not in "TN" for c in layout):
        raise ValueError(f"{OP}: layout is {layout!r}; expected two of 'T'/'N', e.g. 'TN', 'NN', 'NT'")
    return layout[0] == "T", layout[1] == "T"


def _dims(A, B, transa, transb):
    a_rows, a_cols = (1, 1) if A.dim() == 0 else (math.prod(A.shape[:-1]), A.shape[-1])
    b_rows, b_cols = (1, 1) if B.dim() == 0 else (math.prod(B.shape[:-1]), B.shape[-1])
    m, k = (a_rows, a_cols) if transa else (a_cols, a_rows)
    n, kb = (b_cols, b_rows) if transb else (b_rows, b_cols)
    if kb != k:
        raise ValueError(f"{OP}: A {tuple(A.shape)} and B {tuple(B.shape)} disagree on the reduction "
                         f"dimension for layout {'T' if transa else 'N'}{'T' if transb else 'N'}: "
                         f"k={k} from A, {kb} from B")
    return m, n, k


def _check_operands(A, B, A_scale_inv, B_scale_inv):
    check_tensor(OP, "A", A, native.HP_DTYPES + native.FP8_DTYPES)
    check_tensor(OP, "B", B, native.HP_DTYPES + native.FP8_DTYPES)
    if B.device != A.device:
        raise ValueError(f"{OP}: B is on {B.device}; expected {A.device} like A")
    fp8 = A.dtype in native.FP8_DTYPES
    if fp8 != (B.dtype in native.FP8_DTYPES):
        raise ValueError(f"{OP}: A ({A.dtype}) and B ({B.dtype}) must both be FP8 or both high precision")
    if not fp8:
        if A.dtype != B.dtype:
            raise ValueError(f"{OP}: A ({A.dtype}) and B ({B.dtype}) must have the same dtype")
        return False
    check_fp8_dtype(OP, A.dtype, A.device)
    check_fp8_dtype(OP, B.dtype, A.device)
    if "e5m2" in str(A.dtype) and "e5m2" in str(B.dtype):
        raise NotImplementedError(f"{OP}: float8_e5m2 x float8_e5m2 has no GEMM kernels; quantize "
                                  "one operand to E4M3")
    for name, s in (("A_scale_inv", A_scale_inv), ("B_scale_inv", B_scale_inv)):
        if s is None:
            raise ValueError(f"{OP}: {name} is required for FP8 operands")
        check_scalar_fp32(OP, name, s, A.device)
    return True


def _out_dtype(A, fp8_in, out_dtype, out):
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else (torch.bfloat16 if fp8_in else A.dtype)
    allowed = native.HP_DTYPES + native.FP8_DTYPES if fp8_in else (A.dtype, torch.float32)
    if out_dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{OP}: out_dtype is {out_dtype}; expected one of {names}")
    return out_dtype


def _check_addend(addend, accumulate, fp8_out, out_dtype, out_shape, n, m, device):
    if accumulate:
        raise ValueError(f"{OP}: addend and accumulate=True are exclusive (both are the GEMM's C "
                         "operand: accumulate adds out, addend another tensor)")
    if fp8_out:
        raise ValueError(f"{OP}: addend needs a high-precision out; out_dtype is {out_dtype}")
    check_tensor(OP, "addend", addend, (out_dtype,))
    if addend.numel() != n * m or (addend.dim() and addend.shape[-1] != m):
        raise ValueError(f"{OP}: addend has shape {tuple(addend.shape)}; expected out's shape "
                         f"{out_shape}")
    if addend.device != device:
        raise ValueError(f"{OP}: addend is on {addend.device}; expected {device}")


def general_gemm(A: torch.Tensor, B: torch.Tensor, out_dtype: Optional[torch.dtype] = None, *,
                 layout: str = "TN", A_scale_inv: Optional[torch.Tensor] = None,
                 B_scale_inv: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                 gelu: bool = False, gelu_input: Optional[torch.Tensor] = None,
                 bias_grad: bool = False, out: Optional[torch.Tensor] = None,
                 accumulate: bool = False, alpha: float = 1.0,
                 out_scale: Optional[torch.Tensor] = None, out_amax: Optional[torch.Tensor] = None,
                 out_scale_inv: Optional[torch.Tensor] = None,
                 use_split_accumulator: bool = False,
                 addend: Optional[torch.Tensor] = None) -> GemmOutput:
    """out = op_b(B) @ op_a(A) (+ addend) with an optional epilogue; see the module docstring.

    out_dtype defaults to out's dtype, else A's (bfloat16 for FP8 operands). `out` is written in
    place (accumulate=True adds to it: beta = 1). addend (out's shape and dtype) is added in the
    GEMM itself, before the bias and GELU; not with accumulate=True. bias is cast to the dtype the
    GEMM needs (out's, or bfloat16 for an FP8 out). use_split_accumulator=True turns FP8 fast
    accumulation off (the precise mode, for wgrad); the default keeps it on, as for forward
    GEMMs."""
    transa, transb = _parse_layout(layout)
    fp8_in = _check_operands(A, B, A_scale_inv, B_scale_inv)
    m, n, k = _dims(A, B, transa, transb)
    out_dtype = _out_dtype(A, fp8_in, out_dtype, out)
    fp8_out = out_dtype in native.FP8_DTYPES
    device = A.device
    if fp8_in and (m % 16 or n % 16 or k % 16):
        raise ValueError(f"{OP}: FP8 GEMM needs m, n and k to be multiples of 16; got m={m} n={n} "
                         f"k={k} (pad the token dimension or use a high-precision GEMM)")
    if fp8_out:
        check_fp8_dtype(OP, out_dtype, device)
        if out_scale is None:
            raise ValueError(f"{OP}: out_scale is required for an FP8 out_dtype ({out_dtype})")
        for name, s in (("out_scale", out_scale), ("out_amax", out_amax), ("out_scale_inv", out_scale_inv)):
            if s is not None:
                check_scalar_fp32(OP, name, s, device)

    out_shape = (tuple(B.shape[:-1]) + (m,)) if (not transb and B.dim() >= 1) else (n, m)
    if out is None:
        if accumulate:
            raise ValueError(f"{OP}: accumulate=True needs `out` (the buffer accumulated into)")
        out = torch.empty(out_shape, dtype=out_dtype, device=device)
    else:
        check_tensor(OP, "out", out, (out_dtype,))
        if out.numel() != n * m or (out.dim() and out.shape[-1] != m):
            raise ValueError(f"{OP}: out has shape {tuple(out.shape)}; expected {out_shape}")
        if out.device != device:
            raise ValueError(f"{OP}: out is on {out.device}; expected {device}")
    if accumulate and fp8_out:
        raise ValueError(f"{OP}: accumulate=True needs a high-precision out; out_dtype is {out_dtype}")
    if addend is not None:
        _check_addend(addend, accumulate, fp8_out, out_dtype, out_shape, n, m, device)

    # Epilogue and its tensors. Bias and GELU input follow out's dtype (16-bit for an FP8 out).
    side_dtype = out_dtype if not fp8_out else torch.bfloat16
    aux_dtype = out_dtype if not fp8_out else torch.float16  # cuBLASLt: E4M3 D takes fp16 aux
    if gelu and gelu_input is not None:
        raise ValueError(f"{OP}: gelu=True (forward) and gelu_input (backward) are exclusive")
    if gelu_input is not None and bias is not None:
        raise ValueError(f"{OP}: bias is added only by forward epilogues, not with gelu_input")
    if bias_grad and gelu_input is None and (not transb or fp8_in):
        raise ValueError(f"{OP}: bias_grad=True without gelu_input sums op_b(B) over k (the wgrad "
                         f"layout 'NT' with high-precision operands); got layout {layout!r} with "
                         f"{A.dtype} operands")
    bias_out = aux = None
    if bias is not None:
        check_tensor(OP, "bias", bias, native.HP_DTYPES)
        if bias.numel() != m:
            raise ValueError(f"{OP}: bias has shape {tuple(bias.shape)}; expected ({m},)")
        bias = bias.to(device=device, dtype=side_dtype)
    if gelu:
        epilogue = EPILOGUE_BIAS_GELU_AUX if bias is not None else EPILOGUE_GELU_AUX
        aux = torch.empty(out_shape, dtype=aux_dtype, device=device)
    elif gelu_input is not None:
        epilogue = EPILOGUE_DGELU_BGRAD if bias_grad else EPILOGUE_DGELU
        check_tensor(OP, "gelu_input", gelu_input, native.HP_DTYPES)
        if gelu_input.numel() != n * m:
            raise ValueError(f"{OP}: gelu_input has shape {tuple(gelu_input.shape)}; expected {out_shape}")
        aux = gelu_input.to(aux_dtype)
        if bias_grad:
            bias_out = torch.empty(m, dtype=side_dtype, device=device)
    elif bias_grad:
        if bias is not None:
            raise ValueError(f"{OP}: bias (added) and bias_grad=True (summed) are exclusive")
        epilogue = EPILOGUE_BGRADB
        bias_out = torch.empty(n, dtype=side_dtype, device=device)
    else:
        epilogue = EPILOGUE_BIAS if bias is not None else EPILOGUE_NONE
    bias_arg = bias if bias is not None else bias_out
    beta = 1.0 if (accumulate or addend is not None) else 0.0

    if native.use_native(A):
        stream = native.stream_of(A)
        _, ws_ptr, ws_size = gemm_workspace_raw(A.device.index, stream)
        native.native_for_torch().gemm(
            native.describe(A, scale_inv=A_scale_inv), transa,
            native.describe(B, scale_inv=B_scale_inv), transb,
            native.describe(out, out_amax, out_scale, out_scale_inv),
            native.describe(bias_arg) if bias_arg is not None else None,
            native.describe(aux) if aux is not None else None,
            epilogue, float(alpha), beta, not use_split_accumulator,
            ws_ptr, ws_size, stream, native.describe(addend) if addend is not None else None)
    else:
        gemm_reference(A, B, transa, transb, out, A_scale_inv=A_scale_inv, B_scale_inv=B_scale_inv,
                       bias=bias, aux=aux, epilogue=epilogue, alpha=alpha, beta=beta,
                       out_scale=out_scale, out_amax=out_amax, out_scale_inv=out_scale_inv,
                       bias_out=bias_out, addend=addend)
    return GemmOutput(out, bias_out, aux if gelu else None)


# ----- the unchecked call of the modules' eager path ----------------------------------------------
def _unchecked_epilogue(bias, bias_grad):
    """(epilogue, bias-side descriptor or None): bias added, or B's column sums into bias_grad."""
    if bias is not None:
        return EPILOGUE_BIAS, describe(bias)
    if bias_grad is not None:
        return EPILOGUE_BGRADB, describe(bias_grad)
    return EPILOGUE_NONE, None


def gemm_unchecked(nc, A, transa, B, transb, out, A_sinv=None, B_sinv=None, bias=None, beta=0.0,
                   fast_accum=True, bias_grad=None, *, addend=None):
    """The unchecked native GEMM of the modules' eager path (nc: a NativeCall, kernels/eager.py):
    out = op(B) @ op(A) (+ bias) (+ beta * out) with the layouts above (transa / transb). bias_grad
    (layout NT, high precision: a wgrad) receives the column sums of B in the same GEMM.
    addend (out's shape and dtype, high-precision out): out = op(B) @ op(A) + addend (+ bias), the
    addend read by the GEMM as its C operand (beta 1; exclusive with beta != 0, accumulation
    into out). The C API checks the addend's shape and dtype."""
    a = (A.data_ptr(), A.shape, DTYPE_CODE[A.dtype], 0, 0, A_sinv.data_ptr() if A_sinv is not None else 0)
    b = (B.data_ptr(), B.shape, DTYPE_CODE[B.dtype], 0, 0, B_sinv.data_ptr() if B_sinv is not None else 0)
    epilogue, side = _unchecked_epilogue(bias, bias_grad)
    if addend is None:
        nc.mod.gemm(a, transa, b, transb, describe(out), side, None, epilogue, 1.0, beta, fast_accum,
                    nc.ws_ptr, nc.ws_size, nc.stream)
        return out
    if beta != 0.0:
        raise ValueError(f"gemm_unchecked: addend and beta={beta} (accumulation into out) are "
                         f"exclusive")
    nc.mod.gemm(a, transa, b, transb, describe(out), side, None, epilogue, 1.0, 1.0, fast_accum,
                nc.ws_ptr, nc.ws_size, nc.stream, describe(addend))
    return out
