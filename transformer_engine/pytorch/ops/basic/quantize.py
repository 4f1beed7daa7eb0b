"""Quantize: cast to FP8 under FP8 autocast with this operation's scales."""
from __future__ import annotations

import math

from ... import kernels
from ...quantization import FP8GlobalState
from ...tensor import Float8Tensor
from .._fp8 import cast, fp8_call
from ..op import BasicOperation
from ._common import high_precision


class Quantize(BasicOperation):
    """Cast to FP8 under ``te.fp8_autocast`` / ``te.autocast`` (DelayedScaling or
    Float8CurrentScaling); the identity otherwise.

    The forward output is a :class:`transformer_engine.pytorch.Float8Tensor`, which a following
    :class:`BasicLinear` uses as its FP8 input without casting again. With ``backward=True``
    the gradient is rounded through the recipe's backward FP8 format.

    Parameters
    ----------
    forward : bool, default True
        Quantize the forward output.
    backward : bool, default False
        Round the backward gradient through FP8.
    """

    fp8_slots = (1, 1)

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self._quantize_forward = bool(forward)
        self._quantize_backward = bool(backward)

    def _forward(self, ctx, x, extra_inputs):
        # (calibrating: nothing is quantized and no amax recorded here)
        fp8 = fp8_call(self, x.device, ctx.requires_grad) if FP8GlobalState.enabled and (
            self._quantize_forward or self._quantize_backward) else None
        ctx.fp8 = fp8
        if fp8 is None or not self._quantize_forward or isinstance(x, Float8Tensor):
            return x, ()
        x = high_precision(x, ctx.dtype)
        cols = x.shape[-1] if x.dim() else 1
        data, _, scale_inv = cast(fp8.rs, x.reshape(math.prod(x.shape[:-1]), cols), True, 0, False)
        return Float8Tensor(data.reshape(x.shape), scale_inv, ctx.dtype), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        if ctx.fp8 is None or not self._quantize_backward:
            return dy, (), []
        cols = dy.shape[-1] if dy.dim() else 1
        data, _, scale_inv = cast(ctx.fp8.rs, dy.reshape(-1, cols), False, 0, False)
        return kernels.dequantize(data, scale_inv, ctx.dtype).reshape(dy.shape), (), []
