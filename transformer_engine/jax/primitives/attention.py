"""Fused attention for JAX through the native core: XLA FFI custom calls of the cuDNN and
portable backends (csrc/bindings/jax/ffi_attention.cpp over nvte_attention_forward/backward, the
entry points PyTorch calls), differentiable with jax.custom_vjp. The dispatcher
(attention_selection.py) decides when they run; this module runs what it is told.

Dense bshd / sbhd layouts, no padding lengths (masks given as tensors go to the jnp path), GQA,
causal (top-left and bottom-right) and sliding windows as in attention.h.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .registry import _DTYPE_CODE, empty, f32, ffi, native, sds

BACKEND_CODE = {"cudnn": 1, "portable": 2}          # attention.h NVTEAttnBackend
FORMAT_CODE = {"bshd": 0, "sbhd": 1, "thd": 2}      # NVTEQKVFormat
MASK_CODE = {"no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3,
             "causal_bottom_right": 4, "padding_causal_bottom_right": 5, "arbitrary": 6}


@dataclasses.dataclass(frozen=True)
class NativeAttentionCall:
    """The static parameters of one native call (hashable: a custom_vjp non-diff argument)."""
    backend: str
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype_name: str
    qkv_format: str
    mask_type: str
    window_left: int
    window_right: int
    softmax_scale: float
    deterministic: bool
    device_index: int = 0

    def params_array(self) -> np.ndarray:
        """The handler's "params" attribute (ffi_attention.cpp's ParamIndex order)."""
        return np.array([BACKEND_CODE[self.backend], self.batch, self.num_heads_q,
                         self.num_heads_kv, self.seqlen_q, self.seqlen_kv, self.head_dim_qk,
                         self.head_dim_v, FORMAT_CODE[self.qkv_format], MASK_CODE[self.mask_type],
                         self.window_left, self.window_right, int(self.deterministic)], np.int64)

    def params_tuple(self) -> tuple:
        """The _native module's NVTEAttnParams tuple (size and support queries)."""
        return (self.batch, self.num_heads_q, self.num_heads_kv, self.seqlen_q, self.seqlen_kv,
                self.head_dim_qk, self.head_dim_v, _DTYPE_CODE[self.dtype_name],
                FORMAT_CODE[self.qkv_format], MASK_CODE[self.mask_type], self.window_left,
                self.window_right, float(self.softmax_scale), bool(self.deterministic))


@functools.lru_cache(maxsize=4096)
def native_support(call: NativeAttentionCall) -> tuple:
    """(supported, reason) from the kernel itself; ('', ...) reasons when the core lacks it."""
    mod = native()
    if mod is None or not hasattr(mod, "attention_support"):
        return False, "not built: the native core has no attention kernels"
    ok, reason = mod.attention_support(BACKEND_CODE[call.backend], call.params_tuple(),
                                       call.device_index)
    return bool(ok), reason


@functools.lru_cache(maxsize=4096)
def _workspace_bytes(call: NativeAttentionCall, backward: bool) -> int:
    return int(native().attention_workspace_size(BACKEND_CODE[call.backend], call.params_tuple(),
                                                 bool(backward), call.device_index))


def _workspace(call, backward):
    return sds((max(_workspace_bytes(call, backward), 1),), jnp.uint8)


def _lse_shape(call):
    return (call.batch, call.num_heads_q, call.seqlen_q)


def attention_forward(q, k, v, call: NativeAttentionCall):
    """(out, lse): out in q's layout with head dim head_dim_v, lse float32 [b, hq, sq]."""
    out_shape = q.shape[:-1] + (call.head_dim_v,)
    out, lse, _ = ffi("te_attention_fwd_ffi", (sds(out_shape, q.dtype), sds(_lse_shape(call), jnp.float32),
                                               _workspace(call, False)))(
        q, k, v, empty(jnp.int32), empty(jnp.int32), params=call.params_array(),
        softmax_scale=f32(call.softmax_scale))
    return out, lse


def attention_backward(q, k, v, out, d_out, lse, call: NativeAttentionCall):
    dq, dk, dv, _ = ffi("te_attention_bwd_ffi", (sds(q.shape, q.dtype), sds(k.shape, k.dtype),
                                                 sds(v.shape, v.dtype), _workspace(call, True)))(
        q, k, v, out, d_out.astype(q.dtype), lse, empty(jnp.int32), empty(jnp.int32),
        params=call.params_array(), softmax_scale=f32(call.softmax_scale))
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def native_attention(q, k, v, call: NativeAttentionCall):
    """Differentiable fused attention of call.backend; q/k/v in call.qkv_format."""
    return attention_forward(q, k, v, call)[0]


def _native_attention_fwd(q, k, v, call):
    out, lse = attention_forward(q, k, v, call)
    return out, (q, k, v, out, lse)


def _native_attention_bwd(call, res, d_out):
    q, k, v, out, lse = res
    return attention_backward(q, k, v, out, d_out, lse, call)


native_attention.defvjp(_native_attention_fwd, _native_attention_bwd)
