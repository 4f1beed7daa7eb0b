"""The GEMMs of a linear layer, in high precision or FP8, shared by Linear, LayerNormLinear,
LayerNormMLP and GroupedLinear: the chooser of the GEMM family. In eager mode on the native core
the unchecked call of kernels/gemm.py runs (the module checked shapes and dtypes); otherwise the
checked op (dispatch: the kernel or, traced, its custom op). See kernels/gemm.py for the layouts:

    fprop  y  = x @ W.T (+ b)   TN: A = W  [out, in],      B = x  [tokens, in]
    dgrad  dx = dy @ W          FP8 TN: A = W.T (cached),  B = dy; high precision NN
    wgrad  dW = dy.T @ x        FP8 TN: A = x.T, B = dy.T;  high precision NT
FP8 wgrad uses the split (precise) accumulator; with fuse_wgrad_accumulation it adds into the
weight's fp32 `main_grad` (beta = 1) and the weight gets no .grad.
"""
from __future__ import annotations

import torch

from . import dispatch as K
from .activation import bias_grad_of
from ..kernels import eager
from ..kernels.gemm import GemmOutput, gemm_unchecked


def _direct(x):
    """The direct native call for an eager 2-D GEMM operand (kernels/eager.py), else None."""
    return eager.native_call(x) if x.dim() == 2 else None


def _bias_for(bias, dtype):
    return bias if bias is None or bias.dtype == dtype else bias.to(dtype)


def _into(out, result):
    """result, or out holding it when the caller gave an output buffer."""
    if out is None:
        return result
    out.copy_(result)
    return out


def fprop_hp(w, x2d, bias=None, addend=None, out=None):
    """y = x2d @ w.T (+ bias) (+ addend, a residual of y's shape and dtype, contiguous) in high
    precision: the direct native call in eager mode (no argument checks: the module checked
    shapes and dtypes), else the checked op. out: a contiguous buffer of y's shape and dtype to
    write y into (GroupedLinear's row blocks)."""
    nc = _direct(x2d) if x2d.shape[0] > 0 and w.dtype == x2d.dtype else None
    if nc is None:
        return _into(out, K.general_gemm(w, x2d, layout="TN", bias=bias, addend=addend).out)
    if out is None:
        out = torch.empty(x2d.shape[0], w.shape[0], dtype=x2d.dtype, device=x2d.device)
    return gemm_unchecked(nc, w, True, x2d, False, out, bias=_bias_for(bias, x2d.dtype), addend=addend)


def fprop_fp8(wq, w_sinv, xq, x_sinv, out_dtype, bias=None, gelu=False, addend=None, out=None):
    nc = None if gelu else _direct(xq)
    if nc is not None:
        if out is None:
            out = torch.empty(xq.shape[0], wq.shape[0], dtype=out_dtype, device=xq.device)
        return GemmOutput(gemm_unchecked(nc, wq, True, xq, False, out, w_sinv, x_sinv,
                                       _bias_for(bias, out_dtype), addend=addend), None, None)
    res = K.general_gemm(wq, xq, out_dtype, layout="TN", A_scale_inv=w_sinv, B_scale_inv=x_sinv,
                         bias=bias, gelu=gelu, addend=addend)
    return res if out is None else res._replace(out=_into(out, res.out))


def dgrad_fp8(wq_t, w_sinv, dyq, dy_sinv, out_dtype, out=None):
    nc = _direct(dyq)
    if nc is not None:
        if out is None:
            out = torch.empty(dyq.shape[0], wq_t.shape[0], dtype=out_dtype, device=dyq.device)
        return gemm_unchecked(nc, wq_t, True, dyq, False, out, w_sinv, dy_sinv)
    return _into(out, K.general_gemm(wq_t, dyq, out_dtype, layout="TN", A_scale_inv=w_sinv,
                                     B_scale_inv=dy_sinv).out)


_MAIN_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def wgrad_out(weight, fuse_wgrad_accumulation: bool, who: str = "fuse_wgrad_accumulation=True"):
    """(out buffer, accumulate) for the weight gradient: main_grad when fused, else new.
    main_grad must be a contiguous tensor of the weight's shape and device (fp32, or bf16 /
    fp16): the direct path's wgrad GEMM adds into it by address, so a smaller or strided buffer
    would be written past its end, and another device's would fault. who: the public module,
    for the error."""
    if not fuse_wgrad_accumulation:
        return None, False
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise ValueError(f"{who}: fuse_wgrad_accumulation=True needs weight.main_grad (an fp32 "
                         f"tensor of the weight's shape) to accumulate into; set it before backward")
    if (main_grad.shape != weight.shape or not main_grad.is_contiguous()
            or main_grad.dtype not in _MAIN_GRAD_DTYPES
            or main_grad.device != weight.device):
        layout = "contiguous" if main_grad.is_contiguous() else "strided"
        raise ValueError(f"{who}: weight.main_grad is a {layout} {str(main_grad.dtype)[6:]} tensor "
                         f"of shape {tuple(main_grad.shape)} on {main_grad.device}; expected a "
                         f"contiguous float32 (or bfloat16 / float16) tensor of the weight's shape "
                         f"{tuple(weight.shape)} on {weight.device}")
    return main_grad, True


