"""Float8Tensor: a torch.Tensor subclass that stores only FP8 data and its scale_inv.

Its dtype is the nominal (high-precision) dtype; any torch op that is not taught about FP8
sees the dequantised value (data * scale_inv), so it behaves like a plain tensor. In-place ops
(optimizer steps, copy_ from load_state_dict) compute in high precision and quantise back with a
fresh per-tensor scale (current scaling), so the parameter never holds a high-precision copy.
TE modules read `_data`, `_scale_inv` and the cached FP8 transpose directly.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils._pytree import tree_map

from ...common import fp8_formats

aten = torch.ops.aten


def _fp8_max(fp8_dtype: torch.dtype) -> float:
    fmt, flavor = fp8_formats.format_of_dtype_name(str(fp8_dtype).replace("torch.", ""))
    return fp8_formats.fp8_max(fmt, flavor)


def _quantize_current(x: torch.Tensor, fp8_dtype: torch.dtype):
    """(fp8 data, scale_inv) of x with scale = fp8_max / amax(x), all on x's device."""
    from ..kernels import quantize
    from ..quantization import scale_from_amax
    x = x.contiguous()
    amax = x.abs().amax().float().reshape(1) if x.numel() else torch.zeros(1, device=x.device)
    scale = scale_from_amax(amax, torch.full((1,), _fp8_max(fp8_dtype), device=x.device), False)
    data, scale_inv = quantize(x, scale.contiguous(), fp8_dtype)
    return data, scale_inv


class Float8Tensor(torch.Tensor):
    """A tensor stored as FP8 data and one float32 inverse scale.

    Behaves as a tensor of its nominal ``dtype``: operations that do not know about FP8
    dequantise it (``data * scale_inv``). The modules use it for FP8-only weights (see
    :func:`quantized_model_init`) and keep its transpose cached for the backward GEMMs.

    Parameters
    ----------
    data : torch.Tensor
        The FP8 values (a ``torch.float8_*`` dtype).
    scale_inv : torch.Tensor
        One-element float32 tensor: the factor that turns ``data`` back into real values.
    dtype : torch.dtype
        The nominal (high-precision) dtype, e.g. ``torch.bfloat16``.
    requires_grad : bool, default False
        Whether autograd tracks the tensor.
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                requires_grad: bool = False):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=dtype, device=data.device,
                                                 requires_grad=requires_grad)
        t._data = data
        t._scale_inv = scale_inv
        t._transpose_cache = None
        return t

    @classmethod
    def quantize(cls, x: torch.Tensor, fp8_dtype: torch.dtype, dtype: Optional[torch.dtype] = None,
                 requires_grad: bool = False) -> "Float8Tensor":
        """Quantise ``x`` with its own amax (current scaling): ``scale = fp8_max / amax(x)``.

        Parameters
        ----------
        x : torch.Tensor
            The high-precision tensor.
        fp8_dtype : torch.dtype
            The FP8 dtype to store (see :func:`fp8_dtype` for the one a device uses).
        dtype : torch.dtype, optional
            The nominal dtype (default ``x.dtype``).
        requires_grad : bool, default False
            Whether autograd tracks the result.
        """
        data, scale_inv = _quantize_current(x.detach(), fp8_dtype)
        return cls(data, scale_inv, dtype or x.dtype, requires_grad)

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self._data.dtype

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values in high precision (``data * scale_inv``).

        Parameters
        ----------
        dtype : torch.dtype, optional
            The result's dtype (default the nominal dtype).
        """
        from ..kernels import dequantize
        return dequantize(self._data, self._scale_inv, dtype or self.dtype)

    def transpose_fp8(self) -> torch.Tensor:
        """FP8 data of the 2-D transpose, made once and kept until the value changes."""
        if self._transpose_cache is None:
            from ..kernels import transpose
            self._transpose_cache = transpose(self._data)
        return self._transpose_cache

    def _requantize_from(self, value: torch.Tensor) -> None:
        data, scale_inv = _quantize_current(value.to(self.dtype), self._data.dtype)
        self._data.copy_(data)
        self._scale_inv.copy_(scale_inv)
        self._transpose_cache = None

    def __repr__(self, *, tensor_contents=None):
        return (f"Float8Tensor(fp8_dtype={self._data.dtype}, scale_inv={self._scale_inv.item():.6g}, "
                f"nominal_dtype={self.dtype}, data={self.dequantize()})")

    def __reduce_ex__(self, protocol):
        return (_rebuild_float8_tensor, (self._data, self._scale_inv, self.dtype, self.requires_grad))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            src = args[0]
            out = Float8Tensor(src._data, src._scale_inv, src.dtype)
            out._transpose_cache = src._transpose_cache
            return out
        if func is aten.clone.default and isinstance(args[0], Float8Tensor):
            src = args[0]
            return Float8Tensor(src._data.clone(), src._scale_inv.clone(), src.dtype)
        if func is aten._to_copy.default and isinstance(args[0], Float8Tensor):
            src = args[0]
            dtype = kwargs.get("dtype") or src.dtype
            device = kwargs.get("device") or src.device
            if dtype in (torch.float32, torch.float16, torch.bfloat16):
                return Float8Tensor(src._data.to(device), src._scale_inv.to(device), dtype)
        if func is aten.copy_.default and isinstance(args[0], Float8Tensor):
            dst, src = args[0], args[1]
            if isinstance(src, Float8Tensor) and src._data.dtype == dst._data.dtype:
                dst._data.copy_(src._data)
                dst._scale_inv.copy_(src._scale_inv)
                dst._transpose_cache = None
            else:
                dst._requantize_from(src.dequantize() if isinstance(src, Float8Tensor) else src)
            return dst
        plain = tree_map(lambda a: a.dequantize() if isinstance(a, Float8Tensor) else a, (args, kwargs))
        result = func(*plain[0], **plain[1])
        mutable = func._schema.is_mutable and args and isinstance(args[0], Float8Tensor)
        if mutable:
            # in-place op (e.g. an optimizer's add_): the result lives in the dequantised copy
            args[0]._requantize_from(plain[0][0])
            return args[0]
        return result


def _rebuild_float8_tensor(data, scale_inv, dtype, requires_grad):
    return Float8Tensor(data, scale_inv, dtype, requires_grad)
