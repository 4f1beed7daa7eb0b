"""BasicLinear, Bias and GELU as one group: the GEMM adds the bias in its epilogue and the GELU
kernel follows, keeping the pre-activation; the backward computes GELU's derivative and the bias
gradient in one kernel (dbias_dactivation), then the two GEMMs. (The GEMM's own GELU epilogue
is not used: cuBLASLt evaluates tanh with a hardware approximation, up to ~2e-3 off, where the
activation kernel matches the reference to the output dtype's rounding.)"""
from __future__ import annotations

from ... import kernels
from ..basic.activation import GELU
from ..op import FusedOperation
from .linear_bias import LinearBias


class LinearBiasGELU(FusedOperation):
    """``y = GELU(x W^T + b)`` (tanh GELU) as one group.

    Parameters
    ----------
    basic_ops : sequence of BasicOperation
        The BasicLinear, the Bias and the GELU.
    """

    @staticmethod
    def match(ops, i: int) -> int:
        if (LinearBias.match(ops, i) and i + 2 < len(ops) and type(ops[i + 2]) is GELU
                and not ops[i + 2].cache_quantized_input):
            return 3
        return 0

    def forward(self, ctxs, x, extra_inputs):  # the group protocol (_autograd.py)
        linear, bias, _ = self.basic_ops
        ctxs[1].fp8 = ctxs[2].fp8 = None
        c = ctxs[0]
        z = linear._linear_forward(c, x, bias=bias.bias)
        c.to_save = c.to_save + (z,)
        return kernels.activation_forward(z, "gelu"), ()

    def backward(self, ctxs, dy, grad_extra_outputs):
        linear, bias, _ = self.basic_ops
        c = ctxs[0]
        z = c.saved_tensors[-1]
        c.saved_tensors = c.saved_tensors[:-1]
        dz, db = kernels.dbias_dactivation(dy.reshape(-1, z.shape[-1]).to(z.dtype),
                                           z.reshape(-1, z.shape[-1]), "gelu", bias.bias.dtype)
        c.has_bias = False  # the bias gradient came with the GELU derivative
        dx, dw, _ = linear._linear_backward(c, dz.reshape(z.shape))
        return dx, (), [[dw], [db], []]
