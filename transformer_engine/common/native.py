"""Loads the native module once and remembers why it could not be loaded."""
from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=None)
def _load():
    try:
        return importlib.import_module("transformer_engine._native"), ""
    except ImportError as exc:
        return None, f"native module not importable ({exc}); pip install built the reference backend only"


def native_module():
    """The pybind11 module, or None when this install is pure Python."""
    return _load()[0]


def native_unavailable_reason() -> str:
    return _load()[1]


def build_backend() -> str | None:
    """'cuda' or 'rocm' for a native build, None for the reference-only install."""
    mod = native_module()
    return mod.build_backend() if mod is not None else None
