"""FP8 recipes with NVIDIA Transformer Engine's names and fields.

A recipe says how tensors are scaled into FP8. Format maxima come from the device's FP8 flavour
(OCP: E4M3 448, FNUZ on MI300: E4M3 240) through transformer_engine.common.fp8_formats.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import warnings
from typing import Callable, Optional, Union

from . import config, fp8_formats


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
    # FP4 (NVFP4BlockScaling); no device of this library runs it (see NVFP4BlockScaling)
    E2M1 = _FormatHelper(fwd="e2m1", bwd="e2m1")


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
        """Whether this recipe is MXFP8 block scaling."""
        return isinstance(self, MXFP8BlockScaling)

    def float8_block_scaling(self) -> bool:
        """Whether this recipe is FP8 block scaling (1x128 / 128x128 blocks)."""
        return isinstance(self, Float8BlockScaling)

    def nvfp4(self) -> bool:
        """Whether this recipe is NVFP4."""
        return isinstance(self, NVFP4BlockScaling)

    def custom(self) -> bool:
        """Whether this recipe is a user-defined (custom) recipe; none of this library's
        recipes is.

        Returns
        -------
        bool
            False.
        """
        return False


@dataclasses.dataclass(frozen=True)
class MMParams:
    """Options of one of a recipe's GEMMs (``fp8_gemm_fprop``, ``fp8_gemm_dgrad``,
    ``fp8_gemm_wgrad``).

    Parameters
    ----------
    use_split_accumulator : bool, default True
        Accumulate the FP8 GEMM in full FP32 precision (on NVIDIA: cuBLASLt's FP8 fast
        accumulation off). False allows the faster, less precise accumulation.
    """
    use_split_accumulator: bool = True


@dataclasses.dataclass(frozen=True)
class QParams:
    """Quantization options of one of a recipe's tensor kinds (inputs, weights, gradients), as
    NVIDIA TE's block-scaled recipes take them.

    Parameters
    ----------
    power_2_scale : bool, default False
        Round each scale down to a power of two.
    amax_epsilon : float, default 0.0
        Floor of the amax a scale is computed from.
    random_hadamard_transform : bool, default False
        Apply a random Hadamard transform to the tensor before quantizing it (NVFP4).
    stochastic_rounding : bool, default False
        Round stochastically instead of to nearest (NVFP4 gradients).
    fp4_2d_quantization : bool, default False
        Scale in 16x16 tiles instead of 1x16 blocks (NVFP4 weights).
    """
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


# Fields that older NVIDIA Transformer Engine releases had and that clients still pass; they are
# accepted with a DeprecationWarning and have no effect (as in NVIDIA TE 2.x, which drops them).
_LEGACY_FIELDS = {
    "override_linear_precision": "high-precision overrides of single GEMMs were removed",
    "interval": "scales are updated after every step",
}


def _accepts_legacy_fields(cls):
    """Wraps a recipe dataclass's __init__ the way NVIDIA TE's recipes (dataclasses that ignore
    unknown fields) behave for clients, minus the silence: a keyword that is no field of the
    recipe is dropped with a DeprecationWarning naming it (legacy fields, above, and extras that
    clients pass along, such as Megatron-Core's params_dtype and device), unless it looks like a
    misspelling of a current field, which raises TypeError naming both."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        fields = [f for f in self.__dataclass_fields__ if not f.startswith("_")]
        for k in sorted(k for k in kwargs if k not in fields):
            close = difflib.get_close_matches(k, fields, n=1, cutoff=0.8)
            if close and k not in _LEGACY_FIELDS:
                raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument "
                                f"{k!r}; did you mean {close[0]!r}?")
            value = kwargs.pop(k)
            why = _LEGACY_FIELDS.get(k, "it is no field of this recipe")
            warnings.warn(f"{cls.__name__}: '{k}' is ignored ({why}); got {k}={value!r}",
                          DeprecationWarning, stacklevel=2)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


