"""MXFP8 tensor types of NVIDIA TE's API. MXFP8 (E8M0 scales per 32 elements) runs on no device
of this library (its GEMMs need NVIDIA Blackwell or AMD gfx950 and are not implemented here):
the names exist for code that imports them. A quantizer can be built (configuration code and
test parametrisations build them up front) and refuses to quantize; a tensor cannot be made."""
from __future__ import annotations

from .quantized_tensor import QuantizedTensor


def _refuse(who: str):
    from ...common.recipe import MXFP8BlockScaling
    raise NotImplementedError(f"{who}: {MXFP8BlockScaling().unsupported_reason()}")


class MXFP8Quantizer:
    """Built with NVIDIA TE's arguments; quantize / make_empty refuse (see the module docstring)."""

    def __init__(self, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True):
        self.dtype, self.rowwise_usage, self.columnwise_usage = fp8_dtype, rowwise, columnwise

    def quantize(self, *args, **kwargs):
        _refuse("MXFP8Quantizer.quantize")

    __call__ = quantize

    def make_empty(self, *args, **kwargs):
        _refuse("MXFP8Quantizer.make_empty")

    def update_quantized(self, *args, **kwargs):
        _refuse("MXFP8Quantizer.update_quantized")


class MXFP8Tensor(QuantizedTensor):
    """Refused on construction (see the module docstring)."""

    @staticmethod
    def __new__(cls, *args, **kwargs):
        _refuse("MXFP8Tensor")
