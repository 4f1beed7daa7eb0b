"""Activations (gelu, relu, qgelu, srelu, silu, sigmoid), their gated forms (geglu, reglu, qgeglu,
sreglu, swiglu, glu), backward passes and the fused dbias + dact, with optional FP8 outputs; and
clamped SwiGLU (clamped_swiglu_*: gated, with run-time parameters limit and alpha).

Gated convention: the input's last dim holds 2N values; the FIRST half goes through the
activation, the SECOND half is the linear gate: y = act(x[..., :N]) * x[..., N:].

Each op runs the native kernel for CUDA/ROCm tensors when the native core is built for this
torch and the plain-torch reference (defined here) otherwise. Both compute in fp32 and round once
to the output dtype; an FP8 output is quantize(fp32 result) exactly as kernels.quantize does, with
amax = max|fp32 result|.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from .. import native
from ..native import DTYPE_CODE, address, describe
from ._checks import check_fp8_dtype, check_scalar_fp32, check_tensor
from .cast import quantize_reference

# Code of each base activation in the C API (NVTEActivation) and the gated name of each.
ACTIVATIONS = {"gelu": 0, "relu": 1, "qgelu": 2, "srelu": 3, "silu": 4, "sigmoid": 5}
GATED = {"geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu", "swiglu": "silu",
         "glu": "sigmoid"}


# ----- references ------------------------------------------------------------------------------

_GELU_2K = 2.0 * math.sqrt(2.0 / math.pi)


def _gelu_tanh(x):
    # The tanh approximation written as x * sigmoid(2u): 0.5 (1 + tanh u) == sigmoid(2u). Same
    # function as F.gelu(approximate="tanh"), but without its cancellation in 1 + tanh(u) at
    # very negative x, where F.gelu's fp32 result (and gradient) keeps only a few correct bits.
    return x * torch.sigmoid(_GELU_2K * x * (1.0 + 0.044715 * x * x))


def _base_fn(name):
    return {
        "gelu": _gelu_tanh,
        "relu": F.relu,
        "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
        "srelu": lambda x: F.relu(x) ** 2,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
    }[name]


def activation_fp32_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activation `name` (plain or gated) of x in fp32, differentiable."""
    xf = x.float()
    if name in GATED:
        a, b = xf.chunk(2, dim=-1)
        return _base_fn(GATED[name])(a) * b
    return _base_fn(name)(xf)


def activation_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    """act(x) computed in fp32 and rounded once to x.dtype (differentiable)."""
    return activation_fp32_reference(x, name).to(x.dtype)


def dactivation_fp32_reference(grad: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """dx in fp32: torch autograd of the fp32 reference at x, applied to grad."""
    with torch.enable_grad():
        xf = x.detach().float().requires_grad_(True)
        y = activation_fp32_reference(xf, name)
        (dx,) = torch.autograd.grad(y, xf, grad.float())
    return dx


def dbias_dactivation_reference(grad, x, name, dbias_dtype=None):
    """(dx in fp32, dbias = column sums of the fp32 dx, in dbias_dtype (default x.dtype))."""
    dx = dactivation_fp32_reference(grad, x, name)
    cols = x.shape[-1] if x.dim() else 1
    dbias = dx.reshape(-1, cols).sum(0)
    return dx, dbias.to(dbias_dtype or x.dtype)


# ----- ops -------------------------------------------------------------------------------------

def _check_name(op, name, allow_gated=True):
    names = list(ACTIVATIONS) + (list(GATED) if allow_gated else [])
    if name not in names:
        raise ValueError(f"{op}: activation is {name!r}; expected one of {', '.join(names)}")


def _gated_shapes(op, x, name):
    if name in GATED and (x.dim() == 0 or x.shape[-1] % 2):
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}; gated activation {name} expects "
                         "an even last dimension [..., 2*N]")


