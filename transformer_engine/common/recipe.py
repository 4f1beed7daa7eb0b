"""FP8 recipes with NVIDIA Transformer Engine's names and fields.

A recipe says how tensors are scaled into FP8. Format maxima come from the device's FP8 flavour
(OCP: E4M3 448, FNUZ on MI300: E4M3 240) through transformer_engine.common.fp8_formats.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Optional, Union

from . import fp8_formats


@dataclasses.dataclass(frozen=True)
class _FormatHelper:
    """The FP8 format of forward tensors (activations, weights) and of backward ones (grads)."""
    fwd: str
    bwd: str

    def max_fwd_for(self, flavor: str = fp8_formats.OCP) -> float:
        return fp8_formats.fp8_max(self.fwd, flavor)

    def max_bwd_for(self, flavor: str = fp8_formats.OCP) -> float:
        return fp8_formats.fp8_max(self.bwd, flavor)

    @property
    def max_fwd(self) -> float:
        """Largest forward value on the current device (OCP numbers on the reference backend)."""
        return self.max_fwd_for(_current_flavor())

    @property
    def max_bwd(self) -> float:
        return self.max_bwd_for(_current_flavor())


def _current_flavor() -> str:
    from .capabilities import native_device_capability
    return native_device_capability().fp8_flavor or fp8_formats.OCP


class Format(enum.Enum):
    """E4M3 everywhere, E5M2 everywhere, or HYBRID: E4M3 forward and E5M2 for gradients."""
    E4M3 = _FormatHelper(fwd=fp8_formats.E4M3, bwd=fp8_formats.E4M3)
    E5M2 = _FormatHelper(fwd=fp8_formats.E5M2, bwd=fp8_formats.E5M2)
    HYBRID = _FormatHelper(fwd=fp8_formats.E4M3, bwd=fp8_formats.E5M2)


class Recipe:
    """Base class; the predicates let callers branch on the recipe family."""

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        return isinstance(self, Float8CurrentScaling)

    def float8_per_tensor_scaling(self) -> bool:
        return self.delayed() or self.float8_current_scaling()

    def mxfp8(self) -> bool:
        return False

    def float8_block_scaling(self) -> bool:
        return False

    def nvfp4(self) -> bool:
        return False


_AMAX_ALGOS = ("max", "most_recent")


@dataclasses.dataclass()
class DelayedScaling(Recipe):
    """Per-tensor scaling from a history of amax values of earlier steps.

    After each step, for every FP8 tensor: amax = reduce(history) (amax_compute_algo: 'max',
    'most_recent', or a callable taking the [len, n] history), then
    scale = (fp8_max / amax) / 2**margin, keeping the old scale where amax is 0 or not finite
    (or where scaling_factor_compute_algo, a callable (amax, scale, fp8_max, recipe) -> scale,
    says otherwise). With reduce_amax, amaxes are reduced over the autocast's group first.
    """
    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"DelayedScaling: fp8_format must be a recipe.Format, got {self.fp8_format!r}")
        if isinstance(self.amax_compute_algo, str) and self.amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(f"DelayedScaling: amax_compute_algo={self.amax_compute_algo!r}; "
                             f"expected 'max', 'most_recent' or a callable")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"DelayedScaling: amax_history_len={self.amax_history_len!r}; expected an int >= 1")
        if self.interval != 1:
            raise ValueError("DelayedScaling: interval is deprecated and only 1 is supported")
        if self.margin < 0:
            raise ValueError(f"DelayedScaling: margin={self.margin}; expected >= 0")

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, margin={self.margin}, "
                f"format={self.fp8_format.name}, amax_history_len={self.amax_history_len}, "
                f"amax_compute_algo={self.amax_compute_algo}, reduce_amax={self.reduce_amax}")


@dataclasses.dataclass()
class Float8CurrentScaling(Recipe):
    """Per-tensor scaling from the tensor's own amax, computed just before each cast:
    scale = fp8_max / amax (a power of two below it when use_power_2_scales)."""
    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"Float8CurrentScaling: fp8_format must be a recipe.Format, got {self.fp8_format!r}")

    def __repr__(self) -> str:
        return f"recipe_type={type(self).__name__}, format={self.fp8_format.name}"
