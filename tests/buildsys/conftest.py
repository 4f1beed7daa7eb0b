"""tests/buildsys: checks of the build machinery that run on any machine (no GPU, no sysroot).
build_tools lives at the repository root, which pytest does not put on sys.path by itself."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