def _make_output(op, shape, like, fp8_dtype, scale, amax, scale_inv):
    """Output tensor and, for FP8, the checked/created scale_inv."""
    if fp8_dtype is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device), None
    check_fp8_dtype(op, fp8_dtype, like.device)
    if scale is None:
        raise ValueError(f"{op}: an FP8 output (fp8_dtype={fp8_dtype}) needs a scale")
    check_scalar_fp32(op, "scale", scale, like.device)
    if amax is not None:
        check_scalar_fp32(op, "amax", amax, like.device)
    if scale_inv is None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=like.device)
    else:
        check_scalar_fp32(op, "scale_inv", scale_inv, like.device)
    return torch.empty(shape, dtype=fp8_dtype, device=like.device), scale_inv


def _finish_reference(out, value_fp32, fp8_dtype, scale, amax, scale_inv):
    """Writes the fp32 reference result into out (rounded, or quantized with its metadata)."""
    if fp8_dtype is None:
        out.copy_(value_fp32.to(out.dtype))
        return
    data, ref_si, ref_amax = quantize_reference(value_fp32, scale, fp8_dtype)
    out.copy_(data)
    scale_inv.copy_(ref_si.reshape(scale_inv.shape))
    if amax is not None:
        merged = ref_amax if torch.isnan(ref_amax).any() else torch.maximum(amax.reshape(1), ref_amax)
        amax.copy_(merged.reshape(amax.shape))


def activation_forward(x: torch.Tensor, name: str, fp8_dtype: Optional[torch.dtype] = None,
                       scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                       scale_inv: Optional[torch.Tensor] = None):
    """y = act(x) (plain names) or act(x[..., :N]) * x[..., N:] (gated names).

    Returns y in x.dtype, or (y_fp8, scale_inv) when fp8_dtype is given (scale required; amax,
    if given, is updated in place with max|y| before scaling).
    """
    op = f"activation_forward({name})"
    _check_name(op, name)
    check_tensor(op, "x", x, native.HP_DTYPES)
    _gated_shapes(op, x, name)
    shape = tuple(x.shape[:-1]) + (x.shape[-1] // 2,) if name in GATED else tuple(x.shape)
    out, scale_inv = _make_output(op, shape, x, fp8_dtype, scale, amax, scale_inv)
    if native.use_native(x):
        mod = native.native_for_torch()
        fn = mod.gated_activation if name in GATED else mod.activation
        fn(ACTIVATIONS[GATED.get(name, name)], native.describe(x),
           native.describe(out, amax, scale, scale_inv), native.stream_of(x))
    else:
        _finish_reference(out, activation_fp32_reference(x, name), fp8_dtype, scale, amax, scale_inv)
    return out if fp8_dtype is None else (out, scale_inv)


def activation_backward(grad: torch.Tensor, x: torch.Tensor, name: str,
                        fp8_dtype: Optional[torch.dtype] = None,
                        scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                        scale_inv: Optional[torch.Tensor] = None):
    """dx for y = activation_forward(x, name): grad has y's shape, x is the forward input.

    Returns dx in x.dtype, or (dx_fp8, scale_inv) when fp8_dtype is given.
    """
    op = f"activation_backward({name})"
    _check_name(op, name)
    check_tensor(op, "x", x, native.HP_DTYPES)
    check_tensor(op, "grad", grad, (x.dtype,))
    _gated_shapes(op, x, name)
    want = tuple(x.shape[:-1]) + (x.shape[-1] // 2,) if name in GATED else tuple(x.shape)
    if tuple(grad.shape) != want or grad.device != x.device:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} on {grad.device}; expected "
                         f"{want} on {x.device}")
    out, scale_inv = _make_output(op, tuple(x.shape), x, fp8_dtype, scale, amax, scale_inv)
    if native.use_native(x):
        mod = native.native_for_torch()
        fn = mod.dgated_activation if name in GATED else mod.dactivation
        fn(ACTIVATIONS[GATED.get(name, name)], native.describe(grad), native.describe(x),
           native.describe(out, amax, scale, scale_inv), native.stream_of(x))
    else:
        _finish_reference(out, dactivation_fp32_reference(grad, x, name), fp8_dtype, scale, amax,
                          scale_inv)
    return out if fp8_dtype is None else (out, scale_inv)


