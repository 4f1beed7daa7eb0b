"""OperationFuser: runs a list of fusible operations, fusing adjacent ones where a fused
implementation exists (see fused/), one autograd Function per resulting group."""
from __future__ import annotations

from typing import List

import torch

from ._autograd import SingleOp, run_group
from ..tensor import QuantizedTensor
from . import op as _op
from .op import PREFIX, BasicOperation, FusibleOperation, op_name

_HP = (torch.float32, torch.float16, torch.bfloat16)


def _fuse(ops: List[BasicOperation]) -> list:
    """Groups for a list of basic operations: at each position the first fusion that matches,
    else the operation alone."""
    from .fused import FUSIONS
    groups, i = [], 0
    while i < len(ops):
        for fusion in FUSIONS:
            n = fusion.match(ops, i)
            if n:
                groups.append(fusion(ops[i:i + n]))
                i += n
                break
        else:
            groups.append(SingleOp(ops[i]))
            i += 1
    return groups


class OperationFuser:
    """Runs fusible operations in order as fused groups.

    Parameters
    ----------
    ops : list of FusibleOperation
        The operations; fused operations contribute their basic operations.
    """

    def __init__(self, ops: List[FusibleOperation]):
        basic: List[BasicOperation] = []
        for op in ops:
            if not isinstance(op, FusibleOperation):
                raise TypeError(f"{PREFIX}.Sequential: {type(op).__name__} is not a "
                                "FusibleOperation")
            basic.extend(op.basic_op_list)
        self.basic_ops = basic
        self.num_extra_inputs = sum(op.num_extra_inputs for op in basic)
        self.num_extra_outputs = sum(op.num_extra_outputs for op in basic)
        self._groups = None

    def _current_groups(self):
        # fusions depend on the operations' settings (tensor parallelism): decided once
        if self._groups is None:
            self._groups = _fuse(self.basic_ops)
        return self._groups

    def __call__(self, x: torch.Tensor, *extra_inputs: torch.Tensor):
        who = op_name(self.basic_ops[0]) if self.basic_ops else PREFIX
        named = [("input", x)] + [(f"extra input {i}", t) for i, t in enumerate(extra_inputs)]
        for name, t in named:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if not isinstance(t, QuantizedTensor) and t.dtype not in _HP:
                raise TypeError(f"{who}: {name} has dtype {str(t.dtype).replace('torch.', '')}; "
                                "expected float32, float16 or bfloat16")
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"{who}: {len(extra_inputs)} extra input(s) given; the operations "
                             f"take {self.num_extra_inputs}")
        extra_outputs = []
        remaining = list(extra_inputs)
        for group in self._current_groups():
            n_in = sum(op.num_extra_inputs for op in group.ops)
            mine, remaining = remaining[:n_in], remaining[n_in:]
            x, outs = run_group(group, x, mine)
            extra_outputs.extend(outs)
        if extra_outputs:
            return (x,) + tuple(extra_outputs)
        return x


_op.RUN_ALONE = OperationFuser
