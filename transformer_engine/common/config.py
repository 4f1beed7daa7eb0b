"""Every environment variable the library reads at run time, read here and at call time (never
at import), so changing one between calls takes effect. README.rst lists them all."""
from __future__ import annotations

import os


def _flag(name: str, default: bool | None) -> bool | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected 0 or 1")


def use_hipblaslt(build_default: bool) -> tuple:
    """ROCm GEMM library: (True for hipBLASLt / False for rocBLAS, why). The variable's value
    counts, not its presence: NVTE_USE_HIPBLASLT=0 selects rocBLAS."""
    chosen = _flag("NVTE_USE_HIPBLASLT", None)
    if chosen is None:
        return build_default, "NVTE_USE_HIPBLASLT unset: build-time default"
    return chosen, f"NVTE_USE_HIPBLASLT={os.environ['NVTE_USE_HIPBLASLT']}"
