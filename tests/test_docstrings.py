"""Every public class and function of the documented packages explains each of its arguments.

The public API is what the packages export at their top level (no submodules, no names with a
leading underscore). For a class, the class docstring documents the constructor's arguments and
each public method (plus forward / __call__) documents its own. Docstrings use the numpydoc
style that Sphinx's napoleon extension renders: a "Parameters" section with one
"name : type" entry per argument.
"""
import enum
import importlib
import inspect
import re
import types

import pytest

PACKAGES = ("transformer_engine.pytorch", "transformer_engine.pytorch.ops", "transformer_engine.jax",
            "transformer_engine.jax.flax", "transformer_engine.common.recipe")
# constructor arguments every Flax module has, documented by Flax itself
FLAX_MODULE_FIELDS = {"parent", "name"}
SECTION = re.compile(r"^(\S.*)\n-{3,}\s*$", re.M)
ENTRY = re.compile(r"^(\S[^:]*?)\s*(?::.*)?$")


def _ours(obj) -> bool:
    return getattr(obj, "__module__", "").startswith("transformer_engine")


def documented_parameters(doc: str) -> set:
    """Names listed in the docstring's Parameters (and Other Parameters) sections."""
    names = set()
    headers = list(SECTION.finditer(doc))
    for i, h in enumerate(headers):
        if h.group(1).strip() not in ("Parameters", "Other Parameters", "Keyword Arguments"):
            continue
        end = headers[i + 1].start() if i + 1 < len(headers) else len(doc)
        for line in doc[h.end():end].splitlines():
            m = ENTRY.match(line)
            if m:
                for name in m.group(1).split(","):
                    names.add(name.strip().replace("\\", "").lstrip("*"))
    return names


def _arguments(fn, skip=()):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_") and p.name not in skip]


def _methods(cls, checked: set):
    """(qualified name, function) of the public methods the package defines on cls and on its
    base classes from the package; a method inherited by several classes is checked once, under
    the class that defines it."""
    seen = set()
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") and name != "__call__":
                continue
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            if isinstance(attr, property) or not inspect.isfunction(fn) or name in seen:
                continue
            if not fn.__qualname__.startswith(klass.__qualname__ + "."):
                continue  # a default value (e.g. a Flax initializer), not a method
            seen.add(name)
            if fn not in checked:
                checked.add(fn)
                yield f"{klass.__name__}.{name}", fn


def public_callables():
    """(dotted name, object, argument names that must be documented) for the public API."""
    out, seen = [], set()
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or isinstance(obj, types.ModuleType) or not callable(obj):
                continue
            if not _ours(obj):
                continue
            qual = f"{pkg}.{name}"
            if inspect.isclass(obj):
                if issubclass(obj, enum.Enum):
                    out.append((qual, obj, []))
                    continue
                out.append((qual, obj, _arguments(obj, FLAX_MODULE_FIELDS)))
                for mname, fn in _methods(obj, seen):
                    out.append((f"{pkg}.{mname}", fn, _arguments(fn)))
            else:
                out.append((qual, obj, _arguments(obj)))
    return out


API = public_callables()


def test_the_walk_finds_the_api():
    names = {q for q, _, _ in API}
    for expected in ("transformer_engine.pytorch.Linear", "transformer_engine.pytorch.Linear.forward",
                     "transformer_engine.jax.flax.DenseGeneral.__call__",
                     "transformer_engine.common.recipe.DelayedScaling",
                     "transformer_engine.jax.fp8_autocast"):
        assert expected in names
    assert len(API) > 60


def test_parser_reads_numpydoc_entries():
    doc = "Summary.\n\nParameters\n----------\na, b : int\n    Two.\n*args : tuple\n    More.\n" \
          "\\*\\*kwargs : dict\n    Rest.\n\nReturns\n-------\nout : int\n    Not a parameter.\n"
    assert documented_parameters(doc) == {"a", "b", "args", "kwargs"}


@pytest.mark.parametrize("qual,obj,args", API, ids=[q for q, _, _ in API])
def test_every_argument_is_documented(qual, obj, args):
    doc = inspect.getdoc(obj) if not inspect.isclass(obj) else inspect.cleandoc(obj.__doc__ or "")
    assert doc and len(doc.strip()) > 20, f"{qual} has no docstring"
    missing = [a for a in args if a not in documented_parameters(doc)]
    assert not missing, f"{qual}: arguments without a 'name : type' entry under Parameters: {missing}"


API_PAGES = {"transformer_engine.pytorch": "pytorch.rst", "transformer_engine.pytorch.ops": "ops.rst",
             "transformer_engine.jax": "jax.rst",
             "transformer_engine.jax.flax": "flax.rst",
             "transformer_engine.common.recipe": "recipe.rst"}


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_public_name_has_an_api_page_entry(pkg):
    """docs/api lists each public class and function of the package (one autodoc directive
    each), so that a new export cannot be left out of the Sphinx site."""
    import os
    page = os.path.join(os.path.dirname(__file__), "..", "docs", "api", API_PAGES[pkg])
    text = open(page).read()
    mod = importlib.import_module(pkg)
    missing = [name for name, obj in vars(mod).items()
               if not name.startswith("_") and not isinstance(obj, types.ModuleType)
               and (_ours(obj) if callable(obj) else isinstance(obj, (str, int, float)))
               and not re.search(rf"^\.\. (autoclass|autofunction|data):: {name}$", text, re.M)]
    assert not missing, f"docs/api/{API_PAGES[pkg]} lacks {missing}"
