"""One torch.autograd.Function per group of operations (a basic operation, or a fused one).

The group's forward runs with torch.autocast off, in the compute dtype chosen on entry (the
autocast dtype when torch.autocast is on for the input's device, else the input's dtype), and
fills one OperationContext per basic operation; its backward hands the contexts back in reverse
and returns the gradients of the input, the extra inputs and every parameter.
"""
from __future__ import annotations

import contextlib
from typing import List, Sequence

import torch

from .op import BasicOperation, OperationContext


def _autocast_off(t: torch.Tensor):
    kind = "cuda" if t.is_cuda else t.device.type
    if kind in ("cuda", "cpu"):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()  # (torch.autocast knows no other device types here)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    kind = "cuda" if x.is_cuda else x.device.type
    if kind in ("cuda", "cpu") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


class SingleOp:
    """The group protocol for one basic operation alone."""

    def __init__(self, op: BasicOperation):
        self.ops = [op]

    def forward(self, ctxs, x, extra_inputs):
        return self.ops[0]._forward(ctxs[0], x, extra_inputs)

    def backward(self, ctxs, dy, grad_extra_outputs):
        dx, dextra, dparams = self.ops[0]._backward(ctxs[0], dy, grad_extra_outputs)
        return dx, dextra, [dparams]


class _GroupFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, n_extra_in, n_params, x, *tensors):
        extra_inputs = tensors[:n_extra_in]
        op_ctxs = [OperationContext() for _ in group.ops]
        dtype = compute_dtype(x)
        # under inference_mode no backward can follow, whatever the parameters say (no FP8
        # transposes made for one); a traced graph cannot ask and keeps what a backward needs
        needs_grad = any(ctx.needs_input_grad) and (torch.compiler.is_compiling()
                                                    or not torch.is_inference_mode_enabled())
        for c in op_ctxs:
            c.dtype = dtype
            c.requires_grad = needs_grad
        with _autocast_off(x):
            y, extra_outputs = group.forward(op_ctxs, x if x.dtype == dtype else x.to(dtype),
                                             extra_inputs)
        flat, counts = [], []
        for c in op_ctxs:
            flat.extend(c.to_save)
            counts.append(len(c.to_save))
            c.to_save = ()
        ctx.save_for_backward(*flat)
        ctx.group, ctx.op_ctxs, ctx.counts = group, op_ctxs, counts
        ctx.n_extra_in, ctx.n_params = n_extra_in, n_params
        ctx.mark_non_differentiable(*[t for t in extra_outputs if not t.is_floating_point()])
        return (y,) + tuple(extra_outputs)

    @staticmethod
    def backward(ctx, dy, *grad_extra_outputs):
        saved = ctx.saved_tensors
        offset = 0
        for c, n in zip(ctx.op_ctxs, ctx.counts):
            c.saved_tensors = saved[offset:offset + n]
            offset += n
        with _autocast_off(dy):
            dx, dextra, dparams = ctx.group.backward(ctx.op_ctxs, dy.contiguous(),
                                                     grad_extra_outputs)
        for c in ctx.op_ctxs:  # delayed scaling: the step's update waits for every backward
            fp8 = getattr(c, "fp8", None)
            if fp8 is not None and fp8.step is not None:
                fp8.step.backward_finished()
            c.saved_tensors = ()
        grads: List = []
        for g, n in zip(dparams, ctx.n_params):
            g = list(g)
            grads.extend(g + [None] * (n - len(g)))
        return (None, None, None, dx, *dextra, *grads)


def run_group(group, x: torch.Tensor, extra_inputs: Sequence[torch.Tensor]):
    """Runs one group: the first operation's input collective, the Function, the last
    operation's output collective. Returns (y, extra_outputs)."""
    ops = group.ops
    x = ops[0]._group_input(x)
    params = [list(op.parameters(recurse=False)) for op in ops]
    n_params = tuple(len(p) for p in params)
    flat = [p for ps in params for p in ps]
    out = _GroupFunction.apply(group, len(extra_inputs), n_params, x, *extra_inputs, *flat)
    y, extra_outputs = out[0], out[1:]
    return ops[-1]._group_output(y), extra_outputs
