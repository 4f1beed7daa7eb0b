"""Operations that move or scale values without parameters: Identity, Reshape,
ConstantScale, Dropout."""
from __future__ import annotations

import torch

from ..op import PREFIX, BasicOperation, op_name
from ._common import high_precision


class Identity(BasicOperation):
    """Return the input unchanged (it also separates operations that would otherwise fuse)."""

    def _forward(self, ctx, x, extra_inputs):
        return x, ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        return dy, (), []


class Reshape(BasicOperation):
    """Reshape the input, as ``torch.reshape``.

    Parameters
    ----------
    shape : iterable of int
        The new shape (one entry may be -1).
    """

    def __init__(self, shape) -> None:
        super().__init__()
        try:
            self._shape = tuple(int(d) for d in shape)
        except TypeError:
            raise TypeError(f"{PREFIX}.Reshape: shape must be an iterable of int, got "
                            f"{type(shape).__name__}") from None

    def _forward(self, ctx, x, extra_inputs):
        ctx.in_shape = tuple(x.shape)
        try:
            return x.reshape(self._shape), ()
        except RuntimeError as err:
            raise ValueError(f"{op_name(self)}: input of shape {tuple(x.shape)} cannot be "
                             f"reshaped to {self._shape}: {err}") from None

    def _backward(self, ctx, dy, grad_extra_outputs):
        return dy.reshape(ctx.in_shape), (), []


class ConstantScale(BasicOperation):
    """Multiply by a constant: ``y = scale * x``.

    Parameters
    ----------
    scale : float
        The constant.
    """

    def __init__(self, scale: float) -> None:
        super().__init__()
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise TypeError(f"{PREFIX}.ConstantScale: scale must be a float, got "
                            f"{type(scale).__name__}")
        self.scale = float(scale)

    def _forward(self, ctx, x, extra_inputs):
        return high_precision(x, ctx.dtype) * self.scale, ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        return dy * self.scale, (), []


class Dropout(BasicOperation):
    """Dropout: in training, zero each value with probability ``p`` and scale the rest by
    ``1 / (1 - p)``; the identity in eval mode.

    Parameters
    ----------
    p : float
        The probability of zeroing a value, in [0, 1).
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"{PREFIX}.Dropout: p is {p!r}; expected a probability in [0, 1)")
        self.dropout_probability = float(p)

    def _forward(self, ctx, x, extra_inputs):
        x = high_precision(x, ctx.dtype)
        p = self.dropout_probability
        if not self.training or p == 0.0:
            ctx.mask = None
            return x, ()
        keep = torch.empty_like(x).bernoulli_(1.0 - p).to(torch.bool)
        ctx.save_for_backward(keep)
        ctx.mask = True
        return x * keep * (1.0 / (1.0 - p)), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        if ctx.mask is None:
            return dy, (), []
        (keep,) = ctx.saved_tensors
        return dy * keep * (1.0 / (1.0 - self.dropout_probability)), (), []
