"""Shared by every suite: makes tests/ importable (tolerances.py) and offers the device list."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
