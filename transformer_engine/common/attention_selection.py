"""Attention backend selection shared by the PyTorch and JAX frontends, with no framework import:
the report, the walk over a rule table, the debug log, the order of backends per vendor, and the
rules that depend only on a configuration's numbers.

Backends (one name each, on every vendor and in both frontends):
  cudnn     vendor-fused kernel (cuDNN graph API on NVIDIA; none on AMD).     NVTE_FUSED_ATTN
  sdpa      the framework's own fused attention: torch.nn.functional.
            scaled_dot_product_attention (flash / cuDNN on NVIDIA, AOTriton / CK on ROCm, its
            CPU kernels), jax.nn.dot_product_attention in JAX.                 NVTE_SDPA_ATTN
  portable  our flash-style kernel (csrc/common/attention). On AMD it is FMA loops without the
            matrix cores (1-2 % of bf16 peak): it runs there only when NVTE_FLASH_ATTN=1 is set
            explicitly.                                                        NVTE_FLASH_ATTN
  unfused   two GEMMs around our fused masked softmax; accepts everything.     NVTE_UNFUSED_ATTN

A configuration object (PyTorch's or JAX's AttentionConfig) has the fields batch, num_heads_q,
num_heads_kv, seqlen_q, seqlen_kv, head_dim_qk, head_dim_v, qkv_format, mask_type, window_size,
dropout_p, has_bias, deterministic; the frontends pass its dtype's name ('bfloat16', ...) and
where it runs ('cuda' = NVIDIA GPU, 'rocm' = AMD GPU, 'cpu').
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from typing import Callable, Optional, Sequence, Tuple

from . import config as env

BACKENDS = ("cudnn", "sdpa", "portable", "unfused")

# ----- order per vendor ----------------------------------------------------------------------------
# NVIDIA: cuDNN first (fastest where it accepts). Where it is absent or rejects, sdpa and portable
# are ordered by framework_fast_path(): where the framework reaches its flash / cuDNN kernels
# without a dense mask tensor, sdpa goes before portable; where it needs a dense mask (padding,
# windows, bottom-right causal with sq != sk) it falls to its memory-efficient kernel and portable,
# which applies masks in-kernel, goes first. Measured on an H100 (bench_attention.py --filter
# order, bf16, b4 h32 d128, fwd/bwd time ratio sdpa : portable): no mask 1.69/1.59 and top-left
# causal 1.65/1.41 at 4096 (sdpa faster); padding+causal 0.20/0.27, window 1024 0.23/0.27 and
# bottom-right causal 4096x8192 0.58/0.67 (portable faster): the predicate splits them exactly.
ORDER_NVIDIA_FAST_PATH = ("cudnn", "sdpa", "portable", "unfused")
ORDER_NVIDIA_MASKED = ("cudnn", "portable", "sdpa", "unfused")
# AMD: sdpa (AOTriton / CK flash and memory-efficient kernels, AMD's engines) first, then unfused
# (hipBLASLt GEMMs): both use the matrix cores. cuDNN does not exist there; the FMA portable
# kernel is rejected by a rule unless NVTE_FLASH_ATTN=1 asks for it.
ORDER_ROCM = ("sdpa", "cudnn", "portable", "unfused")
# CPU: no native kernel; unfused is the reference path the CPU numerics are defined by, sdpa the
# framework's CPU kernels (reached with NVTE_UNFUSED_ATTN=0, as the tests force it).
ORDER_CPU = ("cudnn", "portable", "unfused", "sdpa")

VENDORS = ("cuda", "rocm", "cpu")


def framework_fast_path(cfg) -> bool:
    """Whether the framework's attention needs no dense mask tensor for this configuration: no
    padding, no window, and causal only where its top-left `is_causal` is the right diagonal."""
    return not needs_dense_mask(cfg.mask_type, cfg.window_size, cfg.seqlen_q, cfg.seqlen_kv)


def preference(vendor: str, cfg) -> Tuple[str, ...]:
    if vendor == "rocm":
        return ORDER_ROCM
    if vendor == "cpu":
        return ORDER_CPU
    return ORDER_NVIDIA_FAST_PATH if framework_fast_path(cfg) else ORDER_NVIDIA_MASKED


_ASSUMED_VENDOR = None   # set by assume_vendor (tests only)


def assumed_vendor() -> Optional[str]:
    return _ASSUMED_VENDOR


@contextlib.contextmanager
def assume_vendor(vendor: str):
    """Within the block, both frontends judge every configuration as if it ran on `vendor`'s GPU
    ('cuda' or 'rocm'): the ROCm selection is testable on a machine without one. For tests."""
    global _ASSUMED_VENDOR
    if vendor not in ("cuda", "rocm"):
        raise ValueError(f"assume_vendor: vendor is {vendor!r}; expected 'cuda' or 'rocm'")
    previous, _ASSUMED_VENDOR = _ASSUMED_VENDOR, vendor
    try:
        yield
    finally:
        _ASSUMED_VENDOR = previous


# ----- masks as the framework attention takes them -------------------------------------------------

def effective_window(mask_type: str, window_size) -> Tuple[int, int]:
    """(left, right) as applied: causal masks force right = 0; -1 = unbounded."""
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if "causal" in mask_type:
        right = 0
    return left, right


def uses_top_left_causal(mask_type: str, seqlen_q: int, seqlen_kv: int) -> bool:
    """Whether the mask is exactly the framework's `is_causal` (top-left diagonal): causal, or
    bottom-right causal where sq == skv puts both diagonals in one place."""
    return mask_type == "causal" or (mask_type == "causal_bottom_right" and seqlen_q == seqlen_kv)


def needs_dense_mask(mask_type: str, window_size, seqlen_q: int, seqlen_kv: int) -> bool:
    """Whether the framework attention needs an explicit [b, 1, sq, skv] mask."""
    left, right = effective_window(mask_type, window_size)
    if left >= 0 or (right >= 0 and "causal" not in mask_type):
        return True
    if mask_type == "no_mask":
        return False
    return not uses_top_left_causal(mask_type, seqlen_q, seqlen_kv)


# ----- framework-neutral rules (each returns None or the reason it rejects) -------------------------

def switch_reason(backend: str, cfg=None) -> Optional[str]:
    ok, why = env.attention_backend_allowed(backend)
    return None if ok else why


def amd_portable_reason(vendor: str) -> Optional[str]:
    if vendor == "rocm" and not env.attention_backend_requested("portable"):
        return ("on AMD the portable kernel is FP32 FMA loops without matrix cores (~1-2 % of bf16 "
                "peak); set NVTE_FLASH_ATTN=1 to run it anyway")
    return None


def amd_cudnn_reason(vendor: str) -> Optional[str]:
    if vendor == "rocm":
        return "cuDNN is NVIDIA's; AMD's fused kernels come through the sdpa backend"
    return None


FRAMEWORK_GPU_DTYPES = ("float16", "bfloat16")
FRAMEWORK_CPU_DTYPES = ("float16", "bfloat16", "float32")
FRAMEWORK_MAX_HEAD_DIM = 256


def framework_layout_reason(cfg) -> Optional[str]:
    if cfg.qkv_format == "thd":
        return ("qkv_format 'thd': the framework attention takes dense [b, h, s, d]; packed "
                "sequences would need a copy per sequence")
    return None


def framework_bias_reason(cfg) -> Optional[str]:
    if cfg.has_bias:
        return "core_attention_bias (post-scale bias, and its gradient) is applied by unfused only"
    return None


def framework_dtype_reason(dtype_name: str, vendor: str) -> Optional[str]:
    allowed = FRAMEWORK_CPU_DTYPES if vendor == "cpu" else FRAMEWORK_GPU_DTYPES
    if dtype_name not in allowed:
        where = "on the CPU" if vendor == "cpu" else "on the GPU (its fused kernels)"
        return f"dtype {dtype_name}: the framework attention {where} takes {', '.join(allowed)}"
    return None


def framework_head_dim_reason(cfg, vendor: str) -> Optional[str]:
    if vendor == "cpu":
        return None
    for name, d in (("head_dim_qk", cfg.head_dim_qk), ("head_dim_v", cfg.head_dim_v)):
        if d % 8 or d > FRAMEWORK_MAX_HEAD_DIM:
            return (f"{name} {d}: the framework's fused GPU kernels take multiples of 8 up to "
                    f"{FRAMEWORK_MAX_HEAD_DIM} (others fall to its math path, no faster than unfused)")
    return None


def framework_gqa_reason(cfg) -> Optional[str]:
    if cfg.num_heads_kv <= 0 or cfg.num_heads_q % cfg.num_heads_kv:
        return f"num_heads_q {cfg.num_heads_q} is not a multiple of num_heads_kv {cfg.num_heads_kv}"
    return None


def framework_determinism_reason(cfg, vendor: str) -> Optional[str]:
    if cfg.deterministic and vendor != "cpu":
        return ("NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the framework's GPU attention backward "
                "(flash / memory-efficient) promises no determinism")
    return None


# ----- the report and the walk over a rule table ---------------------------------------------------

Rule = Tuple[Tuple[str, ...], str, Callable]


@dataclasses.dataclass(frozen=True)
class AttentionBackendReport:
    chosen: str                              # one of BACKENDS
    config: object                           # the configuration judged
    order: Tuple[str, ...]                   # preference order for it on this device
    rejections: Tuple[Tuple[str, str], ...]  # (backend, reason) for every objection raised
    note: str = ""                           # e.g. a switch that had to be overridden
    vendor: str = ""                         # 'cuda' | 'rocm' | 'cpu'

    def reasons(self, backend: str) -> Tuple[str, ...]:
        return tuple(r for b, r in self.rejections if b == backend)

    def accepted(self, backend: str) -> bool:
        return not self.reasons(backend)

    def __str__(self) -> str:
        head = f"attention backend: {self.chosen}" + (f" ({self.note})" if self.note else "")
        if self.vendor:
            head += f" [{self.vendor}; order {' > '.join(self.order)}]"
        lines = [head] + [f"  {b} rejected: {r}" for b, r in self.rejections]
        return "\n".join(lines)


def evaluate(cfg, order: Sequence[str], rules: Sequence[Rule], vendor: str = "") -> AttentionBackendReport:
    """The first backend of `order` no rule objects to; every backend's first objection is kept
    (later rules may assume the earlier ones passed). Unfused runs if nothing accepts."""
    rejections = []
    for backend in order:
        for applies_to, _name, rule in rules:
            if backend in applies_to:
                reason = rule(backend, cfg)
                if reason:
                    rejections.append((backend, reason))
                    break
    rejected = {b for b, _ in rejections}
    chosen = next((b for b in order if b not in rejected), None)
    note = ""
    if chosen is None:
        chosen = "unfused"
        note = "NVTE_UNFUSED_ATTN=0 overridden: no other backend accepts this configuration"
    return AttentionBackendReport(chosen, cfg, tuple(order), tuple(rejections), note, vendor)


def switches_key(state: Optional[env.AttentionEnv] = None) -> tuple:
    """The env state (and assumed vendor) a cached decision depends on; `state` is the caller's
    env.attention_env() of this call, read now when omitted."""
    state = env.attention_env() if state is None else state
    return (state.allowed, state.portable_requested, _ASSUMED_VENDOR)


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record is emitted (not the stream of the moment
    the handler was made), so a replaced stderr (pytest's capture, a notebook) gets the log."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def log_report(logger: logging.Logger, report: AttentionBackendReport, key, logged: set,
               level: Optional[int] = None) -> None:
    """NVTE_DEBUG=1: log the choice and its rejections once per (configuration, env state);
    NVTE_DEBUG_LEVEL=2 adds the configuration. `level`: env.debug_level() if already read."""
    level = env.debug_level() if level is None else level
    if level <= 0 or key in logged:
        return
    logged.add(key)
    if not logger.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("[TE attention] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO)
    if level >= 2:
        logger.info("configuration: %s", report.config)
    logger.info("%s", report)
