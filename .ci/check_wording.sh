#!/usr/bin/env bash
# The repository speaks only of the software: no text refers to how it was developed (numbered
# work periods, machines on loan, tracker numbers, the people or tools that did the work).
# Fails listing every line that does. The patterns are assembled from pieces so that this file
# does not match itself.
set -euo pipefail
cd "$(dirname "$0")/.."

s="ses""sion"; r="rou""nd"; l="le""nt"; b="borr""owed"; i="iss""ue"; h="hel""per"
c="coord""inator"; d="dev""ice to""ol"
PATTERN="${s}s?[ _-]?[0-9]+|\\b${r} ?#?[0-9]+\\b|\\b${l}\\b|\\b${b}\\b|\\b${i}s? ?#?[0-9]+|${h} ${s}|\\b${c}|${d}"

PATHS=(README.rst CHANGELOG.md csrc transformer_engine benchmarks tests examples .ci build_tools
       setup.py pyproject.toml CMakeLists.txt docs)
existing=()
for p in "${PATHS[@]}"; do [ -e "$p" ] && existing+=("$p"); done

if grep -rniIE --exclude-dir=__pycache__ --exclude-dir=.pytest_cache "$PATTERN" "${existing[@]}"; then
  echo "check_wording: the lines above refer to how the project was developed; say what the software does instead" >&2
  exit 1
fi
echo "check_wording: clean (${existing[*]})"
