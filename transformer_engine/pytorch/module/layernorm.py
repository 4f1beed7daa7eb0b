"""te.LayerNorm: LayerNorm over the last dimension with the native forward/backward kernels."""
from __future__ import annotations

from typing import Iterable, Optional, Union

import torch

from .. import kernels
from ..module_parts.input_check import call_checked
from ..module_parts.norm_args import param_for, reset_norm_params, resolve_norm_args
from .base import default_device


class LayerNorm(torch.nn.Module):
    """LayerNorm over the last dimension with native forward and backward kernels.

    Computes ``y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta``. The kernels run on NVIDIA
    and AMD GPUs for float32, bfloat16 and
    float16 inputs; elsewhere the reference implementation computes the same in float32.

    Parameters
    ----------
    normalized_shape : int or sequence of one int
        Size of the normalised (last) dimension. Only the last dimension can be normalised: a
        sequence of more than one size raises NotImplementedError.
    eps : float, default 1e-5
        Added to the variance (or mean square) before the square root.
    sequence_parallel : bool, default False
        Marks the parameters as sequence-parallel, so that training frameworks all-reduce their
        gradients over the tensor-parallel group.
    params_dtype : torch.dtype, optional
        Deprecated name of ``dtype`` (below); pass one of the two.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero), which keeps it precise in low
        precision formats; the output is ``... * (1 + gamma)``.
    hidden_size : int, optional
        Deprecated name of ``normalized_shape`` (a DeprecationWarning); pass one of the two.
    **kwargs : dict
        Keyword-only arguments, NVIDIA TE's: ``device``, ``dtype`` and ``sm_margin`` (described
        below); any other keyword raises TypeError.
    device : torch.device or str, optional
        Where the parameters are created: default the current CUDA/ROCm device when one exists,
        else the CPU. ``'meta'`` defers allocation: call ``to_empty()`` and then
        ``reset_parameters()`` to materialise the module.
    dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``).
    sm_margin : int or dict, default 0
        Streaming multiprocessors to leave free for concurrent communication kernels. Not
        implemented: only 0 (or a dict of zeros) is accepted.
    """

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
        """(Re)initialise the parameters in place: scale ones (zeros if zero-centred), bias zeros.

        Parameters
        ----------
        defer_init : bool, default False
            When True, do nothing (initialisation is left to a later call).
        """
        if defer_init:
            return
        reset_norm_params(self.weight, self.bias, self.zero_centered_gamma)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        """Normalise ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            Input of shape ``[..., hidden_size]``. Under ``torch.autocast`` it is computed in the
            autocast dtype.

        Returns
        -------
        torch.Tensor
            The normalised tensor, of the input's shape.
        """
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
        """Runs the module (``torch.nn.Module.__call__``: hooks, then :meth:`forward`) after
        checking its input.

        Parameters
        ----------
        *args : tuple
            Passed to :meth:`forward`; the first must be a float32, float16 or bfloat16 tensor
            (else ValueError naming the module).
        **kwargs : dict
            Passed to :meth:`forward`; ````inp```` may be given here by keyword instead.

        Returns
        -------
        What :meth:`forward` returns.
        """
        return call_checked(self, "inp", torch.nn.Module.__call__, args, kwargs)