def dbias_dactivation(grad: torch.Tensor, x: torch.Tensor, name: str,
                      dbias_dtype: Optional[torch.dtype] = None,
                      fp8_dtype: Optional[torch.dtype] = None,
                      scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                      scale_inv: Optional[torch.Tensor] = None):
    """Fused backward of act(x + bias) for the plain activations: dx = grad * act'(x) and
    dbias = dx summed over all rows (fp32 sums of the unrounded dx), in one pass.

    Returns (dx, dbias), or (dx_fp8, dbias, scale_inv) when fp8_dtype is given.
    """
    op = f"dbias_dactivation({name})"
    _check_name(op, name, allow_gated=False)
    check_tensor(op, "x", x, native.HP_DTYPES)
    check_tensor(op, "grad", grad, (x.dtype,))
    if grad.shape != x.shape or grad.device != x.device:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} on {grad.device}; expected "
                         f"{tuple(x.shape)} on {x.device} like x")
    dbias_dtype = dbias_dtype or x.dtype
    if dbias_dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: dbias_dtype is {dbias_dtype}; expected float32, float16 or bfloat16")
    cols = x.shape[-1] if x.dim() else 1
    out, scale_inv = _make_output(op, tuple(x.shape), x, fp8_dtype, scale, amax, scale_inv)
    dbias = torch.empty(cols, dtype=dbias_dtype, device=x.device)
    if native.use_native(x):
        mod = native.native_for_torch()
        code = ACTIVATIONS[name]
        args = (native.describe(grad), native.describe(x),
                native.describe(out, amax, scale, scale_inv), native.describe(dbias))
        ws_shape = mod.dbias_dactivation_workspace(code, *args)
        ws = torch.empty(ws_shape, dtype=torch.float32, device=x.device)
        mod.dbias_dactivation(code, *args, native.describe(ws), native.stream_of(x))
    else:
        dx, ref_dbias = dbias_dactivation_reference(grad, x, name, dbias_dtype)
        _finish_reference(out, dx, fp8_dtype, scale, amax, scale_inv)
        dbias.copy_(ref_dbias)
    return (out, dbias) if fp8_dtype is None else (out, dbias, scale_inv)


def dbias_reference(grad: torch.Tensor, dbias_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Column sums of grad over all leading dims, accumulated in fp32, in dbias_dtype (default
    grad.dtype)."""
    cols = grad.shape[-1]
    return grad.reshape(-1, cols).sum(0, dtype=torch.float32).to(dbias_dtype or grad.dtype)


# (rows, cols, grad dtype, dbias dtype, device) -> the native workspace shape, asked once
_DBIAS_WS: dict = {}


def dbias(grad: torch.Tensor, dbias_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The bias gradient of a linear layer: dbias[c] = grad[..., c] summed over every leading
    dim. The sums are fp32 in a fixed order (two calls give the same bits) and are returned in
    dbias_dtype (default grad.dtype). No rows give zeros."""
    op = "dbias"
    check_tensor(op, "grad", grad, native.HP_DTYPES)
    if grad.dim() < 2:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}; expected at least 2 dims "
                         "[..., cols]")
    dbias_dtype = dbias_dtype or grad.dtype
    if dbias_dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: dbias_dtype is {dbias_dtype}; expected float32, float16 or bfloat16")
    cols = grad.shape[-1]
    g2 = grad if grad.dim() == 2 else grad.view(-1, cols)
    out = torch.empty(cols, dtype=dbias_dtype, device=grad.device)
    if native.use_native(grad):
        mod = native.native_for_torch()
        args = (native.describe(g2), native.describe(out))
        key = (g2.shape[0], cols, grad.dtype, dbias_dtype, grad.device)
        ws_shape = _DBIAS_WS.get(key)
        if ws_shape is None:
            if len(_DBIAS_WS) >= 256:
                _DBIAS_WS.clear()
            ws_shape = _DBIAS_WS[key] = mod.dbias_workspace(*args)
        ws = torch.empty(ws_shape, dtype=torch.float32, device=grad.device)
        mod.dbias(*args, native.describe(ws), native.stream_of(grad))
    else:
        out.copy_(dbias_reference(g2, dbias_dtype))
    return out


