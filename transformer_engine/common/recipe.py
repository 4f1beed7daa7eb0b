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


@dataclasses.dataclass(frozen=True)
class QParams:
    """How one tensor role is quantised: power-of-two scales, and a floor for its amax."""
    power_2_scale: bool = False
    amax_epsilon: float = 0.0


@dataclasses.dataclass(frozen=True)
class MMParams:
    """GEMM options; use_split_accumulator: accumulate in full fp32 precision."""
    use_split_accumulator: bool = True


@dataclasses.dataclass()
class Float8BlockScaling(Recipe):
    """Block-wise FP8 with scales from each block's own amax, computed at every cast:
    activations (x) and gradients in 1x128 blocks along the GEMM's reduction dimension, weights in
    128x128 tiles (x/w/grad_block_scaling_dim 1 or 2; two 128x128 operands in one GEMM are not
    allowed). scale = fp8_max / amax per block, a power of two below it unless use_f32_scales
    (default: NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 at construction). The GEMMs accumulate in full
    precision. Natively served by cuBLASLt >= 12.9 on sm_90 (Hopper); on the reference backend
    everywhere (dequantise, matmul in fp32)."""
    use_f32_scales: Optional[bool] = None
    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: Optional[QParams] = None
    fp8_quant_fwd_weight: Optional[QParams] = None
    fp8_quant_bwd_grad: Optional[QParams] = None
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams()
    fp8_gemm_dgrad: MMParams = MMParams()
    fp8_gemm_wgrad: MMParams = MMParams()
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def __post_init__(self):
        who = "Float8BlockScaling"
        if self.backward_override is not None:
            raise NotImplementedError(f"{who}: backward_override={self.backward_override!r}; only "
                                      "None (FP8 backward GEMMs) is supported")
        if self.use_f32_scales is None:
            from .config import fp8_block_scaling_fp32_scales
            self.use_f32_scales = fp8_block_scaling_fp32_scales()
        default = QParams(power_2_scale=not self.use_f32_scales)
        for name in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, default)
            elif not isinstance(value, QParams):
                raise TypeError(f"{who}: {name} must be a recipe.QParams, got {value!r}")
            elif value.amax_epsilon != 0.0:
                raise NotImplementedError(f"{who}: {name}.amax_epsilon={value.amax_epsilon}; only "
                                          "0.0 is supported")
        if not isinstance(self.fp8_format, Format):
            raise TypeError(f"{who}: fp8_format must be a recipe.Format, got {self.fp8_format!r}")
        if self.fp8_format is Format.E5M2:
            raise ValueError(f"{who}: fp8_format=E5M2 is not supported; expected E4M3 or HYBRID")
        dims = {"x_block_scaling_dim": self.x_block_scaling_dim,
                "w_block_scaling_dim": self.w_block_scaling_dim,
                "grad_block_scaling_dim": self.grad_block_scaling_dim}
        for name, dim in dims.items():
            if dim not in (1, 2):
                raise ValueError(f"{who}: {name}={dim!r}; expected 1 (1x128) or 2 (128x128)")
        pairs = (("x", "w"), ("x", "grad"), ("w", "grad"))
        for p, q in pairs:
            if dims[f"{p}_block_scaling_dim"] == 2 and dims[f"{q}_block_scaling_dim"] == 2:
                raise ValueError(f"{who}: {p}_block_scaling_dim and {q}_block_scaling_dim are both "
                                 "2; a GEMM cannot take two 128x128-blocked operands")
        for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            mm = getattr(self, name)
            if not isinstance(mm, MMParams) or not mm.use_split_accumulator:
                raise ValueError(f"{who}: {name} must be MMParams(use_split_accumulator=True); "
                                 "block scaling needs the full-precision accumulator")
        if self.fp8_dpa or self.fp8_mha:
            raise NotImplementedError(f"{who}: fp8_dpa / fp8_mha (FP8 attention) are not "
                                      "supported with block scaling")

    def float8_block_scaling(self) -> bool:
        return True

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, format={self.fp8_format.name}, "
                f"use_f32_scales={self.use_f32_scales}, "
                f"x_block_scaling_dim={self.x_block_scaling_dim}, "
                f"w_block_scaling_dim={self.w_block_scaling_dim}, "
                f"grad_block_scaling_dim={self.grad_block_scaling_dim}")
