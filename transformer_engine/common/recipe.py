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
    """The FP8 formats a recipe uses for forward and backward tensors.

    ``E4M3``: E4M3 everywhere (more precision, max 448, or 240 on AMD gfx942). ``E5M2``: E5M2
    everywhere (more range, max 57344). ``HYBRID``: E4M3 for activations and weights, E5M2 for
    gradients, the usual choice for training. Each member's value has ``fwd`` and ``bwd`` format
    names and ``max_fwd``/``max_bwd`` for the current device.
    """
    E4M3 = _FormatHelper(fwd=fp8_formats.E4M3, bwd=fp8_formats.E4M3)
    E5M2 = _FormatHelper(fwd=fp8_formats.E5M2, bwd=fp8_formats.E5M2)
    HYBRID = _FormatHelper(fwd=fp8_formats.E4M3, bwd=fp8_formats.E5M2)


class Recipe:
    """Base class of the FP8 recipes; its predicates let callers branch on the recipe family."""

    def delayed(self) -> bool:
        """Whether this recipe is delayed scaling.

        Returns
        -------
        bool
            True for :class:`DelayedScaling`.
        """
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self) -> bool:
        """Whether this recipe is per-tensor current scaling.

        Returns
        -------
        bool
            True for :class:`Float8CurrentScaling`.
        """
        return isinstance(self, Float8CurrentScaling)

    def float8_per_tensor_scaling(self) -> bool:
        """Whether this recipe scales each tensor with one factor.

        Returns
        -------
        bool
            True for delayed and current scaling.
        """
        return self.delayed() or self.float8_current_scaling()

    def mxfp8(self) -> bool:
        """Whether this recipe is MXFP8 block scaling.

        Returns
        -------
        bool
            Always False: MXFP8 is not implemented.
        """
        return False

    def float8_block_scaling(self) -> bool:
        """Whether this recipe is FP8 block scaling.

        Returns
        -------
        bool
            Always False: block scaling is not implemented.
        """
        return False

    def nvfp4(self) -> bool:
        """Whether this recipe is NVFP4.

        Returns
        -------
        bool
            Always False: NVFP4 is not implemented.
        """
        return False


_AMAX_ALGOS = ("max", "most_recent")


@dataclasses.dataclass()
class DelayedScaling(Recipe):
    """Per-tensor FP8 scaling from the amax history of earlier steps.

    Each FP8 tensor of a module keeps a history of its absolute maxima (amax). A step casts with
    the current scale and records its amax; after the step, on the device,
    ``amax = reduce(history)`` and ``scale = fp8_max / amax / 2**margin``. Where amax is zero or
    not finite the previous scale is kept. Supported by the PyTorch and JAX frontends on every
    backend (NVIDIA sm_89+, AMD gfx942/gfx950, emulated on the CPU).

    Parameters
    ----------
    margin : int, default 0
        Extra headroom: the scale is divided by ``2 ** margin``; must be >= 0.
    interval : int, default 1
        Deprecated; only 1 (update after every step) is accepted.
    fp8_format : Format, default Format.HYBRID
        The FP8 formats: ``Format.HYBRID`` (E4M3 for activations and weights, E5M2 for gradients),
        ``Format.E4M3`` (everywhere) or ``Format.E5M2``. The maxima follow the device: E4M3 448 on
        NVIDIA, AMD gfx950 and the CPU (OCP), 240 on AMD gfx942 (FNUZ).
    amax_history_len : int, default 1024
        Number of steps of amax history kept per tensor (>= 1).
    amax_compute_algo : {'max', 'most_recent'} or callable, default 'max'
        How the history is reduced to one amax: its maximum, the latest value, or a callable taking
        the ``[history_len, n]`` history tensor and returning ``[n]``.
    scaling_factor_compute_algo : callable, optional
        A custom scale computation ``(amax, scale, fp8_max, recipe) -> scale``. Not supported by
        the modules (they raise NotImplementedError); ``None`` uses the formula above.
    reduce_amax : bool, default True
        In distributed training, reduce the amaxes (maximum) over the autocast's amax reduction
        group before the update, so that all ranks use the same scales.
    fp8_dpa : bool, default False
        Accepted for compatibility: the attention's own GEMMs (``q k^T`` and ``p v``) run in the
        activation dtype.
    fp8_mha : bool, default False
        Accepted for compatibility, as ``fp8_dpa``.
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
    """Per-tensor FP8 scaling from each tensor's own amax, computed just before its cast.

    ``scale = fp8_max / amax(tensor)``; no state is kept between steps, which makes it suited to
    ``torch.compile`` and to tensors whose range changes quickly. Supported by the PyTorch and JAX
    frontends on every backend.

    Parameters
    ----------
    fp8_format : Format, default Format.HYBRID
        The FP8 formats: ``Format.HYBRID`` (E4M3 for activations and weights, E5M2 for gradients),
        ``Format.E4M3`` (everywhere) or ``Format.E5M2``. The maxima follow the device: E4M3 448 on
        NVIDIA, AMD gfx950 and the CPU (OCP), 240 on AMD gfx942 (FNUZ).
    use_power_2_scales : bool, default False
        Round each scale down to a power of two, so that scaling is exact in binary.
    fp8_dpa : bool, default False
        Accepted for compatibility: the attention's own GEMMs (``q k^T`` and ``p v``) run in the
        activation dtype.
    fp8_mha : bool, default False
        Accepted for compatibility, as ``fp8_dpa``.
    """
    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self):
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"Float8CurrentScaling: fp8_format must be a recipe.Format, got {self.fp8_format!r}")

    def __repr__(self) -> str:
        return f"recipe_type={type(self).__name__}, format={self.fp8_format.name}"
