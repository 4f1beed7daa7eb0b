#!/usr/bin/env bash
# The API reference: Sphinx builds docs/ from the docstrings with warnings as errors, and every
# public argument must be documented (tests/test_docstrings.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${TE_DOCS_OUT:-/tmp/te-docs}
rm -rf "$OUT"
python -m sphinx -W --keep-going -q -b html docs "$OUT"
echo "docs: built $OUT/index.html"
