"""pip install . / pip install -e . : the Python package plus, unless the backend is none, the
native library and its pybind11 module built by build_tools (CMake + ninja)."""
import os
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

# PEP 517 hooks do not put the source tree on sys.path; build_tools lives there.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from build_tools.backend import plan_build  # noqa: E402
from build_tools.native_build import build as build_native  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuildExt(build_ext):
    def build_extension(self, ext):
        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_native(os.path.join(ROOT, "build", "native"), out_dir, plan=PLAN)


PLAN = plan_build()
print(PLAN.describe())
ext_modules = [] if PLAN.backend == "none" else [Extension("transformer_engine._native", sources=[])]

setup(
    packages=find_packages(include=["transformer_engine", "transformer_engine.*"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": CMakeBuildExt},
)
