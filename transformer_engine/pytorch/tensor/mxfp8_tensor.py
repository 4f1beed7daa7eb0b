"""MXFP8 tensor types of NVIDIA TE's API. MXFP8 (E8M0 scales per 32 elements) runs on no device
of this library (its GEMMs need NVIDIA Blackwell or AMD gfx950 and are not implemented here):
the names exist for code that imports them, and making one raises a clear error."""
from __future__ import annotations

from .quantized_tensor import QuantizedTensor


def _refuse(who: str):
    from ...common.recipe import MXFP8BlockScaling
    raise NotImplementedError(f"{who}: {MXFP8BlockScaling().unsupported_reason()}")


class MXFP8Quantizer:
    """Refused on construction (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        _refuse("MXFP8Quantizer")


class MXFP8Tensor(QuantizedTensor):
    """Refused on construction (see the module docstring)."""

    @staticmethod
    def __new__(cls, *args, **kwargs):
        _refuse("MXFP8Tensor")
