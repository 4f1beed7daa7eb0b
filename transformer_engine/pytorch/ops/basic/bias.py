"""Bias: y = x + b over the last dimension."""
from __future__ import annotations

from typing import Optional

import torch

from ... import kernels
from ..op import PREFIX, BasicOperation
from ._common import (check_device, check_last_dim, default_device, default_dtype, high_precision,
                      param_as, positive_int)
from .basic_linear import _tp_world


class Bias(BasicOperation):
    """Add a bias: ``y = x + b``. After :class:`BasicLinear` it is fused into the GEMM.

    Parameters
    ----------
    size : int
        Inner dimension of the input (the full size when ``tensor_parallel``).
    device : torch.device or str, optional
        Where to create the bias (default: the current GPU, else the CPU).
    dtype : torch.dtype, optional
        The bias dtype (default ``torch.get_default_dtype()``).
    tensor_parallel : bool, default False
        The bias is split over ``tensor_parallel_group`` (after a column-parallel
        :class:`BasicLinear`): this rank holds ``size / group size`` values.
    tensor_parallel_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    """

    def __init__(self, size: int, *, device=None, dtype: Optional[torch.dtype] = None,
                 tensor_parallel: bool = False, tensor_parallel_group=None) -> None:
        super().__init__()
        size = positive_int("Bias", "size", size)
        self.tensor_parallel = bool(tensor_parallel)
        if self.tensor_parallel:
            from ... import distributed as dist_te
            _, world = _tp_world(tensor_parallel_group)
            size = dist_te.divide(size, world, f"{PREFIX}.Bias: size")
        self.local_size = size
        device = default_device(device)
        b = torch.zeros(size, device=device, dtype=default_dtype("Bias", dtype))
        self.bias = torch.nn.Parameter(b)

    def reset_parameters(self) -> None:
        """Set the bias to zeros."""
        with torch.no_grad():
            self.bias.zero_()

    def _forward(self, ctx, x, extra_inputs):
        check_last_dim(self, x, self.local_size, "the bias size")
        check_device(self, x, self.bias)
        x = high_precision(x, ctx.dtype)
        return x + param_as(self.bias, ctx.dtype), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        db = kernels.dbias(dy.reshape(-1, self.local_size), self.bias.dtype)
        return dy, (), [db]