def wgrad_fp8(xq_t, x_sinv, dyq_t, dy_sinv, out_dtype, weight, fuse):
    out, acc = wgrad_out(weight, fuse)
    nc = _direct(dyq_t)
    if nc is not None:
        if out is None:
            out = torch.empty(dyq_t.shape[0], xq_t.shape[0], dtype=out_dtype, device=dyq_t.device)
        gemm_unchecked(nc, xq_t, True, dyq_t, False, out, x_sinv, dy_sinv, beta=1.0 if acc else 0.0,
                   fast_accum=False)
        return None if fuse else out
    res = K.general_gemm(xq_t, dyq_t, out.dtype if out is not None else out_dtype, layout="TN",
                           A_scale_inv=x_sinv, B_scale_inv=dy_sinv, out=out,
                           accumulate=acc, use_split_accumulator=True).out
    return None if fuse else res


def wgrad_hp(x2d, dy2d, weight, fuse, out_features: int, in_features: int):
    out, acc = wgrad_out(weight, fuse)
    if x2d.shape[0] == 0:
        if fuse:
            return None
        return torch.zeros(out_features, in_features, dtype=dy2d.dtype, device=dy2d.device)
    nc = _direct(dy2d) if x2d.dtype == dy2d.dtype else None
    if nc is not None:
        if out is None:
            out = torch.empty(out_features, in_features, dtype=dy2d.dtype, device=dy2d.device)
        gemm_unchecked(nc, x2d, False, dy2d, True, out, beta=1.0 if acc else 0.0)
        return None if fuse else out
    res = K.general_gemm(x2d, dy2d, out.dtype if out is not None else dy2d.dtype, layout="NT",
                           out=out, accumulate=acc).out
    return None if fuse else res


# The wgrad GEMM's bias-gradient epilogue (BGRADB) saves a launch, not a pass over dY: cuBLASLt
# runs it as a second kernel, and a slower one than a plain column sum (H100, dY 16384 x 16384
# bf16: 0.30 ms against 0.18 ms for torch's sum, which is at copy bandwidth). It therefore
# serves only small gradients, where the launch (host time) is what costs.
EPILOGUE_BIAS_GRAD_MAX_ELEMENTS = 1 << 22


def bias_grad_in_wgrad_epilogue(dy2d: torch.Tensor) -> bool:
    """Whether the high-precision wgrad GEMM should also sum dY's columns (see above)."""
    return dy2d.numel() <= EPILOGUE_BIAS_GRAD_MAX_ELEMENTS


def wgrad_bgrad_hp(x2d, dy2d, weight, fuse, out_features: int, in_features: int, bias_dtype):
    """(wgrad_hp's dW, the bias gradient): on the direct path, with dW in the bias's dtype (not
    accumulated into an fp32 main_grad) and a small dY, the wgrad GEMM sums dY's columns in its
    epilogue, which saves a launch; otherwise bias_grad_of."""
    nc = (_direct(dy2d) if not fuse and x2d.shape[0] > 0 and x2d.dtype == dy2d.dtype == bias_dtype
          and bias_grad_in_wgrad_epilogue(dy2d) else None)
    if nc is None:
        return (wgrad_hp(x2d, dy2d, weight, fuse, out_features, in_features),
                bias_grad_of(dy2d, bias_dtype))
    db = torch.empty(out_features, dtype=bias_dtype, device=dy2d.device)
    dw = torch.empty(out_features, in_features, dtype=dy2d.dtype, device=dy2d.device)
    gemm_unchecked(nc, x2d, False, dy2d, True, dw, bias_grad=db)
    return dw, db


def dgrad_hp(w, dy2d, out=None):
    nc = _direct(dy2d) if dy2d.shape[0] > 0 and w.dtype == dy2d.dtype else None
    if nc is not None:
        if out is None:
            out = torch.empty(dy2d.shape[0], w.shape[1], dtype=dy2d.dtype, device=dy2d.device)
        return gemm_unchecked(nc, w, False, dy2d, False, out)
    return _into(out, K.general_gemm(w, dy2d, layout="NN").out)
