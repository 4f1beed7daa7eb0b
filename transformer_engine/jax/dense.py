"""dense: y = x @ kernel (+ bias) with FP8 under fp8_autocast, usable without Flax.

x [..., k], kernel [k, m], bias [m] or None. High precision: three GEMMs (fprop NN, dgrad TN,
wgrad NT) through the GEMM primitive, in a jax.custom_vjp. FP8: x, kernel and the output
gradient are cast with their transposed copies (cast_transpose) so that every FP8 GEMM is TN,
the layout Hopper's FP8 tensor cores take; scales come from the FP8 metadata (delayed scaling,
updated in the VJP, see transformer_engine.jax.fp8) or from the tensors themselves (current
scaling). FP8 GEMMs need the token count, k and m to be multiples of 16: other sizes run in
high precision."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from . import fp8 as fp8_mod
from .primitives.cast import cast_transpose
from .primitives.gemm import general_gemm


@jax.custom_vjp
def _dense_hp(x2, kernel, bias):
    return general_gemm(kernel, x2, x2.dtype, layout="NN", bias=bias).out


def _dense_hp_fwd(x2, kernel, bias):
    return _dense_hp(x2, kernel, bias), (x2, kernel, bias)


def _dbias(dy, bias):
    return None if bias is None else jnp.sum(dy.astype(jnp.float32), axis=0).astype(bias.dtype)


def _dense_hp_bwd(res, dy):
    x2, kernel, bias = res
    dy = dy.astype(x2.dtype)
    dx = general_gemm(kernel, dy, x2.dtype, layout="TN").out
    dw = general_gemm(dy, x2, x2.dtype, layout="NT").out
    return dx, dw.astype(kernel.dtype), _dbias(dy, bias)


_dense_hp.defvjp(_dense_hp_fwd, _dense_hp_bwd)


def _scales(cfg, scale, x2, kernel):
    if cfg.delayed:
        return scale[fp8_mod.INPUT], scale[fp8_mod.KERNEL]
    last = (None, None) if scale is None else (scale[fp8_mod.INPUT], scale[fp8_mod.KERNEL])
    return (fp8_mod.current_scale(x2, cfg.fwd_max, cfg.power_2_scales, last[0]),
            fp8_mod.current_scale(kernel, cfg.fwd_max, cfg.power_2_scales, last[1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _dense_fp8(x2, kernel, bias, amax_history, scale, skipped, cfg):
    return _dense_fp8_fwd(x2, kernel, bias, amax_history, scale, skipped, cfg)[0]


def _dense_fp8_fwd(x2, kernel, bias, amax_history, scale, skipped, cfg):
    sx, sw = _scales(cfg, scale, x2, kernel)
    xq, xq_t, x_si, x_amax = cast_transpose(x2, sx, cfg.fwd_dtype)
    wq, wq_t, w_si, w_amax = cast_transpose(kernel.astype(x2.dtype), sw, cfg.fwd_dtype)
    out = general_gemm(wq_t, xq, x2.dtype, layout="TN", A_scale_inv=w_si, B_scale_inv=x_si,
                       bias=bias).out
    # residuals must be arrays: empty ones carry the dtypes of x and kernel
    res = (xq_t, wq, x_si, w_si, x_amax, w_amax, amax_history, scale, skipped, bias,
           jnp.zeros((0,), x2.dtype), jnp.zeros((0,), kernel.dtype), jnp.stack([sx, sw]))
    return out, res


def _dense_fp8_bwd(cfg, res, dy):
    xq_t, wq, x_si, w_si, x_amax, w_amax, amax_history, scale, skipped, bias, x_like, k_like, \
        fwd_scales = res
    x_dtype, k_dtype = x_like.dtype, k_like.dtype
    dy = dy.astype(x_dtype)
    sg = scale[fp8_mod.GRAD] if cfg.delayed else fp8_mod.current_scale(
        dy, cfg.bwd_max, cfg.power_2_scales, None if scale is None else scale[fp8_mod.GRAD])
    gq, gq_t, g_si, g_amax = cast_transpose(dy, sg, cfg.bwd_dtype)
    dx = general_gemm(wq, gq, x_dtype, layout="TN", A_scale_inv=w_si, B_scale_inv=g_si).out
    dw = general_gemm(gq_t, xq_t, jnp.float32, layout="TN", A_scale_inv=g_si,
                      B_scale_inv=x_si).out
    amaxes = jnp.concatenate([x_amax, w_amax, g_amax])
    d_hist = d_scale = None
    if cfg.delayed:
        d_hist, d_scale, d_skipped = fp8_mod.updated_fp8_meta(cfg, amax_history, scale, amaxes,
                                                              skipped)
    else:
        # current scaling's state: the scales just used, which are the last finite ones
        if scale is not None:
            d_scale = jnp.concatenate([fwd_scales, jnp.reshape(sg, (1,))])
        d_skipped = fp8_mod.counted_skips(skipped, amaxes)
    return dx, dw.astype(k_dtype), _dbias(dy, bias), d_hist, d_scale, d_skipped


_dense_fp8.defvjp(_dense_fp8_fwd, _dense_fp8_bwd)


@jax.custom_vjp
def _keep_fp8_meta(out, fp8_meta):
    return out


def _keep_fp8_meta_fwd(out, fp8_meta):
    return out, fp8_meta


def _keep_fp8_meta_bwd(fp8_meta, dy):
    # a step that ran in high precision (sizes unfit for FP8) hands the FP8 state on unchanged:
    # without this its "gradient", the next step's state, would be zeros
    return dy, fp8_meta


_keep_fp8_meta.defvjp(_keep_fp8_meta_fwd, _keep_fp8_meta_bwd)


def fp8_gemm_fits(tokens: int, k: int, m: int) -> bool:
    return tokens > 0 and all(d % 16 == 0 for d in (tokens, k, m))


def _unpack_fp8_meta(fp8_meta):
    """(amax_history, scale, skipped_updates) of a 2- or 3-tuple (or Nones)."""
    if fp8_meta is None:
        return None, None, None
    if not isinstance(fp8_meta, (tuple, list)) or len(fp8_meta) not in (2, 3):
        raise ValueError(f"dense: fp8_meta must be a tuple (amax_history, scale[, "
                         f"skipped_updates]), got {type(fp8_meta).__name__}")
    return tuple(fp8_meta) + (None,) * (3 - len(fp8_meta))


def dense(x, kernel, bias=None, fp8_meta=None):
    """``x @ kernel (+ bias)``, in FP8 under :func:`fp8_autocast`; differentiable.

    FP8 runs through XLA FFI custom calls on NVIDIA sm_89+ and AMD gfx942/gfx950 and as jnp code on
    the CPU (emulated, the same numerics). FP8 is used when the token count (the product of ``x``'s
    leading dimensions) and both
    sizes of ``kernel`` are multiples of 16; otherwise the GEMM runs in ``x``'s dtype.

    Parameters
    ----------
    x : jax.Array
        Input ``[..., k]``: float32, bfloat16 or float16.
    kernel : jax.Array
        Weight ``[k, m]``, cast to ``x``'s dtype.
    bias : jax.Array, optional
        Bias ``[m]``.
    fp8_meta : tuple of jax.Array, optional
        ``(amax_history, scale, skipped_updates)``: the FP8 state of the input, kernel and output
        gradient, as the Flax modules keep it in the ``FP8_COLLECTION`` variables.
        ``amax_history`` ``[history_len, 3]`` and ``scale`` ``[3]`` are required under delayed
        scaling; under current scaling ``amax_history`` is unused (``None``) and ``scale`` is
        optional: each tensor's last finite scale, used when its amax is NaN or infinite (without
        it such a tensor is cast with scale 1). ``skipped_updates`` ``[3]`` (float32, optional;
        the tuple may have two elements) counts the steps skipped for a non-finite amax.
        Ignored outside FP8. The updated state is the gradient of ``fp8_meta``.

    Returns
    -------
    jax.Array
        ``[..., m]`` in ``x``'s dtype.
    """
    if kernel.ndim != 2 or x.ndim < 1 or x.shape[-1] != kernel.shape[0]:
        raise ValueError(f"dense: x {x.shape} and kernel {kernel.shape}; expected x [..., k] and "
                         f"kernel [k, m]")
    if bias is not None and bias.shape != (kernel.shape[1],):
        raise ValueError(f"dense: bias has shape {bias.shape}; expected ({kernel.shape[1]},)")
    lead = x.shape[:-1]
    k, m = kernel.shape
    x2 = x.reshape(math.prod(lead), k)
    kernel = kernel.astype(x.dtype)
    cfg = fp8_mod.current_fp8_config()
    amax_history, scale, skipped = _unpack_fp8_meta(fp8_meta)
    if cfg is not None and fp8_gemm_fits(x2.shape[0], k, m):
        if cfg.delayed and (amax_history is None or scale is None):
            raise ValueError("dense: delayed scaling needs fp8_meta=(amax_history, scale[, "
                             "skipped_updates]) (the Flax modules provide it)")
        out = _dense_fp8(x2, kernel, bias, amax_history if cfg.delayed else None, scale,
                         skipped, cfg)
    else:
        out = _dense_hp(x2, kernel, bias)
        if cfg is not None and fp8_meta is not None:
            out = _keep_fp8_meta(out, (amax_history, scale, skipped))
    return out.reshape(lead + (m,))


@jax.custom_vjp
def _gelu_mlp_hp(x2, k1, b1, k2, b2):
    return _gelu_mlp_hp_fwd(x2, k1, b1, k2, b2)[0]


def _gelu_mlp_hp_fwd(x2, k1, b1, k2, b2):
    # GELU (and fc1's bias) in fc1's GEMM epilogue, which also keeps the pre-activation.
    fc1 = general_gemm(k1, x2, x2.dtype, layout="NN", bias=b1, gelu=True)
    out = general_gemm(k2, fc1.out, x2.dtype, layout="NN", bias=b2).out
    return out, (x2, k1, b1, k2, b2, fc1.out, fc1.gelu_input)


def _gelu_mlp_hp_bwd(res, dy):
    x2, k1, b1, k2, b2, act, pre = res
    dy = dy.astype(x2.dtype)
    # fc2's dgrad with dGELU (and fc1's bias gradient) in its epilogue: the gradient of the
    # pre-activation in one GEMM, no separate activation-backward pass.
    dpre = general_gemm(k2, dy, x2.dtype, layout="TN", gelu_input=pre, bias_grad=b1 is not None)
    dk2 = general_gemm(dy, act, x2.dtype, layout="NT").out
    dx = general_gemm(k1, dpre.out, x2.dtype, layout="TN").out
    dk1 = general_gemm(dpre.out, x2, x2.dtype, layout="NT").out
    db1 = None if b1 is None else dpre.bias_grad.astype(b1.dtype)
    return dx, dk1.astype(k1.dtype), db1, dk2.astype(k2.dtype), _dbias(dy, b2)


_gelu_mlp_hp.defvjp(_gelu_mlp_hp_fwd, _gelu_mlp_hp_bwd)


def fused_gelu_mlp(x, k1, b1, k2, b2):
    """fc2(gelu(fc1(x))) (tanh GELU) in high precision with the GELU in the GEMM epilogues,
    or None when this form does not apply (FP8 autocast on: the FP8 path composes dense)."""
    if fp8_mod.current_fp8_config() is not None:
        return None
    lead = x.shape[:-1]
    x2 = x.reshape(math.prod(lead), x.shape[-1])
    out = _gelu_mlp_hp(x2, k1.astype(x.dtype), b1, k2.astype(x.dtype), b2)
    return out.reshape(lead + (k2.shape[1],))
