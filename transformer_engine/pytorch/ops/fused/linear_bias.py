"""BasicLinear followed by Bias: the bias is added in the GEMM epilogue, and its gradient
comes out of the high-precision weight-gradient GEMM (or the dbias kernel in FP8)."""
from __future__ import annotations

from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..op import FusedOperation


def _linear_fusable(linear: BasicLinear) -> bool:
    # a row-parallel GEMM's output is reduced after the group: its bias must come after that
    return not (linear._tp_active() and linear.tensor_parallel_mode == "row")


class LinearBias(FusedOperation):
    """``y = x W^T + b`` in one GEMM (the fusion of :class:`BasicLinear` and :class:`Bias`).

    Parameters
    ----------
    basic_ops : sequence of BasicOperation
        The BasicLinear and the Bias.
    """

    @staticmethod
    def match(ops, i: int) -> int:
        if (i + 1 < len(ops) and isinstance(ops[i], BasicLinear) and isinstance(ops[i + 1], Bias)
                and _linear_fusable(ops[i])
                and ops[i + 1].local_size == ops[i].local_out_features):
            return 2
        return 0

    def forward(self, ctxs, x, extra_inputs):  # the group protocol (_autograd.py)
        linear, bias = self.basic_ops
        ctxs[1].fp8 = None
        return linear._linear_forward(ctxs[0], x, bias=bias.bias), ()

    def backward(self, ctxs, dy, grad_extra_outputs):
        dx, dw, db = self.basic_ops[0]._linear_backward(ctxs[0], dy)
        return dx, (), [[dw], [db.to(self.basic_ops[1].bias.dtype)]]
