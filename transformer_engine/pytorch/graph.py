"""te.make_graphed_callables: CUDA graphs of Transformer Engine modules (or any callables), FP8
included, built on torch.cuda.make_graphed_callables.

Each callable is wrapped so that its captured forward runs inside the FP8 autocast given here
(enabled/recipe, or NV TE's older fp8_enabled/fp8_recipe names). Everything the FP8 recipe does
per step is device work on the capturing stream, so it is captured with the step and replays
with it:

- the casts read the scales and write this step's amax into row 0 of each module's history;
- DelayedScaling's batched update (roll the amax history, new scales) runs at the end of the
  captured forward for the forward scales and at the end of the captured backward for the
  backward ones. (Eager training defers the forward update to the last backward to save a
  launch; a graph keeps it in the forward graph so that a forward replay on its own, e.g. under
  torch.no_grad, still advances its scales.) The values are the same either way: the backward
  does not touch the forward history.

Every replay therefore advances the amax history and scales exactly as one eager step does. The
warm-up iterations that torch runs before capturing are eager steps; the FP8 state they advanced
is put back afterwards (in place: the graphs hold its addresses), so the first replay starts from
the state the modules had before make_graphed_callables (fresh state for modules that had never
run FP8).

Replays use the tensors captured: inputs are copied into the graph's static input buffers by
torch's wrapper, parameters are read where they live (update them in place, as optimizers do).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch

from .module.base import TransformerEngineBaseModule
from .quantization import FP8GlobalState, autocast, flush_deferred_updates

__all__ = ["make_graphed_callables"]

_OP = "make_graphed_callables"


class _AutocastCallable(torch.nn.Module):
    """One callable as torch's graphing sees it: the FP8 autocast and the callable's constant
    keyword arguments around it, its parameters (a module's) as this module's own."""

    def __init__(self, inner, kwargs: Dict[str, Any], fp8: Tuple):
        super().__init__()
        self.inner = inner  # a module registers as a child: its parameters join the graph's
        # the module's own forward, kept before make_graphed_callables replaces it with the
        # graphed one (which falls back to this wrapper's forward outside its training mode)
        self._run = inner.forward if isinstance(inner, torch.nn.Module) else inner
        self._kwargs, self._fp8 = kwargs, fp8

    # training follows the wrapped module: torch's graphed forward replays only in the
    # training mode it was captured in, else it calls the eager forward
    @property
    def training(self):
        inner = self.__dict__.get("_modules", {}).get("inner")
        return inner.training if isinstance(inner, torch.nn.Module) else True

    @training.setter
    def training(self, value):
        pass

    def forward(self, *args):
        enabled, calibrating, recipe, group = self._fp8
        if enabled or calibrating:
            with autocast(enabled=enabled, calibrating=calibrating, recipe=recipe,
                          amax_reduction_group=group):
                out = self._run(*args, **self._kwargs)
            flush_deferred_updates()  # the forward update in the forward graph (see above)
        else:
            out = self._run(*args, **self._kwargs)
        if torch.cuda.is_current_stream_capturing():
            self._captured = out  # torch keeps these as the graph's static outputs
        return out


def release_captured_autograd(outputs, inputs=()) -> None:
    """Empties the contexts of the custom autograd nodes behind `outputs`.

    torch keeps the tensors a captured forward returned (the graph's static outputs) for the
    life of the graphs, and with them the autograd graph recorded during capture, which is never
    run again (replays go through their own autograd function). The te Functions' contexts refer
    to their module, whose graphed forward refers to the graphs: a cycle that passes through
    C++ autograd nodes, which Python's garbage collector cannot see, so the module, its graphs
    and the NCCL communicators they captured would live until the process ends (and
    torch.distributed.destroy_process_group() would wait for them). The walk stops at the
    autograd nodes that made `inputs` (recorded before the capture, and still the caller's)."""
    stack = [t.grad_fn for t in torch.utils._pytree.tree_leaves(outputs)
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    # by id, holding each node so that no id is reused during the walk
    seen = {id(n): n for n in (t.grad_fn for t in inputs if isinstance(t, torch.Tensor)) if n is not None}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            vars(node).clear()
        stack.extend(fn for fn, _ in node.next_functions)


def _te_modules(callables):
    found = []
    for c in callables:
        if isinstance(c, torch.nn.Module):
            found.extend(m for m in c.modules() if isinstance(m, TransformerEngineBaseModule))
    return found


def _fresh_state(rs) -> dict:
    return {"amax_history_fwd": torch.zeros_like(rs.amax_history_fwd),
            "amax_history_bwd": torch.zeros_like(rs.amax_history_bwd),
            "scale_fwd": torch.ones_like(rs.scale_fwd), "scale_bwd": torch.ones_like(rs.scale_bwd),
            "scale_inv_fwd": torch.ones_like(rs.scale_inv_fwd),
            "scale_inv_bwd": torch.ones_like(rs.scale_inv_bwd)}


def _check_args(callables, sample_args, sample_kwargs):
    if not callables:
        raise ValueError(f"{_OP}: modules is empty; expected one callable or a tuple of them")
    for i, c in enumerate(callables):
        if not callable(c):
            raise TypeError(f"{_OP}: modules[{i}] is {type(c).__name__}; expected a callable")
    if len(sample_args) != len(callables):
        raise ValueError(f"{_OP}: sample_args has {len(sample_args)} entries for {len(callables)} "
                         "callables; expected one tuple of tensors per callable")
    for i, args in enumerate(sample_args):
        if not isinstance(args, (tuple, list)) or not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError(f"{_OP}: sample_args[{i}] must be a tuple of tensors")
        if not all(a.is_cuda for a in args):
            raise ValueError(f"{_OP}: sample_args[{i}] has tensors off the GPU; CUDA graphs capture "
                             "GPU work only")
    if sample_kwargs is not None and len(sample_kwargs) != len(callables):
        raise ValueError(f"{_OP}: sample_kwargs has {len(sample_kwargs)} entries for "
                         f"{len(callables)} callables")
    for i, kw in enumerate(sample_kwargs or ()):
        bad = [k for k, v in (kw or {}).items() if isinstance(v, torch.Tensor)]
        if bad:
            raise ValueError(f"{_OP}: sample_kwargs[{i}] has tensor values {bad}; pass tensors "
                             "positionally (keyword arguments are captured as constants)")


def make_graphed_callables(modules, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False,
                           sample_kwargs: Optional[Tuple[Dict[str, Any], ...]] = None,
                           fp8_enabled: bool = False, fp8_calibrating: bool = False,
                           fp8_recipe=None, fp8_group=None, fp8_weight_caching: bool = False,
                           _order=None, pool=None, retain_graph_in_backward: bool = False, *,
                           enabled: Optional[bool] = None, calibrating: Optional[bool] = None,
                           recipe=None, amax_reduction_group=None) -> Union[Any, Tuple[Any, ...]]:
    """CUDA-graphed versions of modules or other callables, FP8 included.

    Built on ``torch.cuda.make_graphed_callables``: each callable's forward and backward are
    captured once (after eager warm-up iterations) and later calls replay the graphs. With FP8
    on, each captured forward runs inside an :func:`autocast` with the given recipe, and the
    recipe's per-step work (amax recording, DelayedScaling's history roll and new scales) is
    captured with it, so every replay advances the FP8 state as one eager step does. The FP8
    state that the warm-up advanced is restored before returning. Replays copy their inputs into
    the captured input buffers and read the parameters where they live (update them in place,
    as optimizers do). Needs a GPU (NVIDIA CUDA or AMD ROCm); must be called outside any FP8
    autocast (else RuntimeError).

    Parameters
    ----------
    modules : callable or tuple of callables
        What to graph: modules (``torch.nn.Module``) or functions.
    sample_args : tuple of torch.Tensor, or tuple of such tuples
        Sample positional arguments, on the GPU, of the shapes, dtypes and ``requires_grad``
        that the replays will use: one tuple of tensors for a single callable, else one tuple
        per callable.
    num_warmup_iters : int, default 3
        Eager iterations run before capturing.
    allow_unused_input : bool, default False
        Passed to torch: allow inputs that the outputs do not depend on.
    sample_kwargs : tuple of dict, optional
        Keyword arguments per callable; captured as constants, so they may not be tensors
        (pass tensors positionally).
    fp8_enabled : bool, default False
        Older name of ``enabled``.
    fp8_calibrating : bool, default False
        Older name of ``calibrating``.
    fp8_recipe : Recipe, optional
        Older name of ``recipe``.
    fp8_group : torch.distributed.ProcessGroup, optional
        Older name of ``amax_reduction_group``.
    fp8_weight_caching : bool, default False
        Cast the FP8 weights once per ``is_first_microbatch`` instead of in every replay. Not
        implemented: only False is accepted (True raises NotImplementedError).
    pool : optional
        Memory pool handle for the graphs (``torch.cuda.graph_pool_handle()``), passed to torch.
    retain_graph_in_backward : bool, default False
        Not implemented: only False is accepted (True raises NotImplementedError).
    enabled : bool, optional
        Run the captured forwards with FP8 (default: ``fp8_enabled``).
    calibrating : bool, optional
        Run them in high precision while recording amaxes (default: ``fp8_calibrating``).
    recipe : Recipe, optional
        The FP8 recipe (default: ``fp8_recipe``, else the default recipe).
    amax_reduction_group : torch.distributed.ProcessGroup, optional
        Group over which the delayed-scaling amaxes are reduced (default: ``fp8_group``).

    Returns
    -------
    callable or tuple of callables
        For one callable, its graphed version; else a tuple in the same order. Modules are
        returned as the same objects with a graphed ``forward`` (eager when the module's
        training mode differs from the one captured); functions as graphed functions.
    """
    if fp8_weight_caching:
        raise NotImplementedError(f"{_OP}: fp8_weight_caching=True (weights cast once per "
                                  "is_first_microbatch) is not supported; the graphs cast the "
                                  "weights in every replay. Pass fp8_weight_caching=False")
    if _order is not None:
        raise NotImplementedError(f"{_OP}: _order (interleaved pipeline schedules) is not "
                                  "supported; capture each chunk's callables separately")
    if retain_graph_in_backward:
        raise NotImplementedError(f"{_OP}: retain_graph_in_backward=True is not supported")
    if FP8GlobalState.depth > 0:
        raise RuntimeError(f"{_OP}: called inside an FP8 autocast; call it outside and pass the "
                           "recipe (enabled=True, recipe=...) so that each captured step owns its "
                           "scaling update")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{_OP}: CUDA graphs need a GPU; none is available")
    enabled = fp8_enabled if enabled is None else enabled
    calibrating = fp8_calibrating if calibrating is None else calibrating
    recipe = fp8_recipe if recipe is None else recipe
    group = fp8_group if amax_reduction_group is None else amax_reduction_group
    just_one = not isinstance(modules, (tuple, list))
    callables = (modules,) if just_one else tuple(modules)
    if just_one:
        sample_args = (sample_args,)
    sample_args = tuple(tuple(a) for a in sample_args)
    _check_args(callables, sample_args, sample_kwargs)
    fp8 = (bool(enabled), bool(calibrating), recipe, group)
    wrapped = tuple(_AutocastCallable(c, dict((sample_kwargs or [{}] * len(callables))[i] or {}), fp8)
                    for i, c in enumerate(callables))

    # FP8 state before the eager warm-up (None: the module has not run FP8 yet)
    te_modules = _te_modules(callables)
    before = {id(m): (m._fp8_state.to_dict() if m._fp8_state is not None else None)
              for m in te_modules}
    flush_deferred_updates()
    graphed = torch.cuda.make_graphed_callables(
        wrapped, sample_args, num_warmup_iters=num_warmup_iters,
        allow_unused_input=allow_unused_input, pool=pool)
    torch.cuda.synchronize()
    for m in te_modules:
        rs = m._fp8_state
        if rs is not None:
            saved = before[id(m)]
            rs.load_dict(saved if saved is not None else _fresh_state(rs))
    torch.cuda.synchronize()

    for w, args in zip(wrapped, sample_args):
        release_captured_autograd(w.__dict__.pop("_captured", None), args)
    results = []
    for c, g in zip(callables, graphed):
        if isinstance(c, torch.nn.Module):
            c.forward = g.forward  # graphed forward (eager when c.training differs from capture)
            results.append(c)
        else:
            results.append(g)
    return results[0] if just_one else tuple(results)
