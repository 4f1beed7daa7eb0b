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
    """Quantizer of the MXFP8 format (E4M3 or E5M2 data, one E8M0 scale per 32 elements).

    MXFP8 is not implemented on any device of this library: the quantizer can be built, so that
    configuration code constructing one up front works, and every method that would quantize
    raises NotImplementedError.

    Parameters
    ----------
    fp8_dtype : DType or torch.dtype
        The FP8 format of the data; stored as the ``dtype`` attribute.
    rowwise : bool, default True
        Stored as ``rowwise_usage``.
    columnwise : bool, default True
        Stored as ``columnwise_usage``.
    """

    def __init__(self, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True):
        self.dtype, self.rowwise_usage, self.columnwise_usage = fp8_dtype, rowwise, columnwise

    def quantize(self, *args, **kwargs):
        """Raises NotImplementedError: MXFP8 is not implemented here.

        Parameters
        ----------
        *args : tuple
            Ignored.
        **kwargs : dict
            Ignored.
        """
        _refuse("MXFP8Quantizer.quantize")

    __call__ = quantize

    def make_empty(self, *args, **kwargs):
        """Raises NotImplementedError: MXFP8 is not implemented here.

        Parameters
        ----------
        *args : tuple
            Ignored.
        **kwargs : dict
            Ignored.
        """
        _refuse("MXFP8Quantizer.make_empty")

    def update_quantized(self, *args, **kwargs):
        """Raises NotImplementedError: MXFP8 is not implemented here.

        Parameters
        ----------
        *args : tuple
            Ignored.
        **kwargs : dict
            Ignored.
        """
        _refuse("MXFP8Quantizer.update_quantized")


class MXFP8Tensor(QuantizedTensor):
    """Tensor of the MXFP8 format. MXFP8 is not implemented on any device of this library:
    constructing one raises NotImplementedError; the class exists for code that imports it or
    checks ``isinstance``.

    Parameters
    ----------
    *args : tuple
        Ignored.
    **kwargs : dict
        Ignored.
    """

    @staticmethod
    def __new__(cls, *args, **kwargs):
        _refuse("MXFP8Tensor")