class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name):
        ctx.save_for_backward(x)
        ctx.name = name
        return activation_forward(x, name)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return activation_backward(grad.contiguous(), x, ctx.name), None


def apply_activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """Differentiable act(x) (plain or gated name): native forward and backward kernels on a
    supported GPU, autograd of the reference elsewhere."""
    if native.use_native(x):
        return _Activation.apply(x, name)
    _check_name(f"apply_activation({name})", name)
    return activation_reference(x, name)


# ----- clamped SwiGLU --------------------------------------------------------------------------
# y = a' sigmoid(alpha a') (b' + 1) with a' = min(a, limit), b' = clamp(b, -limit, limit), where
# a = x[..., :N] and b = x[..., N:] (see nvte_clamped_swiglu). The clamps pass the gradient
# inside their closed range, as torch.clamp does.

CLAMPED_SWIGLU = "clamped_swiglu"
CLAMPED_SWIGLU_DEFAULTS = {"limit": 7.0, "alpha": 1.702}


def clamped_swiglu_params(op: str, params: Optional[dict]):
    """(limit, alpha) from an activation_params dict (defaults: limit 7.0, alpha 1.702)."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(CLAMPED_SWIGLU_DEFAULTS))
    if unknown:
        raise ValueError(f"{op}: activation_params has {unknown}; clamped_swiglu takes "
                         f"{sorted(CLAMPED_SWIGLU_DEFAULTS)}")
    limit = float(params.get("limit", CLAMPED_SWIGLU_DEFAULTS["limit"]))
    alpha = float(params.get("alpha", CLAMPED_SWIGLU_DEFAULTS["alpha"]))
    if not (0.0 < limit < math.inf) or not math.isfinite(alpha):
        raise ValueError(f"{op}: activation_params limit={limit}, alpha={alpha}; expected a finite "
                         "limit > 0 and a finite alpha")
    return limit, alpha


def clamped_swiglu_fp32_reference(x: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    a, b = x.float().chunk(2, dim=-1)
    a = a.clamp(max=limit)
    return a * torch.sigmoid(alpha * a) * (b.clamp(-limit, limit) + 1.0)


def _clamped_dx_reference(grad, x, limit, alpha):
    with torch.enable_grad():
        xf = x.detach().float().requires_grad_(True)
        (dx,) = torch.autograd.grad(clamped_swiglu_fp32_reference(xf, limit, alpha), xf,
                                    grad.float())
    return dx


def clamped_swiglu_forward(x: torch.Tensor, limit: float = 7.0, alpha: float = 1.702,
                           fp8_dtype: Optional[torch.dtype] = None,
                           scale: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
                           scale_inv: Optional[torch.Tensor] = None):
    """Clamped SwiGLU of x [..., 2N] -> [..., N] in x.dtype, or (y_fp8, scale_inv) with fp8_dtype."""
    op = "clamped_swiglu_forward"
    limit, alpha = clamped_swiglu_params(op, {"limit": limit, "alpha": alpha})
    check_tensor(op, "x", x, native.HP_DTYPES)
    _gated_shapes(op, x, "glu")
    shape = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    out, scale_inv = _make_output(op, shape, x, fp8_dtype, scale, amax, scale_inv)
    if native.use_native(x):
        native.native_for_torch().clamped_swiglu(
            native.describe(x), native.describe(out, amax, scale, scale_inv), limit, alpha,
            native.stream_of(x))
    else:
        _finish_reference(out, clamped_swiglu_fp32_reference(x, limit, alpha), fp8_dtype, scale,
                          amax, scale_inv)
    return out if fp8_dtype is None else (out, scale_inv)


def clamped_swiglu_backward(grad: torch.Tensor, x: torch.Tensor, limit: float = 7.0,
                            alpha: float = 1.702, fp8_dtype: Optional[torch.dtype] = None,
                            scale: Optional[torch.Tensor] = None,
                            amax: Optional[torch.Tensor] = None,
                            scale_inv: Optional[torch.Tensor] = None):
    """dx [..., 2N] of clamped_swiglu_forward(x) for grad [..., N]."""
    op = "clamped_swiglu_backward"
    limit, alpha = clamped_swiglu_params(op, {"limit": limit, "alpha": alpha})
    check_tensor(op, "x", x, native.HP_DTYPES)
    check_tensor(op, "grad", grad, (x.dtype,))
    _gated_shapes(op, x, "glu")
    want = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    if tuple(grad.shape) != want or grad.device != x.device:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} on {grad.device}; expected "
                         f"{want} on {x.device}")
    out, scale_inv = _make_output(op, tuple(x.shape), x, fp8_dtype, scale, amax, scale_inv)
    if native.use_native(x):
        native.native_for_torch().clamped_dswiglu(
            native.describe(grad), native.describe(x), native.describe(out, amax, scale, scale_inv),
            limit, alpha, native.stream_of(x))
    else:
        _finish_reference(out, _clamped_dx_reference(grad, x, limit, alpha), fp8_dtype, scale,
                          amax, scale_inv)
    return out if fp8_dtype is None else (out, scale_inv)


class _ClampedSwiglu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, limit, alpha):
        ctx.save_for_backward(x)
        ctx.params = (limit, alpha)
        return clamped_swiglu_forward(x, limit, alpha)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return clamped_swiglu_backward(grad.contiguous(), x, *ctx.params), None, None


def apply_clamped_swiglu(x: torch.Tensor, limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """Differentiable clamped SwiGLU: native kernels on a supported GPU, autograd of the
    reference elsewhere."""
    if native.use_native(x):
        return _ClampedSwiglu.apply(x, limit, alpha)
    limit, alpha = clamped_swiglu_params("apply_clamped_swiglu", {"limit": limit, "alpha": alpha})
    return clamped_swiglu_fp32_reference(x, limit, alpha).to(x.dtype)


# ----- the unchecked calls of the modules' eager path (nc: a NativeCall, kernels/eager.py) ------
def activation_fp8_unchecked(nc, x, act_code, gated, fp8_dtype, scale, amax):
    """(act(x) in FP8, scale_inv): the activation kernel casts as it writes (delayed scaling)."""
    shape = (x.shape[0], x.shape[1] // 2) if gated else tuple(x.shape)
    out = torch.empty(shape, dtype=fp8_dtype, device=x.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    fn = nc.mod.gated_activation if gated else nc.mod.activation
    fn(act_code, describe(x), describe(out, address(amax), scale.data_ptr(), scale_inv.data_ptr()), nc.stream)
    return out, scale_inv


def dbias_unchecked(nc, dy, dbias_dtype):
    """The column sums of a contiguous 2-D dy (a bias gradient) in dbias_dtype: one binding call
    with flat arguments, the partial sums in the call's GEMM workspace (dbias_direct)."""
    rows, cols = dy.shape
    db = torch.empty(cols, dtype=dbias_dtype, device=dy.device)
    nc.mod.dbias_direct(dy.data_ptr(), rows, cols, DTYPE_CODE[dy.dtype], db.data_ptr(), DTYPE_CODE[dbias_dtype],
                        nc.env)
    return db


# (act, shape, dtypes, device) -> the native workspace shape of the fused dact+dbias, asked once
_DBIAS_DACT_WS: dict = {}


def dbias_dactivation_fp8_unchecked(nc, grad, x, act_code, dbias_dtype, fp8_dtype, scale, amax):
    """(dx in FP8, dbias, scale_inv) of a plain activation in one pass."""
    out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    dbias = torch.empty(x.shape[-1], dtype=dbias_dtype, device=x.device)
    args = (describe(grad), describe(x), describe(out, address(amax), scale.data_ptr(), scale_inv.data_ptr()),
            describe(dbias))
    key = (act_code, tuple(x.shape), x.dtype, fp8_dtype, dbias_dtype, x.device)
    ws_shape = _DBIAS_DACT_WS.get(key)
    if ws_shape is None:
        ws_shape = _DBIAS_DACT_WS[key] = nc.mod.dbias_dactivation_workspace(act_code, *args)
    ws = torch.empty(ws_shape, dtype=torch.float32, device=x.device)
    nc.mod.dbias_dactivation(act_code, *args, describe(ws), nc.stream)
    return out, dbias, scale_inv
