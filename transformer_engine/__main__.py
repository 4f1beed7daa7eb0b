"""python -m transformer_engine info (or te-info): what was built, what device is here, and why.
One line per fact."""
from __future__ import annotations

import argparse
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


def _build_lines(summary) -> list:
    if summary is None:
        return ["build: no build summary (running from a source tree, not from pip install)"]
    lines = [f"build: backend {summary.get('backend')} ({summary.get('reason')})"]
    if summary.get("archs"):
        lines.append(f"build archs: {summary['archs']}")
    lines += [f"build warning: {w}" for w in summary.get("warnings", [])]
    return lines


def info() -> str:
    import transformer_engine
    from transformer_engine.common import capabilities
    from transformer_engine.common.native import (build_summary, emulation, native_module,
                                                  native_unavailable_reason)

    lines = [f"transformer_engine {transformer_engine.__version__}"]
    lines += _build_lines(build_summary())
    mod = native_module()
    if mod is None:
        lines.append(f"native module: none, every op runs on the reference backend "
                     f"({native_unavailable_reason()})")
    else:
        emulated = f" ({emulation()})" if emulation() else ""
        lines.append(f"native module: {mod.build_backend()} backend{emulated}, archs {mod.build_archs()}")
    lib, why = capabilities.gemm_library()
    lines.append(f"GEMM library: {lib} ({why})")
    cap = capabilities.native_device_capability()
    if mod is None:
        lines.append("device: not queried (no native module)")
    elif cap.backend == "reference":
        lines.append(f"device: none ({cap.reason.split('; ')[0]})")
    else:
        lines.append(f"device: {cap.device} ({cap.arch}) -> {cap.backend} backend")
    flavor = cap.fp8_flavor.upper() if cap.fp8_flavor else "none"
    fp8_why = cap.reason.split("; ")[-1]
    lines.append(f"FP8: flavour {flavor}, FP8 GEMM {'yes' if cap.fp8_gemm else 'no'} ({fp8_why})")
    lines.append(_attention_line(mod, cap))
    lines.extend(_framework_versions())
    return "\n".join(lines)


def _attention_line(mod, cap) -> str:
    """Fused attention backends as they answer for a typical configuration (bf16, bshd, causal,
    16 heads, s 1024, d 128) on device 0."""
    if mod is None or not hasattr(mod, "attention_support"):
        return "fused attention: none (no native attention kernels in this build)"
    if cap.backend == "reference":
        return "fused attention: none (no GPU)"
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_kv, dim_qk, dim_v, dtype bf16, format bshd,
    #  mask causal, window left, right, scale, deterministic): see pytorch/kernels/attention.py
    params = (1, 16, 16, 1024, 1024, 128, 128, 2, 0, 2, -1, 0, 0.088, False)
    parts = []
    for code, name in ((1, "cudnn"), (2, "portable")):
        ok, reason = mod.attention_support(code, params, 0)
        parts.append(f"{name} {'yes' if ok else 'no (' + reason + ')'}")
    return "fused attention: " + "; ".join(parts)


def _parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog, description="Reports how transformer_engine was built and what it finds here: "
        "the build backend and why it was chosen, the native module, GEMM library, device, FP8 "
        "flavour, fused attention backends and the installed frameworks, one line per fact.")
    ap.add_argument("command", nargs="?", default="info", choices=["info"],
                    help="what to report (only 'info'; the default)")
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = "te-info" if sys.argv and sys.argv[0].endswith("te-info") else "python -m transformer_engine"
    _parser(prog).parse_args(argv)
    print(info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
