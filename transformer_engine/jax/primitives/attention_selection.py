"""Which attention backend runs a JAX configuration, and why the others do not: the PyTorch
dispatcher's backends, order and framework-neutral rules (transformer_engine/common/
attention_selection.py), with JAX's own facts:
  cudnn, portable  the native kernels through the XLA FFI custom calls (primitives/attention.py);
  sdpa             jax.nn.dot_product_attention with XLA's fused (cuDNN) implementation, where
                   XLA has one for the platform (NVIDIA; on ROCm only if it lowers there);
  unfused          the jnp path: two GEMMs around the fused softmax primitive.
Masks given as tensors, bias and dropout run in the jnp path (none of the fused paths takes them
here). `get_attention_backend(cfg)` returns the report; NVTE_DEBUG=1 logs it, as in PyTorch.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Tuple

import jax
import jax.numpy as jnp

from ...common import attention_selection as sel
from ...common import config as env
from ...common.attention_selection import AttentionBackendReport  # noqa: F401  (re-exported)
from .attention import NativeAttentionCall, native_support
from .registry import why_reference

_NATIVE = ("cudnn", "portable")
_NATIVE_DTYPES = ("float16", "bfloat16")
_logger = logging.getLogger("transformer_engine.jax.attention")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype_name: str
    qkv_format: str = "bshd"
    mask_type: str = "no_mask"
    window_size: tuple = (-1, -1)
    dropout_p: float = 0.0
    has_bias: bool = False
    has_mask_tensor: bool = False
    deterministic: bool = False


def vendor() -> str:
    """'cuda', 'rocm' or 'cpu': where JAX runs (or what assume_vendor says)."""
    if sel.assumed_vendor() is not None:
        return sel.assumed_vendor()
    if jax.default_backend() != "gpu":
        return "cpu"
    version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


def native_call(backend: str, cfg: AttentionConfig, softmax_scale: float) -> NativeAttentionCall:
    left, right = sel.effective_window(cfg.mask_type, cfg.window_size)
    return NativeAttentionCall(backend, cfg.batch, cfg.num_heads_q, cfg.num_heads_kv, cfg.seqlen_q,
                               cfg.seqlen_kv, cfg.head_dim_qk, cfg.head_dim_v, cfg.dtype_name,
                               cfg.qkv_format, cfg.mask_type, left, right, float(softmax_scale),
                               cfg.deterministic)


@functools.lru_cache(maxsize=None)
def xla_fused_attention_reason(platform_vendor: str) -> str:
    """'' when jax.nn.dot_product_attention(implementation='cudnn') lowers and compiles on this
    GPU, else why not (tried once on a tiny call)."""
    if platform_vendor == "cpu":
        return ""  # the CPU runs its XLA implementation; nothing to probe
    if jax.default_backend() != "gpu":
        return "no GPU here to run XLA's fused attention on"
    x = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.bfloat16)
    try:
        jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="cudnn")) \
            .lower(x, x, x).compile()
    except Exception as exc:  # any failure means: no fused path on this platform
        return f"XLA has no fused attention here ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


# ----- rules: (backend, cfg) -> None or the reason ------------------------------------------------

def _vendor_gate(backend, cfg):
    v = vendor()
    return sel.amd_portable_reason(v) if backend == "portable" else sel.amd_cudnn_reason(v)


def _custom_call(backend, cfg):
    why = why_reference("attention")
    return f"the native custom call does not run here: {why}" if why else None


def _mask_tensor(backend, cfg):
    if cfg.has_mask_tensor:
        return "attention masks given as tensors are applied by the jnp path only"
    return None


def _native_bias(backend, cfg):
    return "attention bias is not implemented in the fused kernels" if cfg.has_bias else None


def _dropout(backend, cfg):
    if cfg.dropout_p > 0.0:
        where = ("the fused kernels" if backend in _NATIVE
                 else "jax.nn.dot_product_attention")
        return f"dropout is not implemented in {where}"
    return None


def _native_dtype(backend, cfg):
    if cfg.dtype_name not in _NATIVE_DTYPES:
        return f"dtype {cfg.dtype_name} is not float16 or bfloat16"
    return None


def _kernel(backend, cfg):
    ok, reason = native_support(native_call(backend, cfg, 1.0))
    return None if ok else reason


def _sdpa_dense_mask(backend, cfg):
    if sel.needs_dense_mask(cfg.mask_type, cfg.window_size, cfg.seqlen_q, cfg.seqlen_kv):
        return (f"mask {cfg.mask_type} with window {tuple(cfg.window_size)} needs a dense mask, "
                "which XLA's fused implementation does not take")
    return None


def _neutral(rule):
    return lambda backend, cfg: rule(cfg)


RULES: Tuple[sel.Rule, ...] = (
    (sel.BACKENDS, "environment switch", lambda backend, cfg: sel.switch_reason(backend)),
    (_NATIVE, "vendor", _vendor_gate),
    (_NATIVE + ("sdpa",), "mask tensor", _mask_tensor),
    (_NATIVE, "bias", _native_bias),
    (("sdpa",), "bias", _neutral(sel.framework_bias_reason)),
    (_NATIVE + ("sdpa",), "dropout", _dropout),
    (_NATIVE, "custom call", _custom_call),
    (_NATIVE, "dtype", _native_dtype),
    (_NATIVE, "kernel support", _kernel),
    (("sdpa",), "layout", _neutral(sel.framework_layout_reason)),
    (("sdpa",), "dtype", lambda backend, cfg: sel.framework_dtype_reason(cfg.dtype_name, vendor())),
    (("sdpa",), "head dims", lambda backend, cfg: sel.framework_head_dim_reason(cfg, vendor())),
    (("sdpa",), "GQA", _neutral(sel.framework_gqa_reason)),
    (("sdpa",), "determinism", lambda backend, cfg: sel.framework_determinism_reason(cfg, vendor())),
    (("sdpa",), "dense mask", _sdpa_dense_mask),
    (("sdpa",), "XLA fused path", lambda backend, cfg: xla_fused_attention_reason(vendor()) or None),
)

_CACHE: dict = {}
_LOGGED: set = set()


def get_attention_backend(cfg: AttentionConfig) -> AttentionBackendReport:
    """The backend fused_attn runs for `cfg`, with every rejection and its reason. Runs nothing
    on the device but the one-time XLA probe; reads the NVTE_*_ATTN switches now."""
    key = (cfg, sel.switches_key(), env.jax_custom_call_enabled("attention"))
    report = _CACHE.get(key)
    if report is None:
        v = vendor()
        report = _CACHE[key] = sel.evaluate(cfg, sel.preference(v, cfg), RULES, v)
    sel.log_report(_logger, report, key, _LOGGED)
    return report


def clear_backend_cache() -> None:
    """Forget cached decisions and logged configurations (tests)."""
    _CACHE.clear()
    _LOGGED.clear()
