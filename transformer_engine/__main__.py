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
    from transformer_engine.common.native import emulation, native_module, native_unavailable_reason

    lines = [f"transformer_engine {transformer_engine.__version__}"]
    mod = native_module()
    if mod is None:
        lines.append(f"build backend: none (reference only): {native_unavailable_reason()}")
    else:
        emulated = f" ({emulation()})" if emulation() else ""
        lines.append(f"build backend: {mod.build_backend()}{emulated}  archs: {mod.build_archs()}")
    lib, why = capabilities.gemm_library()
    lines.append(f"GEMM library: {lib} ({why})")
    cap = capabilities.native_device_capability()
    if cap.backend == "reference":
        lines.append(f"device: none -> reference backend ({cap.reason})")
    else:
        lines.append(f"device: {cap.device} ({cap.arch}) -> {cap.backend} backend")
    flavor = cap.fp8_flavor.upper() if cap.fp8_flavor else "none"
    lines.append(f"FP8: flavour {flavor}, FP8 GEMM {'yes' if cap.fp8_gemm else 'no'} ({cap.reason})")
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in ("info",):
        print("usage: python -m transformer_engine info", file=sys.stderr)
        return 2
    print(info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
