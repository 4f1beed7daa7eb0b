"""AddExtraInput and MakeExtraOutput: a residual branch through the fuser. The extra input is
an additional argument of the call; the extra output an additional return value."""
from __future__ import annotations

from ..op import PREFIX, BasicOperation, op_name
from ._common import high_precision


def _no_in_place(cls_name: str, in_place: bool) -> None:
    if in_place:
        raise NotImplementedError(f"{PREFIX}.{cls_name}: in_place=True is not supported; the "
                                  "operation computes out of place")


class AddExtraInput(BasicOperation):
    """Add an extra input tensor: ``y = x + extra`` (a residual connection). The extra tensor is
    the next unused extra argument of the call.

    Parameters
    ----------
    in_place : bool, default False
        Add into the extra tensor's memory; not supported (True raises NotImplementedError).
    """

    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        _no_in_place("AddExtraInput", in_place)
        self._in_place = False

    def _forward(self, ctx, x, extra_inputs):
        (extra,) = extra_inputs
        if tuple(extra.shape) != tuple(x.shape):
            raise ValueError(f"{op_name(self)}: the extra input has shape {tuple(extra.shape)}; "
                             f"expected the main input's shape {tuple(x.shape)}")
        return high_precision(x, ctx.dtype) + high_precision(extra, ctx.dtype), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        return dy, (dy,), []


class MakeExtraOutput(BasicOperation):
    """Return the input both as the main output and as an extra output (the branch point of a
    residual connection); in the backward pass their gradients add up.

    Parameters
    ----------
    in_place : bool, default False
        Accumulate the gradient into the extra output's gradient in place; not supported
        (True raises NotImplementedError).
    """

    num_extra_outputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        _no_in_place("MakeExtraOutput", in_place)
        self._in_place = False

    def _forward(self, ctx, x, extra_inputs):
        x = high_precision(x, ctx.dtype)
        return x, (x.clone(),)

    def _backward(self, ctx, dy, grad_extra_outputs):
        (d_extra,) = grad_extra_outputs
        return (dy if d_extra is None else dy + d_extra), (), []
