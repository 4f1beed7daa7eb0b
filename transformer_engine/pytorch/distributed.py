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

import torch
import torch.distributed as dist

DEFAULT_RNG_STATE_NAME = "model-parallel-rng"


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
# Process-group queries
# ---------------------------------------------------------------------------------------------

def get_distributed_world_size(group=None) -> int:
    """Ranks in `group` (the default group when None, as torch.distributed reads it); 1 when
    torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def get_distributed_rank(group=None) -> int:
    """This process's rank in `group` (default group when None); 0 when not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def _tp_size(group) -> int:
    """Ranks of a tensor-parallel group: None means no tensor parallelism (see the module doc)."""
    return 1 if group is None else get_distributed_world_size(group)


def checkpoint(function, *args, **kwargs):
    """te.distributed.checkpoint, NVIDIA TE's other spelling of te.checkpoint."""
    from .checkpoint import checkpoint as te_checkpoint
    return te_checkpoint(function, *args, **kwargs)


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


def _uses_nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


# ---------------------------------------------------------------------------------------------
# Raw collectives (no autograd): the building blocks of the Functions below
# ---------------------------------------------------------------------------------------------

def all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over the group in place and return it (identity for one rank)."""
    if _tp_size(group) == 1:
        return tensor
    dist.all_reduce(tensor, group=group)
    return tensor


def all_gather_first_dim(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's `tensor` along dim 0 (rank order)."""
    world = _tp_size(group)
    if world == 1:
        return tensor
    tensor = tensor.contiguous()
    out = torch.empty((world * tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)
    if _uses_nccl(group):
        dist.all_gather_into_tensor(out, tensor, group=group)
    else:  # gloo and others lack the single-tensor form: gather into views of `out`
        dist.all_gather(list(out.chunk(world, dim=0)), tensor, group=group)
    return out


def reduce_scatter_first_dim(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum over the group, then keep this rank's 1/world slice of dim 0."""
    world = _tp_size(group)
    if world == 1:
        return tensor
    if tensor.shape[0] % world != 0:
        raise ValueError(f"reduce_scatter_along_first_dim: dim 0 of shape {tuple(tensor.shape)} is not "
                         f"divisible by the group size {world}")
    tensor = tensor.contiguous()
    if _uses_nccl(group):
        out = torch.empty((tensor.shape[0] // world,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        dist.reduce_scatter_tensor(out, tensor, group=group)
        return out
    # gloo has no reduce-scatter: all-reduce a copy and keep our slice (twice the traffic, same sums)
    summed = tensor.clone()
    dist.all_reduce(summed, group=group)
    return summed.chunk(world, dim=0)[get_distributed_rank(group)].contiguous()


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


def gather_along_first_dim(inp: torch.Tensor, group=None) -> torch.Tensor:
    if _tp_size(group) == 1:
        return inp
    return _GatherAlongFirstDim.apply(inp, group)


def reduce_scatter_along_first_dim(inp: torch.Tensor, group=None) -> torch.Tensor:
    if _tp_size(group) == 1:
        return inp
    return _ReduceScatterAlongFirstDim.apply(inp, group)
