"""LayerNorm and RMSNorm over the trailing `normalized_shape` dimensions."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ... import kernels
from ..op import PREFIX, BasicOperation, op_name
from ._common import check_device, default_device, default_dtype, high_precision, param_as


def _normalized_shape(who: str, normalized_shape) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape):
        raise ValueError(f"{PREFIX}.{who}: normalized_shape is {normalized_shape!r}; expected a "
                         "positive int or a non-empty sequence of them")
    return shape


class _Norm(BasicOperation):
    rms = False

    def __init__(self, normalized_shape, *, eps: float = 1e-5, device=None,
                 dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 sm_margin=0) -> None:
        super().__init__()
        who = type(self).__name__
        self.normalized_shape = _normalized_shape(who, normalized_shape)
        if not (isinstance(eps, (int, float)) and eps >= 0):
            raise ValueError(f"{PREFIX}.{who}: eps is {eps!r}; expected a number >= 0")
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sm_margin = sm_margin  # a launch hint of NVIDIA's kernels; ours take none
        device, dtype = default_device(device), default_dtype(who, dtype)
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device,
                                                     dtype=dtype))
        if not self.rms:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device,
                                                       dtype=dtype))
        if device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight ones (zeros with ``zero_centered_gamma``), bias zeros."""
        if self.weight.device.type == "meta":  # deferred: model.to_empty(device=...) first
            return
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if not self.rms:
                self.bias.zero_()

    def _params(self, dtype):
        # the kernels take weights in the input's dtype or float32
        def conv(p):
            p = p if p.dtype in (dtype, torch.float32) else p.to(dtype)
            return p.reshape(-1).contiguous()
        return conv(self.weight), (None if self.rms else conv(self.bias))

    def _check(self, x):
        check_device(self, x, self.weight)
        nd = len(self.normalized_shape)
        if x.dim() < nd or tuple(x.shape[-nd:]) != self.normalized_shape:
            raise ValueError(f"{op_name(self)}: input has shape {tuple(x.shape)}; expected it to "
                             f"end with normalized_shape {self.normalized_shape}")

    def _norm_forward(self, ctx, x, fp8_out=None):
        """The normalised x in the compute dtype, or with fp8_out = (fp8 dtype, scale, amax)
        the kernels' NormOutput with FP8 data of shape [rows, inner]."""
        self._check(x)
        inner = math.prod(self.normalized_shape)
        x2 = high_precision(x, ctx.dtype).reshape(-1, inner)
        g, b = self._params(ctx.dtype)
        fp8 = {} if fp8_out is None else dict(zip(("fp8_dtype", "scale", "amax"), fp8_out))
        if self.rms:
            res = kernels.rmsnorm_fwd(x2, g, self.eps, self.zero_centered_gamma, **fp8)
        else:
            res = kernels.layernorm_fwd(x2, g, b, self.eps, self.zero_centered_gamma, **fp8)
        ctx.save_for_backward(x2, res.mu, res.rsigma, g)
        ctx.x_shape = tuple(x.shape)
        return res if fp8_out is not None else res.out.reshape(x.shape)

    def _norm_backward(self, ctx, dz):
        x2, mu, rsigma, g = ctx.saved_tensors
        dz2 = high_precision(dz, ctx.dtype).reshape(x2.shape)
        if self.rms:
            dx, dg = kernels.rmsnorm_bwd(dz2, x2, rsigma, g, self.zero_centered_gamma)
            grads = [dg.reshape(self.normalized_shape)]
        else:
            dx, dg, db = kernels.layernorm_bwd(dz2, x2, mu, rsigma, g, self.zero_centered_gamma)
            grads = [dg.reshape(self.normalized_shape), db.reshape(self.normalized_shape)]
        return dx.reshape(ctx.x_shape), grads

    def _forward(self, ctx, x, extra_inputs):
        return self._norm_forward(ctx, x), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        dx, grads = self._norm_backward(ctx, dy)
        return dx, (), grads


_DOC = """{title}

    ``{formula}`` over the trailing ``normalized_shape`` dimensions, computed in fp32 by the
    kernels of ``transformer_engine.pytorch.kernels.normalization``. Followed by
    :class:`BasicLinear` under DelayedScaling, the norm writes the GEMM's FP8 input directly.

    Parameters
    ----------
    normalized_shape : int or iterable of int
        The trailing dimensions normalised over.
    eps : float, default 1e-5
        Added to the {what} before the square root.
    device : torch.device or str, optional
        Where to create the parameters (default: the current GPU, else the CPU).
    dtype : torch.dtype, optional
        The parameters' dtype (default ``torch.get_default_dtype()``).
    zero_centered_gamma : bool, default False
        The weight is stored as ``gamma - 1`` (initialised to zeros) and ``1 + weight`` scales.
    sm_margin : int or dict, default 0
        A launch hint of NVIDIA's kernels (SMs left free); accepted and not used.
    """


class LayerNorm(_Norm):
    __doc__ = _DOC.format(title="Layer normalisation.", what="variance",
                          formula="y = (x - mean) / sqrt(var + eps) * weight + bias")


class RMSNorm(_Norm):
    __doc__ = _DOC.format(title="Root-mean-square normalisation.", what="mean square",
                          formula="y = x / sqrt(mean(x^2) + eps) * weight")
    rms = True
