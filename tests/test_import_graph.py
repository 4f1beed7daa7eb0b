"""The package's import graph: no cycles between its modules, counting imports inside functions
too (a cycle hidden in a function is still a cycle: it makes the result depend on which module was
imported first), and every module imports on its own, first, in a fresh interpreter state."""
import ast
import importlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "transformer_engine")


def _modules() -> dict:
    """{dotted name: path} of every module of the package (package __init__ files included)."""
    found = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return found


def _is_package(path: str) -> bool:
    return path.endswith("__init__.py")


def _imports(name: str, path: str, modules: dict) -> set:
    """The package's modules that `name` imports, anywhere in its body."""
    tree = ast.parse(open(path).read())
    base = name if _is_package(path) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                src = ".".join(parts[: len(parts) - node.level + 1])
                src = f"{src}.{node.module}" if node.module else src
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in modules:
                    out.add(sub)
                elif src in modules:
                    out.add(src)
    out.discard(name)
    return out


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return comps


def test_no_import_cycles_between_modules():
    modules = _modules()
    # a package's __init__ re-exports its submodules by design; a cycle through an __init__ is
    # the ordinary "package imports its parts" pattern, so only module-to-module edges count
    leaves = {n: p for n, p in modules.items() if not _is_package(p)}
    graph = {n: {m for m in _imports(n, p, modules) if m in leaves} for n, p in leaves.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _importable(name: str) -> bool:
    top = name.split(".")[1] if name.count(".") else ""
    needs = {"pytorch": "torch", "jax": "jax"}.get(top)
    return needs is None or importlib.util.find_spec(needs) is not None


def test_every_module_imports_first_on_its_own():
    names = sorted(n for n in _modules() if _importable(n) and not n.endswith("__main__"))
    # one interpreter, the package's modules dropped from sys.modules before each import, so
    # each module is the first of the package to load (torch and jax stay loaded: they are slow)
    script = (
        "import sys, traceback\n"
        "import importlib\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    for k in [k for k in sys.modules if k == 'transformer_engine' or k.startswith('transformer_engine.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{n}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, f"modules that fail to import first:\n{r.stdout}\n{r.stderr[-3000:]}"


# Where raw device addresses may be taken: the kernels layer, the bridge that describes tensors
# to the bindings, and the recipe state's scaling pointers (read by the native scaling update).
ADDRESS_HOMES = ("transformer_engine/pytorch/kernels/", "transformer_engine/pytorch/native.py",
                 "transformer_engine/pytorch/quantization.py")


def test_no_addresses_outside_the_kernels_layer():
    """Modules, the ops' choosers and everything else above the kernels layer handle tensors,
    never their addresses (data_ptr) or the native module's calls (nc.mod)."""
    bad = []
    for name, path in _modules().items():
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(ADDRESS_HOMES):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr == "data_ptr":
                bad.append(f"{rel}:{node.lineno}: data_ptr")
            if (isinstance(node, ast.Attribute) and node.attr == "mod"
                    and isinstance(node.value, ast.Name) and node.value.id == "nc"):
                bad.append(f"{rel}:{node.lineno}: nc.mod")
    assert not bad, "addresses taken outside the kernels layer:\n" + "\n".join(bad)
