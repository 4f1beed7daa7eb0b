"""LayerNorm or RMSNorm followed by BasicLinear (and optionally Bias). Under DelayedScaling
the norm kernel writes the GEMM's FP8 input directly (the cast is fused into the norm, with
the BasicLinear's input scale and amax); otherwise the norm output goes to the GEMM as usual."""
from __future__ import annotations

from ... import kernels
from .._fp8 import fp8_call
from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..basic.layer_norm import _Norm
from ..op import FusedOperation


class NormLinear(FusedOperation):
    """A norm and the linear layer after it as one group.

    Parameters
    ----------
    basic_ops : sequence of BasicOperation
        The LayerNorm or RMSNorm, the BasicLinear and optionally the Bias.
    """

    @staticmethod
    def match(ops, i: int) -> int:
        if not (i + 1 < len(ops) and isinstance(ops[i], _Norm)
                and isinstance(ops[i + 1], BasicLinear)):
            return 0
        if ops[i + 1]._tp_active():  # the collectives would sit between the norm and the GEMM
            return 0
        if (i + 2 < len(ops) and isinstance(ops[i + 2], Bias)
                and ops[i + 2].local_size == ops[i + 1].local_out_features):
            return 3
        return 2

    def forward(self, ctxs, x, extra_inputs):  # the group protocol (_autograd.py)
        norm, linear = self.basic_ops[0], self.basic_ops[1]
        bias = self.basic_ops[2].bias if len(self.basic_ops) == 3 else None
        for c in ctxs[::2]:  # the norm's and the bias's: the linear's FP8 state serves the group
            c.fp8 = None
        fp8 = fp8_call(linear, x.device, ctxs[1].requires_grad)
        fused_cast = (fp8 is not None and not fp8.calibrating and fp8.rs.delayed
                      and len(norm.normalized_shape) == 1
                      and x.shape[-1] == linear.local_in_features)
        if not fused_cast:
            z = norm._norm_forward(ctxs[0], x)
            return linear._linear_forward(ctxs[1], z, bias=bias, fp8=fp8), ()
        rs = fp8.rs
        res = norm._norm_forward(ctxs[0], x, (rs.fwd_dtype, rs.fwd_scale[0], rs.fwd_amax[0]))
        xq = res.out
        xq_t = kernels.transpose(xq) if ctxs[1].requires_grad else None
        # x has the norm output's shape: the GEMM reads only its shape, the data is xq
        y = linear._linear_forward(ctxs[1], x, bias=bias, fp8=fp8,
                                   quantized_input=(xq, xq_t, res.scale_inv))
        return y, ()

    def backward(self, ctxs, dy, grad_extra_outputs):
        norm, linear = self.basic_ops[0], self.basic_ops[1]
        dz, dw, db = linear._linear_backward(ctxs[1], dy)
        dx, norm_grads = norm._norm_backward(ctxs[0], dz)
        grads = [norm_grads, [dw]]
        if len(self.basic_ops) == 3:
            grads.append([db.to(self.basic_ops[2].bias.dtype)])
        return dx, (), grads
