"""Which attention backend runs a configuration, and why the others do not.

Backends (one name each, on every vendor):
  cudnn     vendor-fused kernel (cuDNN graph API on NVIDIA; "unsupported" elsewhere). NVTE_FUSED_ATTN
  portable  our flash-style kernel (csrc/common/attention; the AMD backend). NVTE_FLASH_ATTN
  unfused   framework GEMMs + our fused masked softmax; accepts everything. NVTE_UNFUSED_ATTN

Selection is a table of small rules. Each rule names the backends it applies to and returns None
(no objection) or the sentence saying why it rejects. The first backend of the device's preference
order with no objection wins: cudnn > portable > unfused on NVIDIA, portable > unfused on AMD (the
fused kernels beat two GEMMs plus a softmax pass over an s x s matrix at every size we benchmark).
"No backend" never happens: if NVTE_UNFUSED_ATTN=0 and nothing else accepts, unfused still runs and
the report says the switch was overridden.

`get_attention_backend(config)` returns the report without running anything (it works on a
machine without a GPU); NVTE_DEBUG=1 logs it the first time each configuration is seen
(NVTE_DEBUG_LEVEL=1: choice and rejections; 2: also the configuration itself).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional, Tuple

import torch

from ...common import config as env
from .. import native

BACKENDS = ("cudnn", "portable", "unfused")
PREFERENCE = {"cuda": ("cudnn", "portable", "unfused"), "rocm": ("portable", "cudnn", "unfused")}

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
    ok, why = env.attention_backend_allowed(backend)
    return None if ok else why


def _on_gpu(backend, cfg):
    dev = torch.device(cfg.device)
    if dev.type != "cuda":
        return f"tensors on {dev.type}: native kernels run on a GPU"
    if native.native_for_torch() is None:
        return "the native core is not built for this torch's GPU vendor"
    return None


def _dense_mask(backend, cfg):
    if cfg.mask_type == "arbitrary":
        return "arbitrary masks are dense [b, h, sq, sk] tensors; only unfused reads them"
    return None


def _bias(backend, cfg):
    if cfg.has_bias:
        return "core_attention_bias (post-scale bias) is applied by unfused only"
    return None


def _kernel(backend, cfg):
    mod = _ops_attention()
    if mod is None:
        return "not built: transformer_engine.pytorch.kernels.attention is absent"
    ok, reason = mod.native_attention_support(backend, cfg)
    return None if ok else reason


RULES: Tuple[Tuple[Tuple[str, ...], str, Callable], ...] = (
    (BACKENDS, "environment switch", _switch),
    (("cudnn", "portable"), "device", _on_gpu),
    (("cudnn", "portable"), "mask tensor", _dense_mask),
    (("cudnn", "portable"), "bias", _bias),
    (("cudnn", "portable"), "kernel support", _kernel),
)


# ----- the report ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttentionBackendReport:
    chosen: str                              # 'cudnn' | 'portable' | 'unfused'
    config: object                           # the AttentionConfig judged
    order: Tuple[str, ...]                   # preference order on this device
    rejections: Tuple[Tuple[str, str], ...]  # (backend, reason) for every objection raised
    note: str = ""                           # e.g. a switch that had to be overridden

    def reasons(self, backend: str) -> Tuple[str, ...]:
        return tuple(r for b, r in self.rejections if b == backend)

    def accepted(self, backend: str) -> bool:
        return not self.reasons(backend)

    def __str__(self) -> str:
        lines = [f"attention backend: {self.chosen}" + (f" ({self.note})" if self.note else "")]
        lines += [f"  {b} rejected: {r}" for b, r in self.rejections]
        return "\n".join(lines)


def _vendor(cfg) -> str:
    if torch.device(cfg.device).type == "cuda" and torch.version.hip:
        return "rocm"
    return "cuda"


def _evaluate(cfg) -> AttentionBackendReport:
    order = PREFERENCE[_vendor(cfg)]
    rejections = []
    for backend in order:  # the first objection per backend is its reason (later rules may
        for applies_to, _name, rule in RULES:  # assume the earlier ones passed)
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
    return AttentionBackendReport(chosen, cfg, order, tuple(rejections), note)


_CACHE: dict = {}
_LOGGED: set = set()


def _env_key() -> tuple:
    return tuple(env.attention_backend_allowed(b)[0] for b in BACKENDS)


def get_attention_backend(cfg) -> AttentionBackendReport:
    """The backend DotProductAttention would run for `cfg` (an kernels.attention.AttentionConfig), with
    every rejection and its reason. Runs nothing on the device; reads the NVTE_*_ATTN switches now."""
    key = (cfg, _env_key())
    report = _CACHE.get(key)
    if report is None:
        report = _CACHE[key] = _evaluate(cfg)
    _log(report, key)
    return report


def _log(report: AttentionBackendReport, key) -> None:
    level = env.debug_level()
    if level <= 0 or key in _LOGGED:
        return
    _LOGGED.add(key)
    if not _logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[TE attention] %(message)s"))
        _logger.addHandler(handler)
        _logger.propagate = False
    _logger.setLevel(logging.INFO)
    if level >= 2:
        _logger.info("configuration: %s", report.config)
    _logger.info("%s", report)


def clear_backend_cache() -> None:
    """Forget cached decisions and logged configurations (tests; after rebuilding the extension)."""
    _CACHE.clear()
    _LOGGED.clear()
