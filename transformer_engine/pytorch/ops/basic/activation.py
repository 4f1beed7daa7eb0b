"""Activations and gated linear units. Gated forms split the last dimension in two halves
a, b and compute act(a) * b: the activation applies to the FIRST half (PyTorch's own
torch.nn.GLU gates with the second)."""
from __future__ import annotations

from typing import Optional

import torch

from ... import kernels
from ...native import fp8_dtype as device_fp8_dtype
from ...tensor import Float8Tensor
from ..op import PREFIX, BasicOperation, op_name
from ._common import high_precision

_GATED = {"geglu", "reglu", "qgeglu", "sreglu", "swiglu", "glu", "clamped_swiglu"}


class _Activation(BasicOperation):
    kernel_name = ""

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        self.cache_quantized_input = bool(cache_quantized_input)

    def _check(self, x):
        if self.kernel_name in _GATED and (x.dim() == 0 or x.shape[-1] % 2):
            raise ValueError(f"{op_name(self)}: input has shape {tuple(x.shape)}; a gated "
                             "activation expects an even last dimension [..., 2*N]")

    def _kernel_forward(self, x):
        return kernels.activation_forward(x, self.kernel_name)

    def _kernel_backward(self, dy, x):
        return kernels.activation_backward(dy, x, self.kernel_name)

    def _forward(self, ctx, x, extra_inputs):
        self._check(x)
        x = high_precision(x, ctx.dtype)
        y = self._kernel_forward(x)
        if self.cache_quantized_input:
            # the backward reads an E4M3 copy of the input (current scaling): less memory
            q = Float8Tensor.quantize(x, device_fp8_dtype("e4m3", x.device))
            ctx.save_for_backward(q._data, q._scale_inv)
        else:
            ctx.save_for_backward(x)
        return y, ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        if self.cache_quantized_input:
            data, scale_inv = ctx.saved_tensors
            x = kernels.dequantize(data, scale_inv, ctx.dtype)
        else:
            (x,) = ctx.saved_tensors
        return self._kernel_backward(high_precision(dy, ctx.dtype), x), (), []


def _activation(name: str, kernel: str, formula: str):
    doc = f"""{formula}

    Runs ``transformer_engine.pytorch.kernels.activation_forward(x, "{kernel}")`` and its
    backward (fp32 maths, one rounding to the compute dtype).

    Parameters
    ----------
    cache_quantized_input : bool, default False
        Keep an FP8 (E4M3, current scaling) copy of the input for the backward pass instead of
        the input itself: less memory, a less exact gradient.
    """
    return type(name, (_Activation,), {"__doc__": doc, "kernel_name": kernel,
                                       "__module__": __name__, "__qualname__": name})


GELU = _activation("GELU", "gelu",
                   "GELU (tanh approximation): ``y = x/2 (1 + tanh(0.797 x + 0.036 x^3))``.")
QGELU = _activation("QGELU", "qgelu", "Quick GELU: ``y = x sigmoid(1.702 x)``.")
ReLU = _activation("ReLU", "relu", "ReLU: ``y = max(x, 0)``.")
SReLU = _activation("SReLU", "srelu", "Squared ReLU: ``y = max(x, 0)^2``.")
SiLU = _activation("SiLU", "silu", "SiLU (swish): ``y = x sigmoid(x)``.")
GLU = _activation("GLU", "glu", "Gated linear unit: ``y = sigmoid(a) * b`` (a, b: the halves of "
                  "the last dimension).")
GEGLU = _activation("GEGLU", "geglu", "GELU-gated linear unit: ``y = GELU(a) * b``.")
QGEGLU = _activation("QGEGLU", "qgeglu", "Quick-GELU-gated linear unit: ``y = QGELU(a) * b``.")
ReGLU = _activation("ReGLU", "reglu", "ReLU-gated linear unit: ``y = max(a, 0) * b``.")
SReGLU = _activation("SReGLU", "sreglu", "Squared-ReLU-gated linear unit: ``y = max(a, 0)^2 * b``.")


class SwiGLU(_Activation):
    """SiLU-gated linear unit: ``y = SiLU(a) * b`` (a, b: the halves of the last dimension).

    Parameters
    ----------
    cache_quantized_input : bool, default False
        Keep an FP8 (E4M3, current scaling) copy of the input for the backward pass.
    glu_interleave_size : int, optional
        Interleaved a/b blocks of this size instead of two halves; not supported (anything but
        None raises NotImplementedError).
    """

    kernel_name = "swiglu"

    def __init__(self, *, cache_quantized_input: bool = False,
                 glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)
        if glu_interleave_size is not None:
            raise NotImplementedError(f"{PREFIX}.{type(self).__name__}: glu_interleave_size is "
                                      "not supported (the halves must be contiguous)")
        self.glu_interleave_size = None


class ClampedSwiGLU(SwiGLU):
    """Clamped SwiGLU: ``y = a' sigmoid(alpha a') (b' + 1)`` with ``a' = min(a, limit)`` and
    ``b' = clamp(b, -limit, limit)``.

    Parameters
    ----------
    limit : float, default 7.0
        The clamp bound.
    alpha : float, default 1.702
        The sigmoid's slope.
    glu_linear_offset : float, default 1.0
        Added to the gate ``b'``; only 1.0 is supported.
    cache_quantized_input : bool, default False
        Keep an FP8 (E4M3, current scaling) copy of the input for the backward pass.
    glu_interleave_size : int, optional
        Not supported (anything but None raises NotImplementedError).
    """

    kernel_name = "clamped_swiglu"

    def __init__(self, *, limit: float = 7.0, alpha: float = 1.702,
                 glu_linear_offset: float = 1.0, cache_quantized_input: bool = False,
                 glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input,
                         glu_interleave_size=glu_interleave_size)
        if glu_linear_offset != 1.0:
            raise NotImplementedError(f"{PREFIX}.ClampedSwiGLU: glu_linear_offset="
                                      f"{glu_linear_offset} is not supported; only 1.0")
        self.limit, self.alpha = float(limit), float(alpha)
        self.glu_linear_offset = 1.0

    def _kernel_forward(self, x):
        return kernels.activation.clamped_swiglu_forward(x, self.limit, self.alpha)

    def _kernel_backward(self, dy, x):
        return kernels.activation.clamped_swiglu_backward(dy, x, self.limit, self.alpha)
