"""te.LayerNorm: LayerNorm over the last dimension with the native forward/backward kernels."""
from __future__ import annotations

from typing import Iterable, Optional, Union

import torch

from .. import kernels
from ._input_check import call_checked
from ._norm import param_for, reset_norm_params
from .base import default_device
from ._norm_args import resolve_norm_args


class LayerNorm(torch.nn.Module):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta (gamma stored as gamma - 1 with
    zero_centered_gamma)."""

    def __init__(self, normalized_shape: Union[int, Iterable[int], None] = None, eps: float = 1e-5,
                 sequence_parallel: bool = False, params_dtype: Optional[torch.dtype] = None,
                 zero_centered_gamma: bool = False, hidden_size: Optional[int] = None, **kwargs):
        hidden_size, params_dtype, device = resolve_norm_args(
            "LayerNorm", normalized_shape, hidden_size, params_dtype, kwargs)
        super().__init__()
        self.hidden_size, self.eps, self.zero_centered_gamma = hidden_size, eps, zero_centered_gamma
        self.sequence_parallel = sequence_parallel
        dtype = params_dtype or torch.get_default_dtype()
        device = default_device(device)
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device))
        self.weight.sequence_parallel = self.bias.sequence_parallel = sequence_parallel
        if device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        reset_norm_params(self.weight, self.bias, self.zero_centered_gamma)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        if inp.shape[-1] != self.hidden_size:
            raise ValueError(f"LayerNorm: input has shape {tuple(inp.shape)}; expected last "
                             f"dimension {self.hidden_size}")
        x = inp
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        x = x.contiguous()
        return kernels.layernorm(x, param_for(self.weight, x), param_for(self.bias, x), self.eps,
                             self.zero_centered_gamma)

    def __call__(self, *args, **kwargs):
        return call_checked(self, "inp", torch.nn.Module.__call__, args, kwargs)
