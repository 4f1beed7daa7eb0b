"""Fused attention ops: the native backends ('cudnn', 'portable') and the plain-torch reference.

Contract for the dispatcher (transformer_engine/pytorch/attention/, attn-py) -- keep it stable:

  AttentionConfig                  frozen description of one call (see its fields below);
                                   AttentionConfig.from_tensors(q, k, v, ...) builds it.
  native_attention_support(backend, cfg) -> (bool, reason)
                                   the kernel's own answer, backend in NATIVE_BACKENDS; reason is a
                                   short sentence ("" when supported). Never raises for a valid
                                   backend name.
  fused_attention_forward(q, k, v, *, backend, qkv_format, mask_type, window_size=(-1, -1),
                          softmax_scale, dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None,
                          max_seqlen_q=None, max_seqlen_kv=None) -> (out, softmax_lse, rng_state)
  fused_attention_backward(q, k, v, out, d_out, softmax_lse, rng_state, *, <same keywords>,
                           deterministic=False, pack=None) -> (dq, dk, dv)
                                   dq/dk/dv with q/k/v's strides where cuDNN reads those in place;
                                   pack (attention_packed.QKVPack): views of one packed buffer
  FusedAttention.apply(q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                       dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                       deterministic) -> out            (autograd over the two above; q/k/v from
                                   attention_packed.split_packed_qkv get one packed gradient)
  attention_reference(q, k, v, *, qkv_format, mask_type, window_size=(-1, -1), softmax_scale,
                      dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                      max_seqlen_kv=None, attn_mask=None, return_lse=False) -> out [, lse]
                                   plain torch in fp32, accepts every configuration; it is the
                                   unfused backend's maths and the oracle of the tests.
  portable_kernel_variant('auto' | 'fma')   context manager (tests, benchmarks): the portable
                                   backend on the tensor cores where the build maps them
                                   (NVIDIA sm_80+), or its FMA kernels (what AMD builds run).

Layouts (q, k, v and out share one): 'bshd' [b, s, h, d], 'sbhd' [s, b, h, d], 'thd'
[total_tokens, h, d] with cu_seqlens (int32 [b + 1], cumulative lengths, on q's device). Padding
masks on bshd/sbhd take cu_seqlens too (sequence i is rows [0, len_i) of its padded slot); the
outputs and gradients of padded positions are zero. max_seqlen_* default to the tensor extents
(thd: the longest sequence, which costs one host sync: pass it).
GQA/MQA: k and v have num_heads_kv heads dividing num_heads_q; query head h reads kv head
h // (num_heads_q // num_heads_kv).

Masks (True = masked out). Per sequence with lengths sq, skv (after padding), the query i sees
key j when every applicable rule holds, with the diagonal offset
    off = skv - sq  for 'causal_bottom_right', 'padding_causal_bottom_right', and for the window
                    of 'no_mask' / 'padding' (the reference API's formula),
    off = 0         for 'causal' and 'padding_causal' (top-left),
  causal types:   j <= i + off
  window (l, r):  i + off - l <= j <= i + off + r    (-1 = unbounded on that side; causal types
                                                      have r = 0 whatever is passed)
  padding types:  i < sq and j < skv
  'arbitrary':    attn_mask (bool, broadcastable to [b, h, sq, skv]); reference only.
A query row that sees no key gives zeros (not NaN).

softmax_lse: float32 [b, h, max_seqlen_q], natural log of sum_j exp(softmax_scale * q.k_j) over
the visible keys (undefined for rows that see none, and for padded rows). rng_state: an int64
tensor [2] (seed, offset) when dropout_p > 0, else an empty int64 tensor.

The native backends need float16/bfloat16 CUDA/ROCm tensors. cuDNN reads q/k/v strided in place
(the head dim contiguous, the other strides multiples of 8 elements, 16-byte aligned: e.g. the
views of one packed QKV projection, kernels/attention_packed.py) and writes dq/dk/dv with their
strides; other tensors, and every tensor of the portable backend, are made contiguous first.
Dropout and bias are not implemented natively (native_attention_support says so): the unfused
path serves them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import torch

from .. import native
from ._checks import check_tensor
from .attention_packed import pack_of

QKV_FORMATS = ("bshd", "sbhd", "thd")
MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")
NATIVE_BACKENDS = ("cudnn", "portable")
_NATIVE_DTYPES = (torch.float16, torch.bfloat16)
# Codes shared with csrc/common/include/transformer_engine/attention.h.
BACKEND_CODE = {"cudnn": 1, "portable": 2}
FORMAT_CODE = {"bshd": 0, "sbhd": 1, "thd": 2}
MASK_CODE = {"no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3,
             "causal_bottom_right": 4, "padding_causal_bottom_right": 5, "arbitrary": 6}


def is_padding(mask_type: str) -> bool:
    return mask_type.startswith("padding")


def is_causal(mask_type: str) -> bool:
    return "causal" in mask_type


def is_bottom_right(mask_type: str) -> bool:
    return mask_type.endswith("bottom_right")


def effective_window(mask_type: str, window_size) -> tuple:
    """(left, right) as the kernels apply it: causal masks force right = 0; -1 = unbounded."""
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if is_causal(mask_type):
        right = 0
    return left, right


def diagonal_offset_is_bottom_right(mask_type: str) -> bool:
    """Whether the causal diagonal / window centre is aligned to the bottom-right corner."""
    return is_bottom_right(mask_type) or not is_causal(mask_type)


# ----- configuration ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype: torch.dtype
    device: torch.device
    qkv_format: str = "bshd"
    mask_type: str = "no_mask"
    window_size: tuple = (-1, -1)
    dropout_p: float = 0.0
    has_bias: bool = False
    deterministic: bool = False

    @classmethod
    def from_tensors(cls, q, k, v, *, qkv_format, mask_type="no_mask", window_size=(-1, -1),
                     dropout_p=0.0, has_bias=False, deterministic=False, cu_seqlens_q=None,
                     max_seqlen_q=None, max_seqlen_kv=None):
        """Config of a call; for thd, batch comes from cu_seqlens_q and seqlens from max_seqlen_*."""
        _check_format("AttentionConfig", qkv_format)
        if qkv_format == "thd":
            if cu_seqlens_q is None:
                raise ValueError("AttentionConfig: qkv_format 'thd' needs cu_seqlens_q")
            b = cu_seqlens_q.numel() - 1
            sq = max_seqlen_q if max_seqlen_q is not None else q.shape[0]
            skv = max_seqlen_kv if max_seqlen_kv is not None else k.shape[0]
        else:
            b = q.shape[0] if qkv_format == "bshd" else q.shape[1]
            sq = q.shape[1] if qkv_format == "bshd" else q.shape[0]
            skv = k.shape[1] if qkv_format == "bshd" else k.shape[0]
        return cls(batch=int(b), num_heads_q=int(q.shape[-2]), num_heads_kv=int(k.shape[-2]),
                   seqlen_q=int(sq), seqlen_kv=int(skv), head_dim_qk=int(q.shape[-1]),
                   head_dim_v=int(v.shape[-1]), dtype=q.dtype, device=q.device,
                   qkv_format=qkv_format, mask_type=mask_type,
                   window_size=tuple(int(w) for w in window_size), dropout_p=float(dropout_p),
                   has_bias=bool(has_bias), deterministic=bool(deterministic))


def _check_format(op, qkv_format):
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"{op}: qkv_format is {qkv_format!r}; expected one of {QKV_FORMATS}")


def _check_mask_type(op, mask_type):
    if mask_type not in MASK_TYPES:
        raise ValueError(f"{op}: mask_type is {mask_type!r}; expected one of {MASK_TYPES}")


# ----- support query ---------------------------------------------------------------------------

def _common_native_reason(backend: str, cfg: AttentionConfig) -> str:
    """Reasons that do not depend on the kernel's own limits ("" = none)."""
    mod = native.native_for_torch()
    if mod is None:
        return "not built: the native core is not built for this torch's GPU vendor"
    if not hasattr(mod, "attention_support"):
        return "not built: this native core has no attention kernels"
    if torch.device(cfg.device).type != "cuda":
        return f"tensors are on {torch.device(cfg.device).type}; the native kernels need a GPU"
    if cfg.dtype not in _NATIVE_DTYPES:
        return f"dtype {str(cfg.dtype).replace('torch.', '')} is not float16 or bfloat16"
    if cfg.mask_type == "arbitrary":
        return "an arbitrary mask tensor is not supported by the fused kernels"
    if cfg.has_bias:
        return "attention bias is not implemented in the fused kernels"
    if cfg.dropout_p > 0.0:
        return "dropout is not implemented in the fused kernels"
    if cfg.num_heads_kv <= 0 or cfg.num_heads_q % cfg.num_heads_kv != 0:
        return f"num_heads_q {cfg.num_heads_q} is not a multiple of num_heads_kv {cfg.num_heads_kv}"
    return ""


