"""te.checkpoint: activation recomputation that is exact with FP8 and dropout.

The forward runs without saving activations; the backward replays it with (a) the CPU, CUDA and
tracker RNG states of the forward, so dropout draws the same masks, and (b) the FP8 state of the
forward: its recipe and autocast settings, and the very scales each module used (modules record
them in the forward and pop them in the recompute), so a delayed-scaling update between forward
and backward does not change the recomputed values; amaxes are recorded once, in the forward."""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

from .collectives import all_gather_first_dim
from .quantization import FP8GlobalState

__all__ = ["checkpoint"]


def _rng_states(tracker_fn):
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, (tracker_fn().get_states() if tracker_fn is not None else None)


def _set_rng_states(states, tracker_fn):
    cpu, cuda, tracker = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)
    if tracker is not None:
        tracker_fn().set_states(tracker)


@contextlib.contextmanager
def _fp8_phase(phase: int, fp8=None):
    s = FP8GlobalState
    saved = (s.recompute_phase, s.enabled, s.calibrating, s.recipe, s.group, s.step)
    s.recompute_phase = phase
    if fp8 is not None:
        s.enabled, s.calibrating, s.recipe, s.group, s.step = fp8
    try:
        yield
    finally:
        s.recompute_phase, s.enabled, s.calibrating, s.recipe, s.group, s.step = saved


def _world(tp_group):
    import torch.distributed as dist
    if tp_group is None or not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(tp_group), dist.get_rank(tp_group)


def _split_saved(t, tp_group):
    """This rank's share of a flattened activation (the others keep the rest)."""
    world, rank = _world(tp_group)
    flat = t.detach().reshape(-1)
    if world == 1 or flat.numel() % world:
        return t.detach(), None
    return flat.chunk(world)[rank].clone(), t.shape


def _gather_saved(chunk, shape, tp_group):
    return all_gather_first_dim(chunk, tp_group).view(shape)


class _CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, distribute, tracker_fn, tp_group, kwargs, n_params, *args_params):
        # the trailing n_params tensors are the owning module's parameters: inputs of this node
        # only so that the output requires grad when no argument does (the recompute's own
        # backward accumulates their gradients)
        args = args_params[:len(args_params) - n_params]
        s = FP8GlobalState
        ctx.fp8 = (s.enabled, s.calibrating, s.recipe, s.group, s.step)
        ctx.rng = _rng_states(tracker_fn)
        ctx.function, ctx.tracker_fn, ctx.tp_group, ctx.kwargs = function, tracker_fn, tp_group, kwargs
        with torch.no_grad(), _fp8_phase(1):
            outputs = function(*args, **kwargs)
        tensors, ctx.layout, shapes = [], [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                saved, shape = _split_saved(a, tp_group) if distribute else (a.detach(), None)
                tensors.append(saved)
                shapes.append(shape)
                ctx.layout.append(("t", a.requires_grad))
            else:
                ctx.layout.append(("o", a))
        ctx.shapes, ctx.n_params = shapes, n_params
        ctx.save_for_backward(*tensors)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        saved = list(ctx.saved_tensors)
        inputs, k = [], 0
        for kind, val in ctx.layout:
            if kind == "o":
                inputs.append(val)
                continue
            t = saved[k]
            if ctx.shapes[k] is not None:
                t = _gather_saved(t, ctx.shapes[k], ctx.tp_group)
            k += 1
            t = t.detach().requires_grad_(val)
            inputs.append(t)
        now = _rng_states(ctx.tracker_fn)
        _set_rng_states(ctx.rng, ctx.tracker_fn)
        try:
            with torch.enable_grad(), _fp8_phase(2, ctx.fp8):
                outputs = ctx.function(*inputs, **ctx.kwargs)
        finally:
            _set_rng_states(now, ctx.tracker_fn)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads_in = [inp.grad if kind == "t" and val else None
                    for inp, (kind, val) in zip(inputs, ctx.layout)]
        return (None, None, None, None, None, None) + tuple(grads_in) + (None,) * ctx.n_params


def checkpoint(function: Callable, *args, distribute_saved_activations: bool = False,
               get_rng_state_tracker: Optional[Callable] = None, tp_group=None,
               use_reentrant: bool = True, **kwargs):
    """Activation checkpointing that is aware of FP8 and of tensor-parallel RNG states.

    Runs ``function(*args, **kwargs)`` without keeping its intermediate activations; the backward
    pass recomputes them with the RNG states and the FP8 scales of the original forward, so that
    dropout masks and FP8 casts are identical. Works on every backend.

    Parameters
    ----------
    function : callable
        The function (or module) to run.
    *args
        Its positional arguments; the tensors among them are saved for the recompute.
    distribute_saved_activations : bool, default False
        Keep only this rank's ``1 / tp_size`` share of the saved inputs; they are gathered again
        over ``tp_group`` for the recompute.
    get_rng_state_tracker : callable, optional
        Returns the :class:`CudaRNGStatesTracker` whose states are saved and restored along with
        the global RNG state.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel group (for ``distribute_saved_activations``).
    use_reentrant : bool, default True
        True: the forward runs without building a graph and the recompute runs in this
        function's own backward (the inputs, or the parameters of the module ``function`` is,
        carry the gradient). False: ``torch.utils.checkpoint``'s non-reentrant form, with the
        same RNG and FP8 handling: the forward builds its graph but drops what it saves, and the
        first use in the backward recomputes the whole function; needed when ``function`` is a
        closure over modules and no input requires grad. With
        ``distribute_saved_activations`` the reentrant form runs either way.
    **kwargs
        Keyword arguments passed on to ``function``.

    Returns
    -------
    The output of ``function``.
    """
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if not use_reentrant and not distribute_saved_activations:
        return _non_reentrant(function, args, kwargs, get_rng_state_tracker)
    params = ()
    if torch.is_grad_enabled() and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        params = tuple(p for p in _owner_parameters(function) if p.requires_grad)
    return _CheckpointFunction.apply(function, bool(distribute_saved_activations),
                                     get_rng_state_tracker, tp_group, kwargs, len(params), *args, *params)


def _owner_parameters(function):
    """The parameters of the module ``function`` is (or is a bound method of); none otherwise."""
    owner = function if isinstance(function, torch.nn.Module) else getattr(function, "__self__", None)
    return owner.parameters() if isinstance(owner, torch.nn.Module) else ()


def _non_reentrant(function, args, kwargs, tracker_fn):
    """torch.utils.checkpoint's non-reentrant checkpoint, its forward run as FP8 recompute
    phase 1 and its recompute as phase 2 under the forward's RNG states and FP8 state. Early
    stopping is off: the recompute runs the whole function, so every module that stashed scales
    in the forward takes them back."""
    from torch.utils import checkpoint as torch_checkpoint

    def contexts():
        s = FP8GlobalState
        fp8 = (s.enabled, s.calibrating, s.recipe, s.group, s.step)
        rng = _rng_states(tracker_fn)

        @contextlib.contextmanager
        def recompute():
            now = _rng_states(tracker_fn)
            _set_rng_states(rng, tracker_fn)
            try:
                with _fp8_phase(2, fp8):
                    yield
            finally:
                _set_rng_states(now, tracker_fn)
        return _fp8_phase(1), recompute()

    with torch_checkpoint.set_checkpoint_early_stop(False):
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=False,
                                           preserve_rng_state=False, context_fn=contexts, **kwargs)
