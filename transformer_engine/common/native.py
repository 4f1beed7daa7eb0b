"""Loads the native module once and remembers why it could not be loaded."""
from __future__ import annotations

import ctypes
import functools
import importlib
import os


@functools.lru_cache(maxsize=None)
def _load():
    try:
        return importlib.import_module("transformer_engine._native"), ""
    except ImportError as exc:
        return None, _why_not_native(exc)


def build_summary() -> dict | None:
    """What the install recorded about its build (backend, reason, archs, warnings: written by
    setup.py as build_info.json), or None when running from a source tree."""
    import json
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build_info.json")
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _why_not_native(exc: ImportError) -> str:
    summary = build_summary()
    if summary is not None and summary.get("backend") == "none":
        return f"this install has no native backend ({summary.get('reason', 'no reason recorded')})"
    if summary is None and getattr(exc, "name", None) == "transformer_engine._native":
        return "no native module (a source tree without a native build)"
    return f"the native module failed to import: {exc}"


def native_module():
    """The pybind11 module, or None when this install is pure Python."""
    return _load()[0]


def native_unavailable_reason() -> str:
    return _load()[1]


def build_backend() -> str | None:
    """'cuda' or 'rocm' for a native build, None for the reference-only install."""
    mod = native_module()
    return mod.build_backend() if mod is not None else None


@functools.lru_cache(maxsize=None)
def emulation() -> str | None:
    """For the emulated AMD build (the hipified kernels on the HIP-on-CPU runtime of
    tests/hipcpu), what it emulates, e.g. 'emulated on CPU, wave64, gfx942 FNUZ'; None for every
    other build. CPU tensors stand in for device memory there."""
    mod = native_module()
    if mod is None or build_backend() != "rocm":
        return None
    lib = os.path.join(os.path.dirname(mod.__file__), "libtransformer_engine.so")
    try:
        query = ctypes.CDLL(lib).nvte_hipcpu_emulation
    except (OSError, AttributeError):
        return None
    query.restype = ctypes.c_char_p
    return query().decode()
