"""The operation classes of the fusible-operations API.

A :class:`BasicOperation` is one step of a computation (a GEMM, a norm, an activation) and owns
its parameters and FP8 state. A :class:`FusedOperation` runs several adjacent basic operations
as one step (for example a GEMM with its bias add in the GEMM epilogue) and owns nothing: its
parameters stay on the basic operations, so ``state_dict`` keys do not depend on fusion.

Every group (one basic operation, or one fused operation) runs under one
``torch.autograd.Function`` (see ``_autograd.py``): its forward fills one
:class:`OperationContext` per basic operation and its backward reads them back.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .. import quantization as q

PREFIX = "transformer_engine.pytorch.ops"

# The fuser class that runs an operation called alone. fuser.py sets it when imported (the
# package imports it first), so this module does not import the fuser, which imports it.
RUN_ALONE = None


def op_name(op) -> str:
    """The public name of an operation, for error messages."""
    return f"{PREFIX}.{type(op).__name__}"


class OperationContext:
    """What one basic operation keeps between its forward and its backward.

    Tensors go through :meth:`save_for_backward` (the group's autograd context saves them, so
    saved-tensor hooks see them); anything else is set as an attribute.
    """

    def __init__(self) -> None:
        self.to_save: Tuple[Optional[torch.Tensor], ...] = ()
        self.saved_tensors: Tuple[Optional[torch.Tensor], ...] = ()
        self.requires_grad = True

    def save_for_backward(self, *tensors: Optional[torch.Tensor]) -> None:
        """Keep tensors for the backward pass.

        Parameters
        ----------
        *tensors : torch.Tensor or None
            The tensors, read back in the same order from ``saved_tensors``.
        """
        self.to_save = tensors


class FusibleOperation(torch.nn.Module):
    """Base class of the operations that :class:`Sequential` can fuse.

    Calling an operation runs it alone, as a one-operation group. Inputs beyond the first are
    the operation's extra inputs (see ``num_extra_inputs`` of the basic operations); when an
    operation makes extra outputs, the call returns a tuple.
    """

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0

    def __init__(self) -> None:
        super().__init__()

    @property
    def is_fused_op(self) -> bool:
        """Whether this is a :class:`FusedOperation`."""
        return False

    @property
    def basic_op_list(self) -> List["BasicOperation"]:
        """The basic operations this operation runs, in order."""
        raise NotImplementedError

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor):  # noqa: A002
        """Run the operation alone.

        Parameters
        ----------
        input : torch.Tensor
            The main input.
        *extra_inputs : torch.Tensor
            Extra inputs of the operation (for example the tensor :class:`AddExtraInput` adds).

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            The output, followed by the extra outputs when there are any.
        """
        return RUN_ALONE([self])(input, *extra_inputs)


class BasicOperation(FusibleOperation):
    """Base class of the single-step operations, which own parameters and FP8 state.

    Subclasses implement ``_forward(ctx, x, extra_inputs)`` returning ``(y, extra_outputs)``
    and ``_backward(ctx, dy, grad_extra_outputs)`` returning ``(dx, grad_extra_inputs,
    param_grads)``, with ``param_grads`` in the order of ``self.parameters(recurse=False)``.
    ``fp8_slots`` counts the FP8 casts of the forward and of the backward pass; the FP8 state
    (scales, amax history) is saved in ``state_dict`` as the operation's extra state.
    """

    fp8_slots: Tuple[int, int] = (0, 0)

    def __init__(self) -> None:
        super().__init__()
        self._fp8_state: Optional[q.RecipeState] = None
        self._pending_fp8_extra_state = None

    @property
    def basic_op_list(self) -> List["BasicOperation"]:
        return [self]

    # -- the group protocol (see _autograd.py)
    def _forward(self, ctx: OperationContext, x: torch.Tensor,
                 extra_inputs: Sequence[torch.Tensor]):
        raise NotImplementedError

    def _backward(self, ctx: OperationContext, dy: torch.Tensor, grad_extra_outputs):
        raise NotImplementedError

    # -- tensor parallelism around the group (autograd-aware collectives); identity by default
    def _group_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _group_output(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        rs = self._fp8_state
        if rs is not None:  # a device move: keep the FP8 state, on the new device
            p = next(iter(self.parameters()), None)
            if p is not None and p.device != rs.device and p.device.type != "meta":
                self._pending_fp8_extra_state = rs.to_dict()
                self._fp8_state = None
        return out

    # -- checkpoints: the FP8 metadata as extra state
    def get_extra_state(self):
        """The operation's FP8 metadata (amax history, scales), saved in ``state_dict``; None
        before the operation first ran in FP8."""
        if self._fp8_state is None:
            return self._pending_fp8_extra_state
        return self._fp8_state.to_dict()

    def set_extra_state(self, state) -> None:
        """Restore the FP8 metadata saved by :meth:`get_extra_state`.

        Parameters
        ----------
        state : dict or None
            The saved metadata; None or an empty value (saved before FP8 ran, or by another
            library) leaves the state as it is.
        """
        if not isinstance(state, dict) or not state:
            return
        if self._fp8_state is not None:
            dev = self._fp8_state.device
            self._fp8_state.load_dict({k: v.to(dev) for k, v in state.items()
                                       if isinstance(v, torch.Tensor)})
        else:
            self._pending_fp8_extra_state = state


class FusedOperation(FusibleOperation):
    """Several adjacent basic operations run as one step.

    Parameters
    ----------
    basic_ops : iterable of BasicOperation
        The operations, in order. They keep their parameters (``basic_ops.<i>.<name>`` in
        ``state_dict``).
    """

    def __init__(self, basic_ops) -> None:
        super().__init__()
        ops = list(basic_ops)
        if not ops or not all(isinstance(op, BasicOperation) for op in ops):
            raise TypeError(f"{PREFIX}.FusedOperation: basic_ops must be a non-empty iterable of "
                            "BasicOperation")
        self.basic_ops = torch.nn.ModuleList(ops)

    @property
    def is_fused_op(self) -> bool:
        return True

    @property
    def basic_op_list(self) -> List[BasicOperation]:
        return list(self.basic_ops)

    @property
    def ops(self) -> List[BasicOperation]:
        """The basic operations (the group protocol of _autograd.py)."""
        return list(self.basic_ops)

    @property
    def num_extra_inputs(self) -> int:  # type: ignore[override]
        return sum(op.num_extra_inputs for op in self.basic_ops)

    @property
    def num_extra_outputs(self) -> int:  # type: ignore[override]
        return sum(op.num_extra_outputs for op in self.basic_ops)