def native_attention_support(backend: str, cfg: AttentionConfig) -> tuple:
    """(supported, reason) of a native backend for a configuration, from the kernel itself."""
    if backend not in NATIVE_BACKENDS:
        raise ValueError(f"native_attention_support: backend is {backend!r}; expected one of "
                         f"{NATIVE_BACKENDS}")
    _check_format("native_attention_support", cfg.qkv_format)
    _check_mask_type("native_attention_support", cfg.mask_type)
    reason = _common_native_reason(backend, cfg)
    if reason:
        return False, reason
    left, right = effective_window(cfg.mask_type, cfg.window_size)
    device = torch.device(cfg.device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _kernel_support(BACKEND_CODE[backend],
                           _params_tuple(cfg.batch, cfg.num_heads_q, cfg.num_heads_kv,
                                         cfg.seqlen_q, cfg.seqlen_kv, cfg.head_dim_qk,
                                         cfg.head_dim_v, cfg.dtype, cfg.qkv_format,
                                         cfg.mask_type, left, right, 1.0, cfg.deterministic),
                           index)


# The kernels' answers depend on the parameters and the device only (no env var), so they are
# cached: every call asks, and the eager path should not pay a C round trip for it each time.
@functools.lru_cache(maxsize=4096)
def _kernel_support(code, params, device_index):
    ok, reason = native.native_for_torch().attention_support(code, params, device_index)
    return bool(ok), reason


@functools.lru_cache(maxsize=4096)
def _workspace_bytes(code, params, is_backward, device_index):
    return int(native.native_for_torch().attention_workspace_size(code, params, is_backward,
                                                                  device_index))


_DENSE_STRIDES = (0,) * 12


def _params_tuple(b, hq, hkv, sq, skv, dqk, dv, dtype, qkv_format, mask_type, left, right, scale,
                  deterministic, strides=_DENSE_STRIDES):
    """The C parameters (NVTEAttnParams); strides: 3 each of q, k, v, out (0s = dense)."""
    return (int(b), int(hq), int(hkv), int(sq), int(skv), int(dqk), int(dv),
            native.DTYPE_CODE[dtype], FORMAT_CODE[qkv_format], MASK_CODE[mask_type], int(left),
            int(right), float(scale), bool(deterministic), tuple(strides))


def _layout_strides(t: torch.Tensor):
    """t's element strides over its layout's leading dims as the C API takes them (attention.h:
    (0, 0, 0) when dense), or None when the kernels cannot read it in place (head dim not
    contiguous, rows not 16-byte aligned)."""
    if t.data_ptr() % 16:
        return None
    return _strides_of_geometry(t.shape, t.stride())


@functools.lru_cache(maxsize=1024)
def _strides_of_geometry(shape, stride):
    if stride[-1] != 1 and shape[-1] != 1:
        return None
    out, dense, inner = [], True, shape[-1]
    for i in range(len(shape) - 2, -1, -1):
        st = stride[i] if shape[i] > 1 else inner  # any stride is right for an extent of 1
        if st <= 0 or st % 8:
            return None
        dense = dense and st == inner
        out.append(st)
        inner *= shape[i]
    if dense:
        return (0, 0, 0)
    out.reverse()
    return tuple(out) + (0,) * (3 - len(out))


# ----- reference -------------------------------------------------------------------------------

def _seq_lengths(cu, b, default, device):
    if cu is None:
        return torch.full((b,), default, dtype=torch.long, device=device)
    cu = cu.to(device=device, dtype=torch.long)
    return cu[1:] - cu[:-1]


def _thd_to_padded(x, cu, smax):
    """[t, h, d] packed -> [b, smax, h, d] zero-padded, and the (batch, pos) index of each token."""
    cu = cu.to(device=x.device, dtype=torch.long)
    b = cu.numel() - 1
    tok = torch.arange(x.shape[0], device=x.device)
    seq = torch.searchsorted(cu[1:], tok, right=True).clamp(max=max(b - 1, 0))
    pos = tok - cu[seq]
    out = x.new_zeros(b, smax, *x.shape[1:])
    keep = pos < smax
    out[seq[keep], pos[keep]] = x[keep]
    return out, seq, pos


def _visible_mask(b, sq, skv, lq, lk, mask_type, window_size, device):
    """[b, 1, sq, skv] bool, True = visible (see the module docstring)."""
    i = torch.arange(sq, device=device).view(1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, skv)
    lq, lk = lq.view(b, 1, 1), lk.view(b, 1, 1)
    visible = (i < lq) & (j < lk)
    off = (lk - lq) if diagonal_offset_is_bottom_right(mask_type) else torch.zeros_like(lq)
    left, right = effective_window(mask_type, window_size)
    if right >= 0:
        visible &= j <= i + off + right
    if left >= 0:
        visible &= j >= i + off - left
    return visible.unsqueeze(1)


def attention_reference(q, k, v, *, qkv_format, mask_type, window_size=(-1, -1), softmax_scale,
                        dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                        max_seqlen_kv=None, attn_mask=None, return_lse=False):
    """softmax(scale * q k^T + mask) v in fp32, rounded once to q's dtype. See the module docstring."""
    op = "attention_reference"
    _check_format(op, qkv_format)
    _check_mask_type(op, mask_type)
    if qkv_format == "thd":
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError(f"{op}: qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv")
        lq_all = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
        lk_all = (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).long()
        sq = int(max_seqlen_q) if max_seqlen_q is not None else int(lq_all.max())
        skv = int(max_seqlen_kv) if max_seqlen_kv is not None else int(lk_all.max())
        qb, seq_q, pos_q = _thd_to_padded(q, cu_seqlens_q, sq)
        kb, _, _ = _thd_to_padded(k, cu_seqlens_kv, skv)
        vb, _, _ = _thd_to_padded(v, cu_seqlens_kv, skv)
        # packed sequences are padded here, so their lengths apply whatever the mask type
        out_b, lse = _reference_padded(qb, kb, vb, "bshd", mask_type, window_size, softmax_scale,
                                       dropout_p, cu_seqlens_q, cu_seqlens_kv, attn_mask,
                                       return_lse=True, force_lengths=True)
        out = out_b[seq_q, pos_q.clamp(max=sq - 1)]
        return (out, lse) if return_lse else out
    return _reference_padded(q, k, v, qkv_format, mask_type, window_size, softmax_scale,
                             dropout_p, cu_seqlens_q, cu_seqlens_kv, attn_mask, return_lse)


def _reference_padded(q, k, v, qkv_format, mask_type, window_size, softmax_scale, dropout_p,
                      cu_seqlens_q, cu_seqlens_kv, attn_mask, return_lse, force_lengths=False):
    if qkv_format == "sbhd":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    b, sq, hq, _ = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"attention_reference: q has {hq} heads, k/v {hkv}; expected a divisor")
    use_lengths = is_padding(mask_type) or force_lengths
    if is_padding(mask_type) and (cu_seqlens_q is None or cu_seqlens_kv is None):
        raise ValueError(f"attention_reference: mask_type {mask_type!r} needs cu_seqlens_q and "
                         "cu_seqlens_kv")
    lq = _seq_lengths(cu_seqlens_q if use_lengths else None, b, sq, q.device)
    lk = _seq_lengths(cu_seqlens_kv if use_lengths else None, b, skv, q.device)
    visible = _visible_mask(b, sq, skv, lq, lk, mask_type, window_size, q.device)
    if mask_type == "arbitrary":
        if attn_mask is None:
            raise ValueError("attention_reference: mask_type 'arbitrary' needs attn_mask")
        visible = visible & ~attn_mask.to(q.device).bool()
    group = hq // hkv
    qf = q.float().transpose(1, 2)                                   # [b, hq, sq, d]
    kf = k.float().transpose(1, 2).repeat_interleave(group, dim=1)   # [b, hq, skv, d]
    vf = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * softmax_scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                            # [b, hq, sq]
    probs = torch.exp(scores - lse.unsqueeze(-1))
    probs = torch.where(torch.isfinite(lse).unsqueeze(-1), probs, torch.zeros((), device=q.device))
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p)
    out = torch.matmul(probs, vf).transpose(1, 2)                    # [b, sq, hq, dv]
    # padded query rows: zero output like the kernels
    row_ok = (torch.arange(sq, device=q.device).view(1, sq) < lq.view(b, 1)).view(b, sq, 1, 1)
    out = torch.where(row_ok, out, torch.zeros((), device=q.device)).to(q.dtype)
    if qkv_format == "sbhd":
        out = out.transpose(0, 1).contiguous()
    return (out, lse) if return_lse else out


