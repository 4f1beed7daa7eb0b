"""Puts this suite's folder on sys.path so its test files import their helpers (utils.py and
friends) by plain name; pytest runs in importlib mode (pyproject.toml), which adds no paths."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    from utils import use_device_fp8_flavour  # after the path above is set
    use_device_fp8_flavour(items)
