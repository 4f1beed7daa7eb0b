"""Sphinx configuration of the Transformer Engine API reference.

Build from the repository root: ``sphinx-build -W -b html docs /tmp/te-docs``. The pages are
generated from the docstrings (numpydoc style, rendered by napoleon), importing the package
from this source tree; no GPU is needed.
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

project = "Transformer Engine"
author = "Transformer Engine contributors"
copyright = "Transformer Engine contributors"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": False}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
# torch.nn.Module and flax.linen.Module methods are inherited by every module: show only ours
autodoc_inherit_docstrings = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "Transformer Engine API"
