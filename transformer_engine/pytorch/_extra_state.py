"""NVIDIA TE 2.x's home of the checkpoint extra-state helpers, kept for code that imports the
environment variable's name from it (NVIDIA TE's own numerics tests save and restore it around a
load_state_dict).

In NVIDIA TE the variable allows unpickling a module's pickled FP8 extra state. This library
saves extra state as a dict of tensors (module/base.py, get_extra_state), which loads without
unpickling anything, so it never reads the variable."""
from __future__ import annotations

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

__all__ = ["UNSAFE_PICKLE_EXTRA_STATE_ENV"]
