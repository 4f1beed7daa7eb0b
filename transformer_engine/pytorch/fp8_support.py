"""Whether this machine runs FP8 (and which block-scaled recipes): NVIDIA TE's check_*_support
and is_*_available queries, answered from the capability query."""
from __future__ import annotations

from typing import Tuple

import torch

from . import native


def _fp8_support(device=None) -> Tuple[bool, str]:
    """(True, "") when FP8 GEMMs run natively on the device (default: the current GPU), else
    (False, why). CPU tensors always run FP8 emulated on the reference backend."""
    if device is not None and torch.device(device).type == "cpu":
        return True, "reference backend: FP8 emulated in plain torch"
    if not torch.cuda.is_available():
        return False, "no GPU visible to torch (FP8 runs emulated on CPU tensors only)"
    cap = native.capability(device)
    name = cap.device or cap.arch or "this GPU"
    if cap.backend == "reference":
        return False, f"{name}: {cap.reason}"
    if not cap.has_fp8 or not cap.fp8_gemm:
        return False, f"{name} ({cap.arch}) lacks FP8 GEMM support: {cap.reason}"
    return True, ""


def _block_scaled_support(recipe_name: str) -> Tuple[bool, str]:
    """The MXFP8 and NVFP4 recipes run on no device here."""
    from ..common import recipe as recipes
    return False, getattr(recipes, recipe_name)().unsupported_reason()


def check_fp8_support() -> Tuple[bool, str]:
    """(whether the current GPU runs FP8 GEMMs natively, why not)."""
    return _fp8_support()


def check_mxfp8_support() -> Tuple[bool, str]:
    return _block_scaled_support("MXFP8BlockScaling")


def check_nvfp4_support() -> Tuple[bool, str]:
    return _block_scaled_support("NVFP4BlockScaling")


def check_fp8_block_scaling_support() -> Tuple[bool, str]:
    """Float8BlockScaling runs natively on sm_90 (its GEMM needs cuBLASLt >= 12.9, checked at the
    call); Linear, LayerNormLinear and LayerNormMLP also run it emulated on CPU tensors."""
    ok, why = _fp8_support()
    if not ok:
        return False, why
    cap = native.capability()
    if cap.backend != "cuda" or cap.arch != "sm_90":
        return False, (f"Float8BlockScaling needs cuBLASLt >= 12.9 on sm_90 (Hopper); this GPU is "
                       f"{cap.device or cap.arch} ({cap.arch})")
    return True, ""


def _answer(result: Tuple[bool, str], return_reason: bool):
    return result if return_reason else result[0]


def is_fp8_available(return_reason: bool = False, device=None):
    """Whether FP8 runs on a device.

    A GPU answers True when its FP8 GEMMs run natively (NVIDIA sm_89 and newer, AMD gfx942 and
    gfx950); a CPU device always answers True, FP8 being emulated there by the plain-torch
    reference backend.

    Parameters
    ----------
    return_reason : bool, default False
        Also return why FP8 is not available (an empty string when it is).
    device : torch.device or str, optional
        The device to ask about. Default: the current GPU (False when torch sees none).

    Returns
    -------
    bool or tuple of (bool, str)
        The answer, or ``(answer, reason)`` with ``return_reason=True``.
    """
    if not isinstance(return_reason, bool):
        raise TypeError(f"is_fp8_available: return_reason must be a bool, got {return_reason!r} "
                        "(pass the device as device=...)")
    return _answer(_fp8_support(device), return_reason)


def is_mxfp8_available(return_reason: bool = False):
    """Whether the MXFP8 recipe (:class:`~transformer_engine.common.recipe.MXFP8BlockScaling`) runs on the current device.

    Parameters
    ----------
    return_reason : bool, default False
        Also return why it is not available (an empty string when it is).

    Returns
    -------
    bool or tuple of (bool, str)
        The answer, or ``(answer, reason)`` with ``return_reason=True``.
    """
    return _answer(check_mxfp8_support(), return_reason)


def is_nvfp4_available(return_reason: bool = False):
    """Whether the NVFP4 recipe (:class:`~transformer_engine.common.recipe.NVFP4BlockScaling`) runs on the current device.

    Parameters
    ----------
    return_reason : bool, default False
        Also return why it is not available (an empty string when it is).

    Returns
    -------
    bool or tuple of (bool, str)
        The answer, or ``(answer, reason)`` with ``return_reason=True``.
    """
    return _answer(check_nvfp4_support(), return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False):
    """Whether the :class:`~transformer_engine.common.recipe.Float8BlockScaling` recipe runs on the current device.

    Parameters
    ----------
    return_reason : bool, default False
        Also return why it is not available (an empty string when it is).

    Returns
    -------
    bool or tuple of (bool, str)
        The answer, or ``(answer, reason)`` with ``return_reason=True``.
    """
    return _answer(check_fp8_block_scaling_support(), return_reason)


_SUPPORT_CACHE: dict = {}


def require_fp8_support(device: torch.device, who: str) -> None:
    """Raises a clear error when FP8 is asked for on a GPU that cannot run it."""
    if device.type != "cuda":
        return
    key = device.index
    ok = _SUPPORT_CACHE.get(key)
    if ok is None:
        ok = _SUPPORT_CACHE[key] = _fp8_support(device)
    if not ok[0]:
        raise NotImplementedError(f"{who}: FP8 autocast is enabled but {ok[1]}")
