"""pip install . / pip wheel . : the Python package plus, unless the backend is none, the
native library and its pybind11 module built by build_tools (CMake + ninja).

The backend is chosen by build_tools.backend (NVTE_BACKEND, else detected from a working
toolchain); the choice, its reason and any warning are printed and written into the package as
transformer_engine/build_info.json, which `python -m transformer_engine info` shows."""
import json
import os
import sys
import warnings

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# PEP 517 hooks do not put the source tree on sys.path; build_tools lives there.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from build_tools.backend import plan_build  # noqa: E402
from build_tools.native_build import OUTPUT_GLOBS, build as build_native  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_INFO = "build_info.json"


class CMakeBuildExt(build_ext):
    def build_extension(self, ext):
        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        # one directory, emptied by build_native when it was configured for another toolchain
        # or environment (see build_tools/native_build.py)
        build_native(os.path.join(ROOT, "build", "native"), out_dir, plan=PLAN)


class BuildPyWithSummary(build_py):
    """Writes build_info.json into the package, and drops native files an earlier build left in
    setuptools' build folder when this one builds none (they would end up in the wheel)."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "transformer_engine")
        os.makedirs(pkg, exist_ok=True)
        if PLAN.backend == "none":
            import glob
            for pattern in OUTPUT_GLOBS:
                for stale in glob.glob(os.path.join(pkg, pattern)):
                    os.remove(stale)
        with open(os.path.join(pkg, BUILD_INFO), "w") as fh:
            json.dump(PLAN.summary(), fh, indent=1)


PLAN = plan_build()
print(PLAN.describe())


class TransformerEngineBuildWarning(UserWarning):
    """The toolchain found could not be used (pip shows a build backend's Python warnings)."""


for warning in PLAN.warnings:
    warnings.warn(f"transformer_engine: {warning}", TransformerEngineBuildWarning, stacklevel=1)
ext_modules = [] if PLAN.backend == "none" else [Extension("transformer_engine._native", sources=[])]

setup(
    packages=find_packages(include=["transformer_engine", "transformer_engine.*"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": CMakeBuildExt, "build_py": BuildPyWithSummary},
)
