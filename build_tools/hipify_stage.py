"""The hipify stage: csrc/common translated to HIP inside the build tree, never the source tree.

PyTorch's torch.utils.hipify is loaded from the installed torch as plain files (torch itself is
not imported). Each run translates a fresh mirror, then copies into the stable output folder only
the files whose content changed, so unchanged outputs keep their timestamps and rebuilds stay
incremental. sources.txt lists the translation units for CMake.
"""
from __future__ import annotations

import filecmp
import importlib.util
import warnings
import io
import contextlib
import os
import shutil
import sys
import tempfile

SOURCE_EXTS = (".cu", ".cpp")


def _load_hipify():
    from .backend import find_package_dir  # the user's torch also under pip's build isolation
    torch_dir = find_package_dir("torch")
    if torch_dir is None:
        raise RuntimeError("the ROCm build needs PyTorch's hipify: pip install torch "
                           "(any build; it is only read, not imported)")
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*hipify.*")
    pkg_dir = os.path.join(torch_dir, "utils", "hipify")
    name = "_te_torch_hipify"
    if name + ".hipify_python" in sys.modules:
        return sys.modules[name + ".hipify_python"]
    pkg_spec = importlib.util.spec_from_file_location(
        name, os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
    pkg = importlib.util.module_from_spec(pkg_spec)
    sys.modules[name] = pkg
    # Only the submodules are needed; the package's __init__ imports hipify_python itself.
    for sub in ("constants", "cuda_to_hip_mappings", "hipify_python"):
        sub_spec = importlib.util.spec_from_file_location(f"{name}.{sub}",
                                                          os.path.join(pkg_dir, f"{sub}.py"))
        mod = importlib.util.module_from_spec(sub_spec)
        sys.modules[f"{name}.{sub}"] = mod
        sub_spec.loader.exec_module(mod)
    return sys.modules[name + ".hipify_python"]


def _sync_tree(src: str, dst: str) -> int:
    """Copies changed files from src to dst, deletes files dst has and src lacks."""
    changed = 0
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            s, d = os.path.join(root, f), os.path.join(dst, rel, f)
            if not os.path.exists(d) or not filecmp.cmp(s, d, shallow=False):
                shutil.copy2(s, d)
                changed += 1
    for root, _, files in os.walk(dst):
        rel = os.path.relpath(root, dst)
        for f in files:
            if not os.path.exists(os.path.join(src, rel, f)):
                os.remove(os.path.join(root, f))
    return changed


def hipify_tree(common_dir: str, out_dir: str, verbose: bool = False) -> list:
    """Translates common_dir into out_dir; returns the translation units relative to out_dir."""
    hipify_python = _load_hipify()
    with tempfile.TemporaryDirectory(prefix="te_hipify_") as tmp:
        work = os.path.join(tmp, "common")
        shutil.copytree(common_dir, work)
        hipify_python.HIPIFY_FINAL_RESULT.clear()
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            hipify_python.hipify(project_directory=work, output_directory=work,
                                 includes=[os.path.join(work, "*")],
                                 header_include_dirs=[work, os.path.join(work, "include")],
                                 is_pytorch_extension=True,
                                 hip_clang_launch=True, show_progress=False)
        if verbose:
            print(sink.getvalue())
        sources = []
        for root, _, files in os.walk(common_dir):
            for f in sorted(files):
                if not f.endswith(SOURCE_EXTS):
                    continue
                rel = os.path.relpath(os.path.join(root, f), common_dir)
                result = hipify_python.HIPIFY_FINAL_RESULT.get(os.path.join(work, rel))
                hip_path = result.hipified_path if result and result.hipified_path else None
                out_rel = os.path.relpath(hip_path, work) if hip_path else rel
                sources.append(out_rel)
        # Keep only what the compile needs: translated units, and for files hipify renamed the
        # renamed copy (the untouched CUDA original must not be compiled or included by mistake).
        renamed = {os.path.join(work, rel) for rel in _renamed_originals(hipify_python, work)}
        for path in renamed:
            os.remove(path)
        with open(os.path.join(work, "sources.txt"), "w") as fh:
            fh.write("\n".join(sorted(sources)) + "\n")
        changed = _sync_tree(work, out_dir)
    print(f"hipify stage: {len(sources)} translation units in {out_dir} ({changed} files updated)")
    return sorted(sources)


def _renamed_originals(hipify_python, work: str) -> list:
    out = []
    for src, result in hipify_python.HIPIFY_FINAL_RESULT.items():
        hip = getattr(result, "hipified_path", None)
        if hip and os.path.abspath(hip) != os.path.abspath(src) and os.path.exists(src):
            out.append(os.path.relpath(src, work))
    return out


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="hipify csrc/common into a build directory")
    ap.add_argument("common_dir")
    ap.add_argument("out_dir")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    hipify_tree(os.path.abspath(args.common_dir), os.path.abspath(args.out_dir), args.verbose)


if __name__ == "__main__":
    main()
