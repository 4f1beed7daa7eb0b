"""Distributed helpers of the PyTorch modules: the RNG-states tracker used for dropout under
tensor parallelism and activation recompute, and the tensor-parallel collectives as autograd
Functions over a process group.

Group convention: `group=None` means "no tensor parallelism" and every collective is the
identity, exactly as when the group has one rank. The modules pass their `tp_group`, which is None
unless the user asked for tensor parallelism, so a data-parallel job that never set a TP group never
communicates here by accident.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from .checkpoint import checkpoint  # noqa: F401  (te.distributed.checkpoint: NV TE's other spelling)
from .collectives import (  # noqa: F401  (re-exported: the public names live here too)
    _tp_size, _uses_nccl, all_gather_first_dim, all_gather_fp8_first_dim, all_reduce, get_distributed_rank,
    get_distributed_world_size, reduce_scatter_first_dim)
from .collectives import all_gather_single as _all_gather_single
from .collectives import reduce_scatter_single as _reduce_scatter_single

DEFAULT_RNG_STATE_NAME = "model-parallel-rng"

# Every live tracker, for get_all_rng_states (trackers are few and long-lived).
_TRACKERS: "weakref.WeakSet" = weakref.WeakSet()


# ---------------------------------------------------------------------------------------------
# RNG states tracker
# ---------------------------------------------------------------------------------------------

class CudaRNGStatesTracker:
    """Named random-number-generator states that code regions can fork into.

    Used so that dropout inside tensor-parallel regions draws different numbers on each rank
    (each rank seeds its own state) while dropout elsewhere stays identical across ranks. The
    states belong to one generator: the current CUDA/ROCm device's when a GPU is available, else
    the CPU generator, so the same code runs on the reference backend.

    Parameters
    ----------
    device : {'cuda', 'cpu'}, optional
        The generator whose states are tracked (default ``'cuda'`` when a GPU is available, else
        ``'cpu'``).
    """

    def __init__(self, device: str | None = None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"CudaRNGStatesTracker: device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CudaRNGStatesTracker: device='cuda' was asked for but CUDA is not available")
        self.device = device
        self.reset()
        _TRACKERS.add(self)

    # The generator this tracker swaps states of.
    def _get_state(self) -> torch.Tensor:
        return torch.cuda.get_rng_state() if self.device == "cuda" else torch.get_rng_state()

    def _set_state(self, state: torch.Tensor) -> None:
        if self.device == "cuda":
            torch.cuda.set_rng_state(state)
        else:
            torch.set_rng_state(state)

    def reset(self) -> None:
        """Forget every state and seed."""
        self.states_: dict = {}
        self.seeds_: set = set()

    def get_states(self) -> dict:
        """A copy of the name -> state mapping (the state tensors themselves are not cloned:
        forking replaces them rather than mutating them)."""
        return dict(self.states_)

    def set_states(self, states: dict) -> None:
        """Replace every state, e.g. with a mapping returned by :meth:`get_states`.

        Parameters
        ----------
        states : dict of str to torch.Tensor
            Name to generator state.
        """
        if not isinstance(states, dict):
            raise TypeError(f"CudaRNGStatesTracker.set_states: states must be a dict, got {type(states).__name__}")
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        """Create a state seeded with ``seed``, leaving the current RNG state untouched.

        Parameters
        ----------
        name : str
            Name of the new state; must be new.
        seed : int
            Its seed; must differ from every other state's, or both would draw the same numbers.
        """
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"CudaRNGStatesTracker.add: seed must be an int, got {type(seed).__name__}")
        if seed in self.seeds_:
            raise ValueError(f"CudaRNGStatesTracker.add: seed {seed} is already used by another state")
        if name in self.states_:
            raise ValueError(f"CudaRNGStatesTracker.add: state {name!r} already exists")
        self.seeds_.add(seed)
        saved = self._get_state()
        try:
            if self.device == "cuda":
                torch.cuda.manual_seed(seed)
            else:
                torch.manual_seed(seed)
            self.states_[name] = self._get_state()
        finally:
            self._set_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = DEFAULT_RNG_STATE_NAME):
        """Context manager: run the body with state ``name``, then restore the caller's state.

        Parameters
        ----------
        name : str, default 'model-parallel-rng'
            The state to use; it must have been added with :meth:`add`.
        """
        if name not in self.states_:
            raise KeyError(f"CudaRNGStatesTracker.fork: no state named {name!r}; add(name, seed) it first "
                           f"(known: {sorted(self.states_)})")
        saved = self._get_state()
        self._set_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = self._get_state()
            self._set_state(saved)


# ---------------------------------------------------------------------------------------------
# RNG states of every tracker
# ---------------------------------------------------------------------------------------------

def get_all_rng_states() -> dict:
    """name -> RNG state of every state added to any live CudaRNGStatesTracker."""
    states: dict = {}
    for tracker in list(_TRACKERS):
        states.update(tracker.get_states())
    return states


# ---------------------------------------------------------------------------------------------
# FP8 activation recompute driven by the caller (e.g. a framework's own checkpoint function)
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def activation_recompute_forward(activation_recompute: bool = False, recompute_phase: bool = False):
    """Marks a forward as checkpointed (recompute_phase=False: TE modules inside record the FP8
    scales they cast with) or as its recompute (recompute_phase=True: they cast with the recorded
    scales, record no amax, and deliver their backward to the checkpointed forward's step), so a
    checkpoint implemented outside this library recomputes FP8 activations bit for bit. With
    activation_recompute=False it changes nothing."""
    from .quantization import FP8GlobalState
    s = FP8GlobalState
    saved = s.recompute_phase
    if activation_recompute:
        s.recompute_phase = 2 if recompute_phase else 1
    try:
        yield
    finally:
        s.recompute_phase = saved


def is_fp8_activation_recompute_enabled() -> bool:
    """Whether FP8 is on inside an activation_recompute_forward (or te.checkpoint) region."""
    from .quantization import FP8GlobalState
    return FP8GlobalState.recompute_phase != 0 and FP8GlobalState.enabled


def in_fp8_activation_recompute_phase() -> bool:
    """Whether the current forward is the recompute of a checkpointed one."""
    from .quantization import FP8GlobalState
    return FP8GlobalState.recompute_phase == 2


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """numerator / denominator, which must divide exactly (a feature count split over ranks)."""
    if denominator <= 0 or numerator % denominator != 0:
        raise ValueError(f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    """Mark a parameter as split over the TP group along `dim` (read by checkpoint/optimizer code)."""
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


# ---------------------------------------------------------------------------------------------
# Autograd Functions of tensor (and sequence) parallelism
# ---------------------------------------------------------------------------------------------

class _CopyToTensorParallelRegion(torch.autograd.Function):
    """Forward identity, backward all-reduce: the input of a column-parallel layer is replicated,
    so its gradient is the sum of every rank's partial gradient."""

    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return inp

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """Forward all-reduce, backward identity: the output of a row-parallel layer is the sum of
    every rank's partial product."""

    @staticmethod
    def forward(ctx, inp, group):
        return all_reduce(inp.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlongFirstDim(torch.autograd.Function):
    """Forward all-gather along dim 0, backward reduce-scatter: enters a TP region from a
    sequence-parallel one (each rank held a slice of the tokens)."""

    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return all_gather_first_dim(inp, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_first_dim(grad, ctx.group), None


class _ReduceScatterAlongFirstDim(torch.autograd.Function):
    """Forward reduce-scatter along dim 0, backward all-gather: leaves a row-parallel layer into
    a sequence-parallel region."""

    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return reduce_scatter_first_dim(inp, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_first_dim(grad, ctx.group), None


def copy_to_tensor_parallel_region(inp: torch.Tensor, group=None) -> torch.Tensor:
    if _tp_size(group) == 1:
        return inp
    return _CopyToTensorParallelRegion.apply(inp, group)


def reduce_from_tensor_parallel_region(inp: torch.Tensor, group=None) -> torch.Tensor:
    if _tp_size(group) == 1:
        return inp
    return _ReduceFromTensorParallelRegion.apply(inp, group)


def gather_from_sequence_parallel_region(inp: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather along dim 0 with a reduce-scatter backward (autograd)."""
    if _tp_size(group) == 1:
        return inp
    return _GatherAlongFirstDim.apply(inp, group)


def reduce_scatter_to_sequence_parallel_region(inp: torch.Tensor, group=None) -> torch.Tensor:
    """Reduce-scatter along dim 0 with an all-gather backward (autograd)."""
    if _tp_size(group) == 1:
        return inp
    return _ReduceScatterAlongFirstDim.apply(inp, group)


# ---------------------------------------------------------------------------------------------
# NVIDIA TE's raw collectives: (output, async handle or None), no autograd. Unlike the region
# functions above, process_group=None means torch.distributed's default group, as in
# torch.distributed itself; without an initialised process group they are the identity.
# ---------------------------------------------------------------------------------------------

def _world_of(group) -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def gather_along_first_dim(inp: torch.Tensor, process_group=None, async_op: bool = False,
                           quantizer=None) -> Tuple[torch.Tensor, Optional[object]]:
    """Every rank's `inp` concatenated along dim 0, as (output, handle): handle is the pending
    collective with async_op=True (wait() before reading the output), else None. A quantizer,
    when given, quantizes the output: an FP8 one (Float8Quantizer, Float8CurrentScalingQuantizer)
    quantizes this rank's rows before the gather, which then moves FP8 bytes under one scale
    (see collectives.all_gather_fp8_first_dim); another quantizes the gathered rows."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"gather_along_first_dim: inp must be a torch.Tensor, got {type(inp).__name__}")
    from .tensor import QuantizedTensor
    from .tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
    if isinstance(inp, QuantizedTensor):
        inp = inp.dequantize()
    world = _world_of(process_group)
    if isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        group = process_group if process_group is not None else dist.group.WORLD
        if world == 1:
            return quantizer.quantize(inp), None
        return all_gather_fp8_first_dim(inp, quantizer, group, async_op)
    if world == 1:
        return (quantizer.quantize(inp) if quantizer is not None else inp), None
    inp = inp.contiguous()
    out = torch.empty((world * inp.shape[0],) + tuple(inp.shape[1:]), dtype=inp.dtype, device=inp.device)
    if _uses_nccl(process_group):
        handle = _all_gather_single(out, inp, group=process_group, async_op=async_op)
    else:
        handle = dist.all_gather(list(out.chunk(world, dim=0)), inp, group=process_group,
                                 async_op=async_op)
    if quantizer is not None:
        if handle is not None:
            handle.wait()
            handle = None
        out = quantizer.quantize(out)
    return out, handle


def reduce_scatter_along_first_dim(inp: torch.Tensor, process_group=None, async_op: bool = False
                                   ) -> Tuple[torch.Tensor, Optional[object]]:
    """The sum over ranks of `inp`, of which this rank keeps its 1/world slice of dim 0, as
    (output, handle) (see gather_along_first_dim)."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"reduce_scatter_along_first_dim: inp must be a torch.Tensor, got "
                        f"{type(inp).__name__}")
    world = _world_of(process_group)
    if world == 1:
        return inp, None
    if inp.shape[0] % world != 0:
        raise ValueError(f"reduce_scatter_along_first_dim: dim 0 of shape {tuple(inp.shape)} is not "
                         f"divisible by the group size {world}")
    inp = inp.contiguous()
    if _uses_nccl(process_group):
        out = torch.empty((inp.shape[0] // world,) + tuple(inp.shape[1:]), dtype=inp.dtype,
                          device=inp.device)
        handle = _reduce_scatter_single(out, inp, group=process_group, async_op=async_op)
        return out, handle
    group = process_group if process_group is not None else dist.group.WORLD
    return reduce_scatter_first_dim(inp, group), None

