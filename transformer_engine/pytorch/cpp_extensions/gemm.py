"""general_gemm with NVIDIA Transformer Engine's signature and return value, run by this
library's GEMM (kernels.general_gemm: the native GEMM on a GPU, the reference elsewhere).

    out = alpha * op_b(B) @ op_a(A) [+ beta * out] [+ bias]      op = transpose where layout says "T"

Operands are plain tensors or Float8Tensors (their FP8 data and scale_inv are used; an FP8
operand in a non-TN position is fed through its cached FP8 transpose, since Hopper FP8 GEMMs
take the TN layout only). Returns (out, bias_grad, gelu_input, extra_output):
  * grad=False: bias is added; gelu=True applies tanh GELU and returns its input as gelu_input.
  * grad=True: bias (when given) is not added; its gradient, B (dY of the wgrad layout NT)
    summed over rows, is returned as bias_grad. gelu=True with gelu_in multiplies by GELU'(gelu_in).
  * quantization_params (a quantizer) quantizes the output, which is returned as its quantized
    tensor type.
Comm-GEMM overlap (ub, ub_type, extra_output, bulk_overlap) is not implemented here and is
refused; `workspace` is accepted for callers that pass one, and unused: the GEMM keeps its own
workspace per device and stream.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from ..tensor.quantized_tensor import QuantizedTensor

_OP = "transformer_engine.pytorch.cpp_extensions.general_gemm"


def _operand(t, transposed: bool, name: str):
    """(tensor as the GEMM takes it, scale_inv or None, whether it is transposed in the GEMM)."""
    if isinstance(t, QuantizedTensor):
        data, scale_inv = t._data, t._scale_inv
        if not transposed:
            # FP8 GEMMs take TN only: feed the FP8 transpose, transposed back by the GEMM
            if data.dim() != 2:
                data = data.reshape(-1, data.shape[-1])
                return kernels.transpose(data), scale_inv, True
            return t.transpose_fp8(), scale_inv, True
        return data, scale_inv, transposed
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_OP}: {name} must be a torch.Tensor or a quantized tensor, got {type(t).__name__}")
    return t, None, transposed


def general_gemm(A: torch.Tensor, B: torch.Tensor, out_dtype: Optional[torch.dtype] = None,
                 quantization_params=None, gelu: bool = False, gelu_in: Optional[torch.Tensor] = None,
                 alpha: float = 1.0, beta: Optional[float] = None, accumulate: bool = False,
                 layout: str = "TN", out: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, use_split_accumulator: bool = False,
                 grad: bool = False, ub=None, ub_type=None, extra_output=None,
                 bulk_overlap: bool = False, workspace: Optional[torch.Tensor] = None):
    """See the module docstring."""
    if layout not in ("TN", "NN", "NT"):
        raise ValueError(f"{_OP}: layout is {layout!r}; expected 'TN', 'NN' or 'NT'")
    if ub is not None or ub_type is not None or extra_output is not None or bulk_overlap:
        raise NotImplementedError(f"{_OP}: comm-GEMM overlap (ub, ub_type, extra_output, "
                                  "bulk_overlap) is not implemented")
    if out is not None and not out.is_contiguous():
        raise ValueError(f"{_OP}: out must be contiguous")
    if beta is not None and not accumulate and beta != 0.0:
        raise ValueError(f"{_OP}: beta={beta} needs accumulate=True")
    a, a_sinv, ta = _operand(A, layout[0] == "T", "A")
    b_transposed = layout[1] == "T"
    if isinstance(B, QuantizedTensor):
        # op_b(B) = B.T for "T": the GEMM wants B's FP8 data in the N position, so a "T" B goes
        # through its FP8 transpose
        if b_transposed:
            b, b_sinv, tb = B.transpose_fp8(), B._scale_inv, False
        else:
            b, b_sinv, tb = B._data, B._scale_inv, False
    else:
        b, b_sinv, tb = B, None, b_transposed
    fp8_in = a_sinv is not None or b_sinv is not None
    if fp8_in and (a_sinv is None or b_sinv is None):
        raise TypeError(f"{_OP}: A and B must both be quantized or both high precision")
    if beta is not None and accumulate and out is not None and beta != 1.0:
        out.mul_(beta)
    hp_out_dtype = out_dtype
    if quantization_params is not None:
        if out is not None:
            raise ValueError(f"{_OP}: out with quantization_params is not supported; the quantized "
                             "output is returned")
    if grad and bias is not None and layout != "NT":
        raise NotImplementedError(f"{_OP}: a bias gradient (grad=True with bias) is made for the "
                                  f"wgrad layout 'NT' only; got {layout!r}")
    bias_add = bias if (bias is not None and not grad) else None
    kw = dict(layout=("T" if ta else "N") + ("T" if tb else "N"), A_scale_inv=a_sinv,
              B_scale_inv=b_sinv, bias=bias_add, out=out, accumulate=accumulate, alpha=alpha,
              use_split_accumulator=use_split_accumulator)
    if gelu and grad:
        if gelu_in is None:
            raise ValueError(f"{_OP}: gelu=True with grad=True needs gelu_in")
        kw["gelu_input"] = gelu_in
    elif gelu:
        kw["gelu"] = True
    res = kernels.general_gemm(a, b, hp_out_dtype, **kw)
    result = res.out
    gelu_input = res.gelu_input if gelu and not grad else None
    bias_grad = None
    if grad and bias is not None:
        # the wgrad GEMM (layout NT, B = dY [tokens, out]): the bias gradient is dY summed over
        # tokens, i.e. op_b(B) summed over the reduction dimension
        src = B.dequantize() if isinstance(B, QuantizedTensor) else B
        bias_grad = src.reshape(-1, src.shape[-1]).float().sum(dim=0).to(bias.dtype)
    if quantization_params is not None:
        result = quantization_params.quantize(result)
    return result, bias_grad, gelu_input, None
