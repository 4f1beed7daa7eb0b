"""Every environment variable the library reads at run time, read here and at call time (never
at import), so changing one between calls takes effect. README.rst lists them all."""
from __future__ import annotations

import os
from typing import NamedTuple


def _flag(name: str, default: bool | None) -> bool | None:
    return _parse_flag(name, os.environ.get(name), default)


def _parse_flag(name: str, value: str | None, default: bool | None) -> bool | None:
    if value is None or value.strip() == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected 0 or 1")


def use_hipblaslt(build_default: bool) -> tuple:
    """ROCm GEMM library: (True for hipBLASLt / False for rocBLAS, why). The variable's value
    counts, not its presence: NVTE_USE_HIPBLASLT=0 selects rocBLAS."""
    chosen = _flag("NVTE_USE_HIPBLASLT", None)
    if chosen is None:
        return build_default, "NVTE_USE_HIPBLASLT unset: build-time default"
    return chosen, f"NVTE_USE_HIPBLASLT={os.environ['NVTE_USE_HIPBLASLT']}"


# ----- attention (transformer_engine/pytorch/attention) ------------------------------------------
# Which of our backends each switch governs: NVTE_FUSED_ATTN = the vendor-fused kernel ('cudnn' on
# NVIDIA), NVTE_FLASH_ATTN = our portable flash-style kernel ('portable', the AMD backend),
# NVTE_UNFUSED_ATTN = framework ops + fused masked softmax ('unfused'), NVTE_SDPA_ATTN = the
# framework's own fused attention ('sdpa': torch SDPA, jax.nn.dot_product_attention). All default
# to 1 (allowed). On AMD the portable kernel runs only when NVTE_FLASH_ATTN=1 is set explicitly.
ATTENTION_BACKEND_SWITCHES = {"cudnn": "NVTE_FUSED_ATTN", "portable": "NVTE_FLASH_ATTN",
                              "unfused": "NVTE_UNFUSED_ATTN", "sdpa": "NVTE_SDPA_ATTN"}


def attention_backend_requested(backend: str) -> bool:
    """Whether the backend's NVTE_*_ATTN switch is set to 1 explicitly (unset is not a request)."""
    return bool(_flag(ATTENTION_BACKEND_SWITCHES[backend], False))


def attention_backend_allowed(backend: str) -> tuple:
    """(allowed, why) for an attention backend name, from its NVTE_*_ATTN switch (default 1)."""
    var = ATTENTION_BACKEND_SWITCHES[backend]
    if _flag(var, True):
        return True, f"{var} is 1 or unset"
    return False, f"disabled by {var}=0"


def allow_nondeterministic_algo() -> bool:
    """NVTE_ALLOW_NONDETERMINISTIC_ALGO (default 1); 0 asks for deterministic kernels only."""
    return bool(_flag("NVTE_ALLOW_NONDETERMINISTIC_ALGO", True))


def debug_level() -> int:
    """Backend-selection logging: 0 when NVTE_DEBUG is unset/0, else NVTE_DEBUG_LEVEL (default 1;
    1 = the chosen backend and every rejection with its reason, 2 = also the configuration)."""
    return _parse_debug_level(os.environ.get("NVTE_DEBUG"), os.environ.get("NVTE_DEBUG_LEVEL"))


def _parse_debug_level(debug: str | None, level: str | None) -> int:
    if not _parse_flag("NVTE_DEBUG", debug, False):
        return 0
    raw = (level or "").strip()
    if raw == "":
        return 1
    try:
        return max(0, int(raw))
    except ValueError:
        raise ValueError(f"environment variable NVTE_DEBUG_LEVEL={raw!r}: expected 0, 1 or 2") from None


class AttentionEnv(NamedTuple):
    """The attention variables of one moment, parsed."""
    allowed: tuple                 # per backend, in the order of ATTENTION_BACKEND_SWITCHES
    portable_requested: bool       # NVTE_FLASH_ATTN=1 set explicitly
    allow_nondeterministic: bool   # NVTE_ALLOW_NONDETERMINISTIC_ALGO
    debug_level: int               # NVTE_DEBUG / NVTE_DEBUG_LEVEL, as debug_level()