def _check_common(recipe, name: str) -> None:
    """Checks of the fields every recipe has: FP8 attention is not implemented, so only its off
    values are accepted; backward_override is one of the three values, and None under delayed
    scaling (its backward has no high-precision operands to fall back to: the amax history
    drives every cast)."""
    if not isinstance(recipe.fp8_format, Format):
        raise TypeError(f"{name}: fp8_format must be a recipe.Format, got {recipe.fp8_format!r}")
    for field in ("fp8_dpa", "fp8_mha"):
        if getattr(recipe, field):
            raise NotImplementedError(f"{name}: {field}=True (FP8 attention) is not implemented; "
                                      f"use {field}=False")
    _check_backward_override(recipe, name)


def _check_backward_override(recipe, name: str) -> None:
    """ValueError for a backward_override that is not None, 'high_precision' or 'dequantized',
    or that is not None under DelayedScaling."""
    if recipe.backward_override not in _BACKWARD_OVERRIDES:
        raise ValueError(f"{name}: backward_override={recipe.backward_override!r}; expected one of "
                         f"{_BACKWARD_OVERRIDES}")
    if recipe.backward_override is not None and isinstance(recipe, DelayedScaling):
        raise ValueError(f"{name}: backward_override={recipe.backward_override!r}; DelayedScaling "
                         "supports only None")


_AMAX_ALGOS = ("max", "most_recent")


@_accepts_legacy_fields
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
        FP8 attention (the attention's own GEMMs in FP8) is not implemented: only False is
        accepted; the attention's GEMMs run in the activation dtype.
    fp8_mha : bool, default False
        As ``fp8_dpa``: only False is accepted.
    backward_override : None, default None
        Only None: the backward GEMMs run in FP8 (delayed scaling casts every tensor with the
        scale of its amax history); any other value raises ValueError.
    """
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def __post_init__(self):
        _check_common(self, "DelayedScaling")
        if isinstance(self.amax_compute_algo, str) and self.amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(f"DelayedScaling: amax_compute_algo={self.amax_compute_algo!r}; "
                             f"expected 'max', 'most_recent' or a callable")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"DelayedScaling: amax_history_len={self.amax_history_len!r}; expected an int >= 1")
        if self.margin < 0:
            raise ValueError(f"DelayedScaling: margin={self.margin}; expected >= 0")

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, margin={self.margin}, "
                f"format={self.fp8_format.name}, amax_history_len={self.amax_history_len}, "
                f"amax_compute_algo={self.amax_compute_algo}, reduce_amax={self.reduce_amax}, "
                f"fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}")


@_accepts_legacy_fields
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
    fp8_gemm_fprop : MMParams, default MMParams(use_split_accumulator=False)
        Options of the forward GEMM. Only the default is implemented (anything else raises
        NotImplementedError).
    fp8_gemm_dgrad : MMParams, default MMParams(use_split_accumulator=True)
        Options of the input-gradient GEMM; only the default is implemented.
    fp8_gemm_wgrad : MMParams, default MMParams(use_split_accumulator=True)
        Options of the weight-gradient GEMM; only the default is implemented.
    fp8_dpa : bool, default False
        FP8 attention (the attention's own GEMMs in FP8) is not implemented: only False is
        accepted; the attention's GEMMs run in the activation dtype.
    fp8_mha : bool, default False
        As ``fp8_dpa``: only False is accepted.
    backward_override : {None, 'high_precision', 'dequantized'}, default from NVTE_BACKWARD_OVERRIDE
        How the backward GEMMs run: None in FP8, like the forward; ``'high_precision'`` in the
        activation dtype on the unquantized forward operands (input and weight);
        ``'dequantized'`` in the activation dtype on the forward's FP8 operands, dequantized
        (the output gradient is not quantized in either). Linear, LayerNormLinear, LayerNormMLP
        and GroupedLinear; any other value raises ValueError.
    """
    use_power_2_scales: bool = False
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=config.backward_override_default)

    def __post_init__(self):
        _check_common(self, "Float8CurrentScaling")
        want = {"fp8_gemm_fprop": False, "fp8_gemm_dgrad": True, "fp8_gemm_wgrad": True}
        for field, split in want.items():
            mm = getattr(self, field)
            if not isinstance(mm, MMParams) or mm.use_split_accumulator != split:
                raise NotImplementedError(
                    f"Float8CurrentScaling: {field}={mm!r} is not implemented; the modules run "
                    f"this GEMM with use_split_accumulator={split}")

    def __repr__(self) -> str:
        return (f"recipe_type={type(self).__name__}, format={self.fp8_format.name}, "
                f"use_power_2_scales={self.use_power_2_scales}")


