"""Constructor arguments that te.LayerNorm and te.RMSNorm share with NVIDIA TE: the size as
`normalized_shape` (torch.nn.LayerNorm's name; `hidden_size` is its deprecated alias) and the
keyword-only device / dtype / sm_margin; the normalisation choice and parameters that the
norm modules and LayerNormLinear / LayerNormMLP share."""
from __future__ import annotations

import warnings
from typing import Iterable, Optional, Union

import torch

_KWARGS = ("device", "dtype", "sm_margin")


def resolve_norm_args(who: str, normalized_shape: Union[int, Iterable[int], None],
                      hidden_size: Optional[int], params_dtype: Optional[torch.dtype], kwargs: dict):
    """(size of the normalised last dimension, dtype, device) from the constructor's arguments."""
    unknown = sorted(k for k in kwargs if k not in _KWARGS)
    if unknown:
        raise TypeError(f"{who}.__init__() got an unexpected keyword argument {unknown[0]!r}")
    if normalized_shape is None:
        if hidden_size is None:
            raise TypeError(f"{who}: normalized_shape is required (hidden_size is its deprecated alias)")
        warnings.warn(f"{who}: hidden_size is deprecated; pass normalized_shape", DeprecationWarning,
                      stacklevel=3)
        normalized_shape = hidden_size
    elif hidden_size is not None:
        raise TypeError(f"{who}: pass normalized_shape or hidden_size (deprecated), not both")
    if isinstance(normalized_shape, int):
        size = normalized_shape
    else:
        dims = tuple(normalized_shape)
        if len(dims) != 1:
            raise NotImplementedError(f"{who}: normalized_shape={dims}: only the last dimension can "
                                      "be normalised (one size)")
        size = dims[0]
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{who}: normalized_shape is {normalized_shape!r}; expected a positive int")
    if params_dtype is not None and kwargs.get("dtype") is not None:
        raise TypeError(f"{who}: pass dtype or params_dtype (deprecated), not both")
    dtype = kwargs.get("dtype") or params_dtype
    margin = kwargs.get("sm_margin", 0)
    margins = margin.values() if isinstance(margin, dict) else (margin,)
    if any(m != 0 for m in margins):
        raise NotImplementedError(f"{who}: sm_margin={margin!r}: reserving SMs is not implemented; "
                                  "leave it at 0")
    return size, dtype, kwargs.get("device")


NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(who, normalization):
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{who}: normalization is {normalization!r}; expected 'LayerNorm' or 'RMSNorm'")


def param_for(w, x):
    """gamma/beta as the kernels take them: in x's dtype or fp32 (16-bit params of an fp32 x are
    cast)."""
    if w is None:
        return None
    return w if w.dtype in (x.dtype, torch.float32) else w.to(x.dtype)


def reset_norm_params(weight, bias, zero_centered_gamma):
    """gamma = 1 (stored as 0 with zero_centered_gamma), beta = 0."""
    with torch.no_grad():
        weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if bias is not None:
            bias.zero_()
