"""python -m transformer_engine info: what was built, what device is here, and why."""
from __future__ import annotations

import importlib.util
import sys


def _framework_versions() -> list:
    out = []
    for mod, label in (("torch", "pytorch"), ("jax", "jax")):
        if importlib.util.find_spec(mod) is None:
            out.append(f"{label}: not installed")
            continue
        try:
            m = __import__(mod)
            out.append(f"{label}: {m.__version__}")
        except Exception as exc:  # a broken install is worth reporting, not crashing on
            out.append(f"{label}: import failed ({exc})")
    return out


def info() -> str:
    import transformer_engine
    from transformer_engine.common import capabilities
    from transformer_engine.common.native import native_module, native_unavailable_reason

    lines = [f"transformer_engine {transformer_engine.__version__}"]
    mod = native_module()
    if mod is None:
        lines.append(f"build backend: none (reference only): {native_unavailable_reason()}")
    else:
        lines.append(f"build backend: {mod.build_backend()}  archs: {mod.build_archs()}")
    lib, why = capabilities.gemm_library()
    lines.append(f"GEMM library: {lib} ({why})")
    cap = capabilities.native_device_capability()
    if cap.backend == "reference":
        lines.append(f"device: none -> reference backend ({cap.reason})")
    else:
        lines.append(f"device: {cap.device} ({cap.arch}) -> {cap.backend} backend")
    flavor = cap.fp8_flavor.upper() if cap.fp8_flavor else "none"
    lines.append(f"FP8: flavour {flavor}, FP8 GEMM {'yes' if cap.fp8_gemm else 'no'} ({cap.reason})")
    lines.extend(_framework_versions())
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in ("info",):
        print("usage: python -m transformer_engine info", file=sys.stderr)
        return 2
    print(info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
