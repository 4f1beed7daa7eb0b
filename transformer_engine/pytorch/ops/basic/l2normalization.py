"""L2Normalization: y = x / sqrt(sum(x^2) + eps) over the last dimension."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import kernels
from ..op import PREFIX, BasicOperation
from ._common import high_precision


class L2Normalization(BasicOperation):
    """L2 normalisation over the last dimension: ``y = x / sqrt(sum(x^2) + eps)``.

    It runs the RMSNorm kernels: with n values per row, ``y = x rsqrt(mean(x^2) + eps/n)
    / sqrt(n)``, the factor ``1/sqrt(n)`` taken as an fp32 weight so the result is rounded
    once.

    Parameters
    ----------
    eps : float, default 1e-6
        Added to the sum of squares.
    seq_length : int, optional
        A compilation hint of NVIDIA's implementation; accepted and not used.
    micro_batch_size : int, optional
        A compilation hint of NVIDIA's implementation; accepted and not used.
    """

    def __init__(self, *, eps: float = 1e-6, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None) -> None:
        super().__init__()
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"{PREFIX}.L2Normalization: eps is {eps!r}; expected a number >= 0")
        self.eps = float(eps)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size

    def _forward(self, ctx, x, extra_inputs):
        n = x.shape[-1]
        x2 = high_precision(x, ctx.dtype).reshape(-1, n)
        gamma = torch.full((n,), 1.0 / math.sqrt(n), dtype=torch.float32, device=x.device)
        res = kernels.rmsnorm_fwd(x2, gamma, self.eps / n)
        ctx.save_for_backward(x2, res.rsigma, gamma)
        ctx.x_shape = tuple(x.shape)
        return res.out.reshape(x.shape), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        x2, rsigma, gamma = ctx.saved_tensors
        dx, _ = kernels.rmsnorm_bwd(high_precision(dy, ctx.dtype).reshape(x2.shape), x2, rsigma,
                                    gamma)
        return dx.reshape(ctx.x_shape), (), []
