"""Which attention backend runs a configuration, and why the others do not.

Backends, their switches and the order per vendor are defined once for both frontends in
transformer_engine/common/attention_selection.py: cudnn > sdpa | portable > unfused on NVIDIA
(sdpa before portable where SDPA needs no dense mask), sdpa > unfused on AMD (the FMA portable
kernel only with NVTE_FLASH_ATTN=1), unfused on the CPU (sdpa there with NVTE_UNFUSED_ATTN=0).

Selection is a table of small rules. Each rule names the backends it applies to and returns None
(no objection) or the sentence saying why it rejects. The first backend of the preference order
with no objection wins. "No backend" never happens: if NVTE_UNFUSED_ATTN=0 and nothing else
accepts, unfused still runs and the report says the switch was overridden.

`get_attention_backend(config)` returns the report without running anything (it works on a
machine without a GPU); NVTE_DEBUG=1 logs it the first time each configuration is seen
(NVTE_DEBUG_LEVEL=1: choice and rejections; 2: also the configuration itself).
`assume_vendor('rocm' | 'cuda')` (tests) judges CPU configurations as if they ran on that vendor's GPU.
"""
from __future__ import annotations

import logging
from typing import Callable, Tuple

import torch

from ...common import attention_selection as sel
from ...common import config as env
from ...common.attention_selection import AttentionBackendReport  # noqa: F401  (re-exported)
from .. import native
from . import sdpa as sdpa_backend

BACKENDS = sel.BACKENDS   # the order per vendor (and configuration): sel.preference

_logger = logging.getLogger("transformer_engine.pytorch.attention")


def _ops_attention():
    """The native attention op module (attn-native's); None while it is absent from the build."""
    try:
        from ..kernels import attention
    except ImportError:
        return None
    return attention


# ----- rules: (backends, rule name, fn(backend, cfg) -> Optional[reason]) -------------------------

def _switch(backend, cfg):
    return sel.switch_reason(backend)


def _on_gpu(backend, cfg):
    dev = torch.device(cfg.device)
    if dev.type != "cuda":
        return f"tensors on {dev.type}: native kernels run on a GPU"
    if native.native_for_torch() is None:
        return "the native core is not built for this torch's GPU vendor"
    return None


def _dense_mask(backend, cfg):
    if cfg.mask_type == "arbitrary":
        return "arbitrary masks are dense [b, h, sq, sk] tensors; the native kernels do not read them"
    return None


def _bias(backend, cfg):
    if cfg.has_bias:
        return "core_attention_bias (post-scale bias) is not implemented in the native kernels"
    return None


def _kernel(backend, cfg):
    mod = _ops_attention()
    if mod is None:
        return "not built: transformer_engine.pytorch.kernels.attention is absent"
    ok, reason = mod.native_attention_support(backend, cfg)
    return None if ok else reason


def _vendor_gate(backend, cfg):
    if backend == "portable":
        return sel.amd_portable_reason(_vendor(cfg))
    return sel.amd_cudnn_reason(_vendor(cfg))


def _sdpa_rule(neutral):
    """A framework-neutral rule in this table's (backend, cfg) form."""
    return lambda backend, cfg: neutral(cfg)


def _sdpa_dtype(backend, cfg):
    return sel.framework_dtype_reason(str(cfg.dtype).replace("torch.", ""), _vendor(cfg))


def _sdpa_head_dim(backend, cfg):
    return sel.framework_head_dim_reason(cfg, _vendor(cfg))


def _sdpa_determinism(backend, cfg):
    return sel.framework_determinism_reason(cfg, _vendor(cfg))


RULES: Tuple[Tuple[Tuple[str, ...], str, Callable], ...] = (
    (BACKENDS, "environment switch", _switch),
    (("cudnn", "portable"), "vendor", _vendor_gate),
    (("cudnn", "portable"), "device", _on_gpu),
    (("cudnn", "portable"), "mask tensor", _dense_mask),
    (("cudnn", "portable"), "bias", _bias),
    (("cudnn", "portable"), "kernel support", _kernel),
    (("sdpa",), "layout", _sdpa_rule(sel.framework_layout_reason)),
    (("sdpa",), "bias", _sdpa_rule(sel.framework_bias_reason)),
    (("sdpa",), "dtype", _sdpa_dtype),
    (("sdpa",), "head dims", _sdpa_head_dim),
    (("sdpa",), "GQA", _sdpa_rule(sel.framework_gqa_reason)),
    (("sdpa",), "determinism", _sdpa_determinism),
    (("sdpa",), "torch support", lambda backend, cfg: sdpa_backend.support_reason(cfg)),
)


# ----- the decision ------------------------------------------------------------------------------

def _vendor(cfg) -> str:
    """'cuda' (NVIDIA GPU), 'rocm' (AMD GPU) or 'cpu': where the configuration runs."""
    if sel.assumed_vendor() is not None:
        return sel.assumed_vendor()
    if torch.device(cfg.device).type != "cuda":
        return "cpu"
    return "rocm" if torch.version.hip else "cuda"


assume_vendor = sel.assume_vendor   # tests: judge configurations as on another vendor's GPU


def _evaluate(cfg) -> AttentionBackendReport:
    vendor = _vendor(cfg)
    return sel.evaluate(cfg, sel.preference(vendor, cfg), RULES, vendor)


_CACHE: dict = {}
_LOGGED: set = set()


def get_attention_backend(cfg, env_state=None) -> AttentionBackendReport:
    """The backend DotProductAttention would run for `cfg` (a kernels.attention.AttentionConfig), with
    every rejection and its reason. Runs nothing on the device; reads the NVTE_*_ATTN switches now,
    or takes them from `env_state` (common.config.attention_env() of this call)."""
    state = env.attention_env() if env_state is None else env_state
    key = (cfg, sel.switches_key(state))
    report = _CACHE.get(key)
    if report is None:
        report = _CACHE[key] = _evaluate(cfg)
    sel.log_report(_logger, report, key, _LOGGED, state.debug_level)
    return report


def clear_backend_cache() -> None:
    """Forget cached decisions and logged configurations (tests; after rebuilding the extension)."""
    _CACHE.clear()
    _LOGGED.clear()
