"""Shared by every suite: makes tests/ importable (tolerances.py) and offers the device list."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pytest's importlib mode names test modules after their path (tests.pytorch.test_x); processes
# spawned by a test unpickle their functions by that name, so the repository root must be
# importable. Appended, not prepended: an installed transformer_engine still wins over the
# source tree (the GPU run tests the pip-installed package).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