class _UnsupportedRecipe(Recipe):
    """A recipe that no device of this library runs: constructible (so configuration code that
    builds it works), refused with a clear error wherever it would be used."""
    _needs = ""

    def __post_init__(self):
        _check_format_only(self)

    def unsupported_reason(self) -> str:
        """Why this recipe cannot run; the message of the errors it raises where it is used.

        Returns
        -------
        str
        """
        return (f"{type(self).__name__} needs {self._needs}; this implementation of Transformer "
                "Engine does not support it on any device. Use DelayedScaling or "
                "Float8CurrentScaling")


def _check_format_only(recipe) -> None:
    if not isinstance(recipe.fp8_format, Format):
        raise TypeError(f"{type(recipe).__name__}: fp8_format must be a recipe.Format, got "
                        f"{recipe.fp8_format!r}")
    if recipe.backward_override not in _BACKWARD_OVERRIDES:
        raise ValueError(f"{type(recipe).__name__}: backward_override={recipe.backward_override!r}; "
                         f"expected one of {_BACKWARD_OVERRIDES}")


@_accepts_legacy_fields
@dataclasses.dataclass()
class MXFP8BlockScaling(_UnsupportedRecipe):
    """MXFP8: E4M3/E5M2 data with one E8M0 (power-of-two) scale per 32 elements.

    Its GEMMs need NVIDIA Blackwell or AMD gfx950 and are not implemented in this library: the
    recipe can be built, and autocast, the quantizers and the availability queries refuse it
    with the reason (see :meth:`unsupported_reason`).

    Parameters
    ----------
    margin : int, default 0
        Headroom of the scales, as in :class:`DelayedScaling`; stored only.
    fp8_format : Format, default Format.E4M3
        The FP8 formats of the data (must be a :class:`Format`, else TypeError).
    fp8_dpa : bool, default False
        FP8 attention; stored only (the recipe does not run).
    fp8_mha : bool, default False
        FP8 for the whole multi-head attention block; stored only.
    backward_override : {None, 'high_precision', 'dequantized'}, default None
        How the backward GEMMs would run (None: quantized, like the forward;
        ``'high_precision'``: on the unquantized forward inputs; ``'dequantized'``: on the
        dequantized forward copies). Checked against these values (else ValueError) and stored.
    enable_2d_quantization : bool, default False
        Scale weights in 2-D blocks; stored only.
    """
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None
    enable_2d_quantization: bool = False
    _needs = "MXFP8 GEMMs (NVIDIA Blackwell or AMD gfx950)"


