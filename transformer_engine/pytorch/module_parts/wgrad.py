"""Weight gradients as pipeline schedules and Megatron-style optimizers expect them.

fuse_wgrad_accumulation=True: the wgrad GEMM adds into the weight's fp32 `main_grad` (beta = 1,
see library/gemm.py, wgrad_out). What autograd then receives for the weight follows Megatron's DDP
protocol: a weight that carries a `grad_added_to_main_grad` attribute gets it set to True and
autograd is handed a placeholder of the weight's shape and dtype (zeros when the weight's
`zero_out_wgrad` is true, else uninitialised), which that DDP ignores because the flag is set;
any other weight gets no gradient (None). The placeholder is one cached buffer per shape, dtype
and device (get_dummy_wgrad, as NVIDIA TE has it), so no weight-sized tensor is allocated per
backward and `.grad` of every such weight shares its storage.

delay_wgrad_compute=True: the backward makes the input and bias gradients only and queues the
weight-gradient GEMMs on the module; `module.backward_dw()` runs them later (pipeline schedules
split the weight gradient off to fill bubbles). Each queued GEMM keeps references to the operands
it reads (the saved FP8 or high-precision tensors and the output gradient), so they stay alive
until backward_dw() runs. backward_dw() then adds into `main_grad` (fused) or into `.grad`
(accumulating with what is there), and calls the hooks registered with
register_wgrad_accumulation_and_reduce_hooks, in order.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

import torch


def mark_delayed_params(module) -> None:
    """With delay_wgrad_compute: flags the module's GEMM weights and biases (not its norm
    parameters) with skip_backward_post_hook = True, as NV TE does, so that Megatron's DDP
    leaves them to the hooks registered with register_wgrad_accumulation_and_reduce_hooks
    (which run after backward_dw())."""
    if not getattr(module, "delay_wgrad_compute", False):
        return
    for name, p in module.named_parameters(recurse=False):
        if not name.startswith("layer_norm"):
            p.skip_backward_post_hook = True


def autograd_weight_grad(weight: Optional[torch.Tensor], dw: Optional[torch.Tensor], fuse: bool):
    """The weight's gradient to return from an autograd backward once its wgrad GEMM has run
    (dw: the GEMM's result, None when it accumulated into main_grad)."""
    if not fuse:
        return dw
    if weight is None or not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    return get_dummy_wgrad(list(weight.shape), weight.dtype,
                           bool(getattr(weight, "zero_out_wgrad", False)), weight.device)


_DUMMY_WGRADS: dict = {}


def get_dummy_wgrad(shape: list, dtype: torch.dtype, zero: bool = False,
                    device=None) -> torch.Tensor:
    """The placeholder weight gradient handed to autograd for a weight whose gradient went into
    its ``main_grad``: one cached buffer per (shape, dtype, device), returned detached (a new
    tensor over the same storage, which autograd may adopt as ``.grad``).

    Parameters
    ----------
    shape : list of int
        The weight's shape.
    dtype : torch.dtype
        The weight's dtype.
    zero : bool, default False
        Fill the buffer with zeros first (else its contents are whatever it held).
    device : torch.device or str, optional
        Default: the current CUDA/ROCm device when there is one, else the CPU.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (tuple(int(d) for d in shape), dtype, device)
    buf = _DUMMY_WGRADS.get(key)
    if buf is None:
        buf = _DUMMY_WGRADS[key] = torch.empty(key[0], dtype=dtype, device=device)
    if zero:
        buf.zero_()
    return buf.detach()


def weight_grad(module, weight: Optional[torch.Tensor], fuse: bool,
                compute: Callable[[], Optional[torch.Tensor]]):
    """Runs compute() (the wgrad GEMM; None when it accumulated into main_grad) now and returns
    what autograd should receive, or, with the module's delay_wgrad_compute, queues it for
    backward_dw() and returns None."""
    if getattr(module, "delay_wgrad_compute", False):
        if weight is None:
            raise ValueError(f"{type(module).__name__}: delay_wgrad_compute=True needs the weight "
                             "tensor in the backward")
        module._wgrad_queue().append((weight, fuse, compute))
        return None
    return autograd_weight_grad(weight, compute(), fuse)


def _deliver(weight: torch.Tensor, dw: Optional[torch.Tensor], fuse: bool) -> None:
    if fuse:
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
        return
    dw = dw.to(weight.dtype) if dw.dtype != weight.dtype else dw
    if weight.grad is None:
        weight.grad = dw
    else:
        weight.grad.add_(dw)


class DelayedWeightGrad:
    """The delayed-wgrad API of every module that makes weight gradients (mixed into
    TransformerEngineBaseModule)."""

    def _wgrad_queue(self) -> deque:
        queue = self.__dict__.get("_wgrad_pending")
        if queue is None:
            queue = self.__dict__["_wgrad_pending"] = deque()
        return queue

    def need_backward_dw(self) -> bool:
        """Whether backward_dw() has queued weight gradients to compute."""
        return bool(self.__dict__.get("_wgrad_pending"))

    def backward_dw(self) -> None:
        """Computes the weight gradients that backward() queued (delay_wgrad_compute=True), oldest
        backward first, then runs the registered wgrad hooks. Nothing to do: returns."""
        queue = self.__dict__.get("_wgrad_pending")
        if not queue:
            return
        while queue:
            weight, fuse, compute = queue.popleft()
            _deliver(weight, compute(), fuse)
        for hook in self.__dict__.get("_wgrad_hooks", ()):
            hook()

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """Registers a hook to run after every :meth:`backward_dw` that computed weight
        gradients, in registration order.

        Parameters
        ----------
        hook : callable
            Called with no arguments, for example to start the data-parallel reduction of the
            delayed gradients. A non-callable raises TypeError.
        """
        if not callable(hook):
            raise TypeError(f"{type(self).__name__}.register_wgrad_accumulation_and_reduce_hooks: "
                            f"hook is {type(hook).__name__}; expected a callable")
        self.__dict__.setdefault("_wgrad_hooks", []).append(hook)
