"""Linear: BasicLinear followed by Bias, as one operation."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .basic.basic_linear import BasicLinear
from .basic.bias import Bias
from .op import FusedOperation


class Linear(FusedOperation):
    """Linear transformation ``y = x W^T + b``: a :class:`BasicLinear` and, with ``bias``, a
    :class:`Bias` (``state_dict`` keys ``basic_ops.0.weight`` and ``basic_ops.1.bias``); the
    bias is added in the GEMM epilogue.

    Parameters
    ----------
    in_features : int
        Inner dimension of the input.
    out_features : int
        Inner dimension of the output.
    bias : bool, default True
        Add a learned bias.
    device : torch.device or str, optional
        Where to create the parameters (default: the current GPU, else the CPU).
    dtype : torch.dtype, optional
        The parameters' dtype (default ``torch.get_default_dtype()``).
    tensor_parallel_mode : {None, "column", "row"}, default None
        See :class:`BasicLinear`; with "column" the bias is split too, with "row" it is added
        after the output reduction.
    tensor_parallel_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    sequence_parallel : bool, default False
        See :class:`BasicLinear`.
    rng_state_tracker_function : callable, optional
        See :class:`BasicLinear`.
    accumulate_into_main_grad : bool, default False
        See :class:`BasicLinear`.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, device=None,
                 dtype: Optional[torch.dtype] = None, tensor_parallel_mode: Optional[str] = None,
                 tensor_parallel_group=None, sequence_parallel: bool = False,
                 rng_state_tracker_function: Optional[Callable] = None,
                 accumulate_into_main_grad: bool = False) -> None:
        linear = BasicLinear(in_features, out_features, device=device, dtype=dtype,
                             tensor_parallel_mode=tensor_parallel_mode,
                             tensor_parallel_group=tensor_parallel_group,
                             sequence_parallel=sequence_parallel,
                             rng_state_tracker_function=rng_state_tracker_function,
                             accumulate_into_main_grad=accumulate_into_main_grad)
        ops = [linear]
        if bias:
            ops.append(Bias(out_features, device=device, dtype=dtype,
                            tensor_parallel=tensor_parallel_mode == "column",
                            tensor_parallel_group=tensor_parallel_group))
        super().__init__(ops)

    @property
    def weight(self) -> torch.nn.Parameter:
        """The BasicLinear's weight."""
        return self.basic_ops[0].weight

    @property
    def bias(self) -> Optional[torch.nn.Parameter]:
        """The Bias's parameter, or None without bias."""
        return self.basic_ops[1].bias if len(self.basic_ops) > 1 else None