@_accepts_legacy_fields
@dataclasses.dataclass()
class Float8BlockScaling(Recipe):
    """Block-wise FP8 with scales from each block's own amax, computed at every cast.

    Activations and gradients are scaled in 1x128 blocks along the GEMM's reduction dimension,
    weights in 128x128 tiles; ``scale = fp8_max / amax`` per block, rounded down to a power of
    two unless ``use_f32_scales``. The GEMMs accumulate in full precision. Runs natively with
    cuBLASLt >= 12.9 on sm_90 (Hopper) and on the reference backend everywhere (dequantise, then
    an fp32 matmul); other GPUs raise NotImplementedError. Modules: Linear, LayerNormLinear,
    LayerNormMLP. Whether it runs on the current device:
    :func:`transformer_engine.pytorch.is_fp8_block_scaling_available`.

    Parameters
    ----------
    use_f32_scales : bool, optional
        Keep each block's scale as computed (FP32) instead of rounding it down to a power of two.
        ``None`` (default) reads ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES`` (``1``: FP32 scales) when
        the recipe is constructed.
    fp8_format : Format, default Format.E4M3
        The FP8 formats of the data: ``Format.E4M3`` or ``Format.HYBRID`` (E5M2 gradients);
        ``Format.E5M2`` raises ValueError.
    fp8_quant_fwd_inp : QParams, optional
        Quantization options of the forward input (NVIDIA TE's field); only the defaults
        (``amax_epsilon`` 0, no Hadamard transform) are accepted.
    fp8_quant_fwd_weight : QParams, optional
        The same for the weights.
    fp8_quant_bwd_grad : QParams, optional
        The same for the output gradients.
    x_block_scaling_dim : int, default 1
        Blocks of the activations: 1 for 1x128, 2 for 128x128.
    w_block_scaling_dim : int, default 2
        Blocks of the weights: 1 for 1x128, 2 for 128x128.
    grad_block_scaling_dim : int, default 1
        Blocks of the output gradients: 1 for 1x128, 2 for 128x128. Two 128x128 operands in one
        GEMM are refused.
    fp8_gemm_fprop : MMParams, default MMParams()
        Options of the forward GEMM.
    fp8_gemm_dgrad : MMParams, default MMParams()
        Options of the input-gradient GEMM.
    fp8_gemm_wgrad : MMParams, default MMParams()
        Options of the weight-gradient GEMM.
    fp8_dpa : bool, default False
        FP8 attention is not implemented: only False is accepted.
    fp8_mha : bool, default False
        As ``fp8_dpa``: only False is accepted.
    backward_override : {None, 'high_precision', 'dequantized'}, default from NVTE_BACKWARD_OVERRIDE
        As for :class:`Float8CurrentScaling`: None quantizes the backward GEMMs' operands in
        blocks like the forward's; the other two run the backward GEMMs in the activation dtype
        on the unquantized or on the dequantized forward operands.
    """
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
    backward_override: Optional[str] = dataclasses.field(default_factory=config.backward_override_default)

    def __post_init__(self):
        who = "Float8BlockScaling"
        _check_backward_override(self, who)
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


@_accepts_legacy_fields
@dataclasses.dataclass()
class NVFP4BlockScaling(_UnsupportedRecipe):
    """NVFP4: E2M1 data with an E4M3 scale per 16 elements and a per-tensor FP32 scale.

    Its GEMMs need NVIDIA Blackwell and are not implemented in this library: the recipe can be
    built (its fields are stored), and autocast, the quantizers and the availability queries
    refuse it with the reason (see :meth:`unsupported_reason`).

    Parameters
    ----------
    disable_rht : bool, default False
        Turn off the random Hadamard transform of the weight-gradient GEMM's inputs.
    disable_stochastic_rounding : bool, default False
        Round gradients to nearest instead of stochastically.
    disable_2d_quantization : bool, default False
        Scale weights in 1x16 blocks instead of 16x16 tiles.
    row_scaled_activation : bool, default False
        NVIDIA TE's option of scaling activations per row; stored only.
    nvfp4_4over6 : str, default 'none'
        Which tensors use "four over six" scaling (each block scaled to a maximum of 4 or of 6,
        whichever quantizes it with less error); stored only.
    nvfp4_4over6_e4m3_use_256 : str, default 'all'
        Option of that scaling; stored only.
    nvfp4_4over6_err_mode : str, default 'MAE'
        The error measure that chooses between the two scales; stored only.
    fp4_format : Format, default Format.E2M1
        The FP4 format of the data.
    fp8_format : Format, default Format.E4M3
        The format of the block scales (must be a :class:`Format`, else TypeError).
    fp8_dpa : bool, default False
        FP8 attention; stored only (the recipe does not run).
    fp8_mha : bool, default False
        FP8 for the whole multi-head attention block; stored only.
    backward_override : {None, 'high_precision', 'dequantized'}, default None
        How the backward GEMMs would run (None: quantized, like the forward;
        ``'high_precision'``: on the unquantized forward inputs; ``'dequantized'``: on the
        dequantized forward copies). Checked against these values (else ValueError) and stored.
    """
    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    row_scaled_activation: bool = False
    nvfp4_4over6: str = "none"
    nvfp4_4over6_e4m3_use_256: str = "all"
    nvfp4_4over6_err_mode: str = "MAE"
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None
    _needs = "FP4 GEMMs (NVIDIA Blackwell)"