# ----- native forward / backward ---------------------------------------------------------------

def _check_cu_seqlens(op, name, cu, b, device):
    check_tensor(op, name, cu, (torch.int32,))
    if cu.dim() != 1 or cu.numel() != b + 1:
        raise ValueError(f"{op}: {name} has shape {tuple(cu.shape)}; expected [{b + 1}] "
                         "(batch + 1 cumulative lengths)")
    if cu.device != device:
        raise ValueError(f"{op}: {name} is on {cu.device}; expected {device} like q")


def _layout_dims(op, name, t, qkv_format):
    """(batch or None, seqlen or tokens, heads, head_dim) of a tensor in the layout."""
    want = 3 if qkv_format == "thd" else 4
    if t.dim() != want:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected {want} dims for "
                         f"qkv_format {qkv_format!r}")
    if qkv_format == "bshd":
        return t.shape[0], t.shape[1], t.shape[2], t.shape[3]
    if qkv_format == "sbhd":
        return t.shape[1], t.shape[0], t.shape[2], t.shape[3]
    return None, t.shape[0], t.shape[1], t.shape[2]


# Validated calls without sequence lengths by their arguments (what validation and the derived
# fields depend on): the same call every training step skips re-validating and re-deriving.
_PLANS: dict = {}
_PLAN_FIELDS = ("cfg", "backend", "code", "qkv_format", "_fields", "params", "zero_fill", "mod")
_EMPTY_RNG: dict = {}  # device -> the int64 [0] rng_state of calls without dropout


