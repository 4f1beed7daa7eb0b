"""The two rewrites that turn a hipified source into one a host C++ compiler accepts.

Only what the language itself cannot express is rewritten; everything else (qualifiers, index
variables, shuffles, types) is supplied by the HIP-on-CPU runtime's headers:
  kernel<<<grid, block, smem, stream>>>(args)  ->  kernel * ::hipcpu::LaunchConfig(grid, block, smem, stream)(args)
  extern __shared__ [__align__(n)] T name[];   ->  T* name = (T*)::hipcpu::dynamic_shared();
  __shared__ alignas(n)                        ->  alignas(n) __shared__
"""
from __future__ import annotations

import re

_LAUNCH = re.compile(r"<<<(.*?)>>>", re.S)
_SHARED_ALIGNAS = re.compile(r"__shared__\s+(alignas\s*\(\s*\d+\s*\))")
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([\w:<>, ]+?)\s+(\w+)\s*\[\s*\]\s*;")


def rewrite(text: str) -> str:
    # `__shared__ alignas(16) T x`: the runtime's __shared__ is `static`, which alignas must precede
    text = _SHARED_ALIGNAS.sub(r"\1 __shared__", text)
    text = _LAUNCH.sub(lambda m: f" * ::hipcpu::LaunchConfig({m.group(1)})", text)
    return _EXTERN_SHARED.sub(
        lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>"
                  f"(::hipcpu::dynamic_shared());", text)