_ATTENTION_ENV_NAMES = tuple(ATTENTION_BACKEND_SWITCHES.values()) + (
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_DEBUG")
_ATTENTION_ENV_PARSED: dict = {}


def attention_env() -> AttentionEnv:
    """Every attention variable, read now (each once) and parsed. The parse is remembered per
    raw value set: attention reads these on every forward, and parsing them each time cost more
    host time than the rest of the sdpa backend's dispatch."""
    get = os.environ.get
    raw = tuple(map(get, _ATTENTION_ENV_NAMES))
    if raw[-1] is not None:   # NVTE_DEBUG_LEVEL counts only under NVTE_DEBUG
        raw += (get("NVTE_DEBUG_LEVEL"),)
    parsed = _ATTENTION_ENV_PARSED.get(raw)
    if parsed is None:
        parsed = _parse_attention_env(raw)
        if len(_ATTENTION_ENV_PARSED) >= 64:
            _ATTENTION_ENV_PARSED.clear()
        _ATTENTION_ENV_PARSED[raw] = parsed
    return parsed


def _parse_attention_env(raw: tuple) -> AttentionEnv:
    values = dict(zip(_ATTENTION_ENV_NAMES + ("NVTE_DEBUG_LEVEL",), raw))
    portable = ATTENTION_BACKEND_SWITCHES["portable"]
    return AttentionEnv(
        allowed=tuple(bool(_parse_flag(var, values[var], True)) for var in ATTENTION_BACKEND_SWITCHES.values()),
        portable_requested=bool(_parse_flag(portable, values[portable], False)),
        allow_nondeterministic=bool(_parse_flag("NVTE_ALLOW_NONDETERMINISTIC_ALGO",
                                                values["NVTE_ALLOW_NONDETERMINISTIC_ALGO"], True)),
        debug_level=_parse_debug_level(values["NVTE_DEBUG"], values.get("NVTE_DEBUG_LEVEL")))


def jax_warn_skipped_updates_in_step() -> bool:
    """NVTE_JAX_WARN_SKIPPED_UPDATES=1 (default 0): the JAX Flax modules warn from inside the
    step, through a host callback, once per module and recipe when an FP8 scale update was
    skipped for a non-finite amax. The callback waits for the device at every step, so it is a
    debugging aid; without it the counter (`transformer_engine.jax.fp8_skipped_updates`) is the
    signal."""
    return bool(_flag("NVTE_JAX_WARN_SKIPPED_UPDATES", False))


JAX_CUSTOM_CALLS = ("quantize", "cast_transpose", "layernorm", "rmsnorm", "activation",
                    "softmax", "gemm", "delayed_scaling", "attention")


def jax_custom_call_enabled(name: str) -> bool:
    """Whether the JAX primitive `name` (one of JAX_CUSTOM_CALLS) may use its XLA FFI custom
    call; when not, the jnp reference runs. NVTE_JAX_CUSTOM_CALLS: unset, '1' or 'all': every
    one on; '0' or 'none': every one off; a comma list of names turns on only those
    ('gemm,layernorm'); names with a leading '-' turn those off and leave the rest on ('-gemm')."""
    value = os.environ.get("NVTE_JAX_CUSTOM_CALLS", "").strip().lower()
    if value in ("", "1", "all", "true", "on"):
        return True
    if value in ("0", "none", "false", "off"):
        return False
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v.lstrip("-") not in JAX_CUSTOM_CALLS]
    if bad:
        raise ValueError(f"environment variable NVTE_JAX_CUSTOM_CALLS={value!r}: unknown {bad}; "
                         f"expected 0, 1, or a comma list of {', '.join(JAX_CUSTOM_CALLS)} "
                         f"(a leading '-' turns one off)")
    if all(v.startswith("-") for v in items):
        return f"-{name}" not in items
    if any(v.startswith("-") for v in items):
        raise ValueError(f"environment variable NVTE_JAX_CUSTOM_CALLS={value!r}: mix of names and "
                         f"'-name'; give either the ones to turn on or the ones to turn off")
    return name in items


TP_OVERLAP_MODES = ("0", "1", "nccl", "graphs")


def tp_overlap() -> str:
    """NVTE_TP_OVERLAP: how sequence-parallel GEMMs meet their all-gather / reduce-scatter, in row
    blocks that hide the transfer or whole. "graphs" (default): the blocks' rows moved by the
    GPUs' copy engines through torch's symmetric memory (NVLink peers) while a CUDA graph is
    captured, whose replays pay none of the pipelines' host time, and each GEMM whole next to
    its collective in eager calls, which are host-bound (blocks would cost more host time than
    they hide); "1": the copy engines always (where they run, else NCCL); "nccl": NCCL blocks
    always; "0": each GEMM whole next to its collective."""
    value = os.environ.get("NVTE_TP_OVERLAP", "").strip().lower() or "graphs"
    if value not in TP_OVERLAP_MODES:
        raise ValueError(f"environment variable NVTE_TP_OVERLAP={value!r}: expected one of "
                         f"{', '.join(TP_OVERLAP_MODES)}")
    return value


def fp8_block_scaling_fp32_scales() -> bool:
    """NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1: Float8BlockScaling's default scales are any fp32
    value instead of powers of two."""
    return bool(_flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", False))


def backward_override_default():
    """NVTE_BACKWARD_OVERRIDE: the default backward_override of Float8CurrentScaling and
    Float8BlockScaling (unset: None). The recipe validates the value."""
    value = os.environ.get("NVTE_BACKWARD_OVERRIDE")
    return value if value else None