class _Call:
    """A validated native call: config, C parameter tuple and the tensors' geometry."""

    def __init__(self, op, q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                 dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                 deterministic):
        key = None
        if cu_seqlens_q is None and cu_seqlens_kv is None and all(
                isinstance(t, torch.Tensor) for t in (q, k, v)):
            key = (backend, qkv_format, mask_type, tuple(window_size), softmax_scale, dropout_p,
                   bool(deterministic), q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device)
            plan = _PLANS.get(key)
            if plan is not None:
                self.__dict__.update(plan)
                self.cu_q = self.cu_kv = None
                self.stream = native.stream_of(q)
                return
        self._validate(op, q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                       dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                       deterministic)
        if key is not None:
            if len(_PLANS) >= 1024:
                _PLANS.clear()
            _PLANS[key] = {name: getattr(self, name) for name in _PLAN_FIELDS}

    def _validate(self, op, q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                  dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                  deterministic):
        if backend not in NATIVE_BACKENDS:
            raise ValueError(f"{op}: backend is {backend!r}; expected one of {NATIVE_BACKENDS}")
        _check_format(op, qkv_format)
        _check_mask_type(op, mask_type)
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_tensor(op, name, t, _NATIVE_DTYPES, contiguous=False)
            if t.dtype != q.dtype or t.device != q.device:
                raise ValueError(f"{op}: {name} is {t.dtype} on {t.device}; expected {q.dtype} on "
                                 f"{q.device} like q")
        bq, sq, hq, dqk = _layout_dims(op, "q", q, qkv_format)
        bk, skv, hkv, dk = _layout_dims(op, "k", k, qkv_format)
        bv, sv, hv, dv = _layout_dims(op, "v", v, qkv_format)
        if dk != dqk or (bv, sv, hv) != (bk, skv, hkv) or bk != bq:
            raise ValueError(f"{op}: k {tuple(k.shape)} / v {tuple(v.shape)} do not match q "
                             f"{tuple(q.shape)} in {qkv_format!r} (same batch, k and v the same "
                             "tokens and heads, k's head dim equal to q's)")
        if hkv == 0 or hq % hkv != 0:
            raise ValueError(f"{op}: q has {hq} heads and k/v {hkv}; num_heads_q must be a "
                             "multiple of num_heads_kv (GQA/MQA)")
        if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale):
            raise ValueError(f"{op}: softmax_scale is {softmax_scale!r}; expected a finite float")
        needs_lengths = qkv_format == "thd" or is_padding(mask_type)
        if needs_lengths:
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError(f"{op}: qkv_format {qkv_format!r} with mask_type {mask_type!r} "
                                 "needs cu_seqlens_q and cu_seqlens_kv")
            b = cu_seqlens_q.numel() - 1 if qkv_format == "thd" else bq
            _check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, b, q.device)
            _check_cu_seqlens(op, "cu_seqlens_kv", cu_seqlens_kv, b, q.device)
        else:
            cu_seqlens_q = cu_seqlens_kv = None
            b = bq
        if qkv_format == "thd":
            if max_seqlen_q is None:
                max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if b > 0 else 0
            if max_seqlen_kv is None:
                max_seqlen_kv = int((cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).max()) if b > 0 else 0
            sq, skv = int(max_seqlen_q), int(max_seqlen_kv)
        self.cfg = AttentionConfig(
            batch=int(b), num_heads_q=int(hq), num_heads_kv=int(hkv), seqlen_q=int(sq),
            seqlen_kv=int(skv), head_dim_qk=int(dqk), head_dim_v=int(dv), dtype=q.dtype,
            device=q.device, qkv_format=qkv_format, mask_type=mask_type,
            window_size=tuple(int(w) for w in window_size), dropout_p=float(dropout_p),
            deterministic=bool(deterministic))
        ok, reason = native_attention_support(backend, self.cfg)
        if not ok:
            raise NotImplementedError(f"{op}: backend {backend!r} cannot run this configuration: "
                                      f"{reason}")
        left, right = effective_window(mask_type, window_size)
        self.backend = backend
        self.code = BACKEND_CODE[backend]
        self.qkv_format = qkv_format
        self._fields = (b, hq, hkv, sq, skv, dqk, dv, q.dtype, qkv_format, mask_type, left, right,
                        softmax_scale, deterministic)
        self.params = _params_tuple(*self._fields)  # dense; set_layout gives the tensors' strides
        self.cu_q, self.cu_kv = cu_seqlens_q, cu_seqlens_kv
        # padded rows are never written by every backend: zero them up front
        self.zero_fill = needs_lengths
        self.mod = native.native_for_torch()
        self.stream = native.stream_of(q)

    def describe_opt(self, t):
        return native.describe(t) if t is not None else None

    def strides_of(self, t):
        """t's layout strides if this backend reads it in place, else None (copy it)."""
        st = _layout_strides(t)
        if st is None or (self.backend != "cudnn" and st != (0, 0, 0)):
            return None
        return st

    def set_layout(self, q, k, v):
        """The q, k, v the kernel reads (copies of those it cannot read in place) and the
        parameters with their strides (out, d_out: dense). A strided configuration cuDNN refuses
        runs on contiguous copies."""
        tensors, strides = [], []
        for t in (q, k, v):
            st = self.strides_of(t)
            if st is None:
                t, st = t.contiguous(), (0, 0, 0)
            tensors.append(t)
            strides.extend(st)
        strides = tuple(strides) + (0, 0, 0)
        if strides != _DENSE_STRIDES:
            params = _params_tuple(*self._fields, strides=strides)
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            if not _kernel_support(self.code, params, index)[0]:
                return self.set_layout(*(t.contiguous() for t in tensors))
            self.params = params
        else:
            self.params = _params_tuple(*self._fields)
        return tuple(tensors)

    def workspace(self, backward, device):
        """(tensor to keep alive until the launch, pointer, bytes); no tensor when 0 bytes."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        size = _workspace_bytes(self.code, self.params, bool(backward), index)
        if size == 0:
            return None, 0, 0
        ws = torch.empty(size, dtype=torch.uint8, device=device)
        return ws, ws.data_ptr(), size

    def alloc(self, like, shape=None):
        shape = like.shape if shape is None else shape
        if self.zero_fill:
            return torch.zeros(shape, dtype=like.dtype, device=like.device)
        return torch.empty(shape, dtype=like.dtype, device=like.device)


def fused_attention_forward(q, k, v, *, backend, qkv_format, mask_type, window_size=(-1, -1),
                            softmax_scale, dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None,
                            max_seqlen_q=None, max_seqlen_kv=None, deterministic=False):
    """(out, softmax_lse, rng_state) of one native backend; see the module docstring."""
    call = _Call("fused_attention_forward", q, k, v, backend, qkv_format, mask_type, window_size,
                 softmax_scale, dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                 max_seqlen_kv, deterministic)
    return _forward(call, q, k, v)[:3]


def _forward(call, q, k, v):
    """(out, lse, rng_state, (q, k, v) as the kernel read them)."""
    cfg = call.cfg
    q, k, v = call.set_layout(q, k, v)
    out = call.alloc(q, tuple(q.shape[:-1]) + (cfg.head_dim_v,))
    lse = torch.empty(cfg.batch, cfg.num_heads_q, cfg.seqlen_q, dtype=torch.float32,
                      device=q.device)
    rng_state = _EMPTY_RNG.get(q.device)
    if rng_state is None:
        rng_state = _EMPTY_RNG[q.device] = torch.empty(0, dtype=torch.int64, device=q.device)
    _ws, ws_ptr, ws_bytes = call.workspace(False, q.device)
    call.mod.attention_forward(
        call.code, call.params, native.describe(q), native.describe(k), native.describe(v),
        native.describe(out), native.describe(lse), call.describe_opt(call.cu_q),
        call.describe_opt(call.cu_kv), ws_ptr, ws_bytes, call.stream)
    return out, lse, rng_state, (q, k, v)


def fused_attention_backward(q, k, v, out, d_out, softmax_lse, rng_state, *, backend, qkv_format,
                             mask_type, window_size=(-1, -1), softmax_scale, dropout_p=0.0,
                             cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                             max_seqlen_kv=None, deterministic=False, pack=None):
    """(dq, dk, dv) of one native backend from the forward's out and softmax_lse. dq/dk/dv have
    the strides of q/k/v where the backend reads those in place (fresh tensors otherwise); with
    `pack` (ops/attention_packed.QKVPack) and q/k/v its views, they are the pack's views of one
    new buffer of the packed shape."""
    op = "fused_attention_backward"
    call = _Call(op, q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                 dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                 deterministic)
    cfg = call.cfg
    out_shape = tuple(q.shape[:-1]) + (cfg.head_dim_v,)
    for name, t in (("out", out), ("d_out", d_out)):
        check_tensor(op, name, t, (q.dtype,))
        if tuple(t.shape) != out_shape or t.device != q.device:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} on {t.device}; expected "
                             f"{out_shape} on {q.device}")
    check_tensor(op, "softmax_lse", softmax_lse, (torch.float32,))
    lse_shape = (cfg.batch, cfg.num_heads_q, cfg.seqlen_q)
    if tuple(softmax_lse.shape) != lse_shape:
        raise ValueError(f"{op}: softmax_lse has shape {tuple(softmax_lse.shape)}; expected "
                         f"{lse_shape}")
    q, k, v = call.set_layout(q, k, v)
    grads = _grads_like(call, (q, k, v), pack)
    if grads is None:  # the kernel writes gradients with its inputs' strides: read dense copies
        q, k, v = call.set_layout(q.contiguous(), k.contiguous(), v.contiguous())
        grads = tuple(call.alloc(t) for t in (q, k, v))
    dq, dk, dv = grads
    _ws, ws_ptr, ws_bytes = call.workspace(True, q.device)
    call.mod.attention_backward(
        call.code, call.params, native.describe(q), native.describe(k), native.describe(v),
        native.describe(out), native.describe(d_out), native.describe(softmax_lse),
        call.describe_opt(call.cu_q), call.describe_opt(call.cu_kv), native.describe(dq),
        native.describe(dk), native.describe(dv), ws_ptr, ws_bytes, call.stream)
    return dq, dk, dv


def _grads_like(call, tensors, pack):
    """dq, dk, dv with the strides of q, k, v (a packed buffer's views when `pack` holds them),
    or None when some input's strides cannot be reproduced in a fresh tensor."""
    if pack is not None:
        _, grads = pack.new_grads(call.zero_fill)
        if all(g.shape == t.shape and g.stride() == t.stride() for g, t in zip(grads, tensors)):
            return grads
    grads = []
    for t in tensors:
        g = torch.zeros_like(t) if call.zero_fill else torch.empty_like(t)  # keeps dense strides
        if g.stride() != t.stride():
            return None
        grads.append(g)
    return tuple(grads)


class FusedAttention(torch.autograd.Function):
    """Autograd over fused_attention_forward / fused_attention_backward (one native backend).
    q/k/v that are the views of one packed projection (kernels/attention_packed.py) are read in place
    and get their gradients as views of one packed buffer."""

    @staticmethod
    def forward(ctx, q, k, v, backend, qkv_format, mask_type, window_size, softmax_scale,
                dropout_p=0.0, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                max_seqlen_kv=None, deterministic=False):
        kw = dict(backend=backend, qkv_format=qkv_format, mask_type=mask_type,
                  window_size=tuple(window_size), softmax_scale=softmax_scale,
                  dropout_p=dropout_p, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                  max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                  deterministic=deterministic)
        call = _Call("FusedAttention", q, k, v, backend, qkv_format, mask_type, window_size,
                     softmax_scale, dropout_p, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                     max_seqlen_kv, deterministic)
        out, lse, rng_state, used = _forward(call, q, k, v)
        # the pack's buffer fits the gradients only if the kernel read the views themselves
        pack = pack_of(q, k, v)
        ctx.pack = pack if pack is not None and all(a is b for a, b in zip(used, (q, k, v))) else None
        ctx.save_for_backward(*used, out, lse, rng_state, cu_seqlens_q, cu_seqlens_kv)
        ctx.kw = {key: val for key, val in kw.items() if not key.startswith("cu_seqlens")}
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, rng_state, cu_q, cu_kv = ctx.saved_tensors
        dq, dk, dv = fused_attention_backward(q, k, v, out, d_out.contiguous(), lse, rng_state,
                                              cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                              pack=ctx.pack, **ctx.kw)
        return (dq, dk, dv) + (None,) * 11


@contextlib.contextmanager
def portable_kernel_variant(variant: str):
    """Within the block, the portable forward runs 'fma' (the FMA kernel, the code path AMD
    builds take) or 'auto' (tensor cores where the build maps them: NVIDIA sm_80+). Process-wide;
    for tests and benchmarks."""
    codes = {"auto": 0, "fma": 1}
    if variant not in codes:
        raise ValueError(f"portable_kernel_variant: variant is {variant!r}; expected 'auto' or 'fma'")
    mod = native.native_for_torch()
    if mod is None or not hasattr(mod, "attention_set_portable_variant"):
        yield
        return
    mod.attention_set_portable_variant(codes[variant])
    try:
        yield
    finally:
        mod.attention_set_portable_variant(0)
