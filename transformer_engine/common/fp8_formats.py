"""FP8 formats per device: which encoding (OCP or FNUZ) a device uses, its largest values and
the matching framework dtypes. Recipes and modules ask here instead of hard-coding 448.

OCP (NVIDIA sm_89+, AMD gfx950): E4M3 max 448, E5M2 max 57344.
FNUZ (AMD gfx942, MI300): no negative zero, exponent bias one larger; E4M3 max 240, E5M2 57344.
"""
from __future__ import annotations

import dataclasses
import re

OCP = "ocp"
FNUZ = "fnuz"

E4M3 = "e4m3"
E5M2 = "e5m2"

_MAX = {
    (OCP, E4M3): 448.0,
    (OCP, E5M2): 57344.0,
    (FNUZ, E4M3): 240.0,
    (FNUZ, E5M2): 57344.0,
}

_DTYPE_NAMES = {
    (OCP, E4M3): "float8_e4m3fn",
    (OCP, E5M2): "float8_e5m2",
    (FNUZ, E4M3): "float8_e4m3fnuz",
    (FNUZ, E5M2): "float8_e5m2fnuz",
}


@dataclasses.dataclass(frozen=True)
class ArchFP8:
    """What an arch offers: the FP8 encoding its kernels use (None: no FP8 at all) and whether
    its matrix units multiply FP8."""
    flavor: str | None
    fp8_gemm: bool
    reason: str


def fp8_for_arch(arch: str) -> ArchFP8:
    """Maps an arch name ('sm_90', 'gfx942', 'gfx942:sramecc+:xnack-', 'cpu') to its FP8 support."""
    arch = (arch or "").split(":")[0].strip().lower()
    m = re.fullmatch(r"sm_(\d+)([a-z]?)", arch)
    if m:
        cc = int(m.group(1))
        if cc >= 89:
            return ArchFP8(OCP, True, f"{arch} has FP8 tensor cores (OCP E4M3/E5M2)")
        return ArchFP8(OCP, False, f"{arch} has no FP8 tensor cores (needs sm_89+); "
                                   "FP8 casts run, FP8 GEMMs do not")
    if arch in ("gfx940", "gfx941", "gfx942"):
        return ArchFP8(FNUZ, True, f"{arch} (MI300) uses the FNUZ FP8 encodings (E4M3 max 240)")
    if arch == "gfx950":
        return ArchFP8(OCP, True, f"{arch} (MI350) uses the OCP FP8 encodings (E4M3 max 448)")
    if re.fullmatch(r"gfx12\d\d", arch):
        return ArchFP8(OCP, True, f"{arch} (RDNA4) uses the OCP FP8 encodings")
    if arch.startswith("gfx"):
        return ArchFP8(None, False, f"{arch} has no FP8 support (FP8 needs gfx942 or gfx950)")
    if arch in ("", "cpu", "reference"):
        return ArchFP8(OCP, False, "reference backend: FP8 emulated in the framework (OCP)")
    return ArchFP8(None, False, f"unknown arch {arch!r}")


def fp8_max(fmt: str, flavor: str = OCP) -> float:
    """Largest finite value of an FP8 format ('e4m3' | 'e5m2') in a flavour ('ocp' | 'fnuz')."""
    try:
        return _MAX[(flavor, fmt)]
    except KeyError:
        raise ValueError(f"fp8_max: unknown format/flavour {fmt!r}/{flavor!r}; "
                         f"expected e4m3|e5m2 and ocp|fnuz") from None


def fp8_dtype_name(fmt: str, flavor: str = OCP) -> str:
    """Name of the framework dtype (same in torch and jnp) for a format in a flavour."""
    try:
        return _DTYPE_NAMES[(flavor, fmt)]
    except KeyError:
        raise ValueError(f"fp8_dtype_name: unknown format/flavour {fmt!r}/{flavor!r}") from None


def format_of_dtype_name(name: str) -> tuple:
    """Inverse of fp8_dtype_name: 'float8_e4m3fnuz' -> ('e4m3', 'fnuz')."""
    for (flavor, fmt), n in _DTYPE_NAMES.items():
        if n == name:
            return fmt, flavor
    raise ValueError(f"{name!r} is not an FP8 dtype; expected one of {sorted(_DTYPE_NAMES.values())}")
