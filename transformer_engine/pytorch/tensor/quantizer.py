"""Quantizers: objects that turn a high-precision tensor into a quantized tensor with a given
scaling rule, as NVIDIA Transformer Engine's public tensor API has them.

Float8Quantizer: a given per-tensor scale (delayed scaling); each quantize maxes the input's
amax into `amax`. Float8CurrentScalingQuantizer: the scale comes from the input's own amax at
each quantize (optionally all-reduced over a group, floored at amax_epsilon, rounded down to a
power of two). Both return Float8Tensor; `make_empty` allocates one without data.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..constants import DType, torch_dtype_of
from .float8_tensor import Float8Tensor, fp8_max_of_dtype

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _fp8_torch_dtype(who: str, fp8_dtype, device) -> torch.dtype:
    if not isinstance(fp8_dtype, (DType, torch.dtype)):
        raise TypeError(f"{who}: fp8_dtype must be a transformer_engine.pytorch.DType or torch FP8 "
                        f"dtype, got {fp8_dtype!r}")
    dt = torch_dtype_of(fp8_dtype, device)
    if dt not in _FP8_DTYPES:
        raise ValueError(f"{who}: fp8_dtype is {fp8_dtype!r}; expected an FP8 type (E4M3 or E5M2)")
    return dt


class Quantizer:
    """Common part: which usages (rowwise data, columnwise = transposed data) to produce."""

    def __init__(self, rowwise: bool = True, columnwise: bool = True):
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False

    def set_usage(self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None) -> None:
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def __call__(self, tensor: torch.Tensor) -> Float8Tensor:
        return self.quantize(tensor)

    def _check_input(self, tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.quantize: expected a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if isinstance(tensor, Float8Tensor):
            tensor = tensor.dequantize()
        if not tensor.is_floating_point():
            raise TypeError(f"{type(self).__name__}.quantize: expected a floating-point tensor, "
                            f"got {tensor.dtype}")
        return tensor

    def _finish(self, x: torch.Tensor, data, scale_inv, dtype, out: Optional[Float8Tensor]):
        if out is not None:
            out._data.copy_(data.view(out._data.shape))
            out._scale_inv.copy_(scale_inv)
            out._transpose_cache = None
            return out
        t = Float8Tensor(data.view(x.shape), scale_inv, dtype or x.dtype)
        t._quantizer = self
        if self.columnwise_usage and x.dim() == 2 and x.numel():
            t.transpose_fp8()  # made now, as the quantizer was asked for the columnwise copy
        return t

    def make_empty(self, shape, dtype: torch.dtype = torch.float32,
                   device: Optional[torch.device] = None, requires_grad: bool = False) -> Float8Tensor:
        device = torch.device(device) if device is not None else self._device()
        data = torch.empty(tuple(shape), dtype=self.dtype, device=device)
        scale_inv = torch.ones(1, dtype=torch.float32, device=device)
        t = Float8Tensor(data, scale_inv, dtype, requires_grad)
        t._quantizer = self
        return t

    def update_quantized(self, src: torch.Tensor, dst: Float8Tensor) -> Float8Tensor:
        """dst's data re-made from src with this quantizer's rule."""
        return self.quantize(src, out=dst)


class Float8Quantizer(Quantizer):
    """FP8 with a given scale (delayed scaling): data = cast(x * scale), scale_inv = 1/scale;
    amax <- max(amax, max|x|)."""

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype, *, rowwise: bool = True,
                 columnwise: bool = True):
        super().__init__(rowwise, columnwise)
        who = "Float8Quantizer"
        for name, t in (("scale", scale), ("amax", amax)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
                raise TypeError(f"{who}: {name} must be a one-element float32 tensor, got "
                                f"{getattr(t, 'dtype', type(t).__name__)} with "
                                f"{getattr(t, 'numel', lambda: '?')()} elements")
        self.scale, self.amax = scale, amax
        self.dtype = _fp8_torch_dtype(who, fp8_dtype, scale.device)

    def _device(self):
        return self.scale.device

    def quantize(self, tensor: torch.Tensor, *, out: Optional[Float8Tensor] = None,
                 dtype: Optional[torch.dtype] = None) -> Float8Tensor:
        from ..kernels import quantize
        x = self._check_input(tensor).contiguous()
        scale = self.scale.reshape(1).to(x.device)
        amax = self.amax.reshape(1)
        if x.numel():
            data, scale_inv = quantize(x, scale, self.dtype, amax if amax.device == x.device else None)
            if amax.device != x.device:
                amax.copy_(torch.maximum(amax, x.abs().amax().float().reshape(1).to(amax.device)))
        else:
            data = torch.empty(x.shape, dtype=self.dtype, device=x.device)
            scale_inv = torch.reciprocal(scale)
        return self._finish(x, data, scale_inv, dtype, out)


class Float8CurrentScalingQuantizer(Quantizer):
    """FP8 with scale = fp8_max / amax(x) computed for each quantize (amax all-reduced over
    amax_reduction_group when with_amax_reduction, floored at amax_epsilon; a power of two when
    force_pow_2_scales). `scale` and `amax` hold the last quantize's values."""

    def __init__(self, fp8_dtype, device=None, *, rowwise: bool = True, columnwise: bool = True,
                 use_existing_amax: bool = False, with_amax_reduction: bool = False,
                 amax_reduction_group=None, force_pow_2_scales: bool = False,
                 amax_epsilon: float = 0.0):
        super().__init__(rowwise, columnwise)
        who = "Float8CurrentScalingQuantizer"
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(device)
        self.dtype = _fp8_torch_dtype(who, fp8_dtype, device)
        if amax_epsilon < 0:
            raise ValueError(f"{who}: amax_epsilon is {amax_epsilon}; expected >= 0")
        self.device = device
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.use_existing_amax = use_existing_amax
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = float(amax_epsilon)

    def _device(self):
        return self.device

    def quantize(self, tensor: torch.Tensor, *, out: Optional[Float8Tensor] = None,
                 dtype: Optional[torch.dtype] = None) -> Float8Tensor:
        from ..kernels import quantize
        from ..quantization import scale_from_amax
        x = self._check_input(tensor).contiguous()
        if not self.use_existing_amax:
            amax = x.abs().amax().float().reshape(1) if x.numel() else torch.zeros(1, device=x.device)
            if self.with_amax_reduction:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
            self.amax = amax.to(self.device)
        amax = self.amax.to(x.device)
        if self.amax_epsilon:
            amax = torch.clamp(amax, min=self.amax_epsilon)
        fp8_max = torch.full((1,), fp8_max_of_dtype(self.dtype), device=x.device)
        scale = scale_from_amax(amax, fp8_max, self.force_pow_2_scales).contiguous()
        self.scale = scale.to(self.device)
        if x.numel():
            data, scale_inv = quantize(x, scale, self.dtype)
        else:
            data = torch.empty(x.shape, dtype=self.dtype, device=x.device)
            scale_inv = torch.reciprocal(scale)
        return self._finish(x, data, scale_inv, dtype, out)
