"""The normalisation step of LayerNormLinear / LayerNormMLP: LayerNorm or RMSNorm, written
straight to FP8 when the recipe's scale is known before the norm runs (delayed scaling), else in
high precision and cast afterwards (current scaling needs the output's amax first)."""
from __future__ import annotations

import torch

from ..library import dispatch as K
from ..kernels.normalization import NormOutput
from ._casts import cast, cast_scale, record_scale, transposed
from ..kernels import eager
from ..kernels.normalization import norm_bwd_unchecked, norm_fwd_unchecked

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(who, normalization):
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{who}: normalization is {normalization!r}; expected 'LayerNorm' or 'RMSNorm'")


def param_for(w, x):
    """gamma/beta as the kernels take them: in x's dtype or fp32 (16-bit params of an fp32 x are
    cast)."""
    if w is None:
        return None
    return w if w.dtype in (x.dtype, torch.float32) else w.to(x.dtype)


def reset_norm_params(weight, bias, zero_centered_gamma):
    """gamma = 1 (stored as 0 with zero_centered_gamma), beta = 0."""
    with torch.no_grad():
        weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if bias is not None:
            bias.zero_()


def _direct(x2d, gamma, beta):
    """The eager native call (kernels/eager.py) when the checked op would accept these operands as
    they are (2-D contiguous x, gamma/beta in x's dtype or fp32 on its device), else None."""
    if x2d.dim() != 2 or not x2d.is_contiguous() or x2d.shape[1] < 1:
        return None
    for w in (gamma, beta):
        if w is not None and (w.dtype not in (x2d.dtype, torch.float32) or not w.is_contiguous()
                              or w.numel() != x2d.shape[1] or w.device != x2d.device):
            return None
    return eager.native_call(x2d)


def norm_hp(normalization, x2d, gamma, beta, eps, zcg):
    rms = normalization == "RMSNorm"
    nc = _direct(x2d, gamma, None if rms else beta)
    if nc is not None:
        return NormOutput(*norm_fwd_unchecked(nc, rms, x2d, gamma, beta, eps, bool(zcg)))
    return K.norm_fwd(rms, x2d, gamma, beta, eps, zcg)


def norm_fp8(normalization, x2d, gamma, beta, eps, zcg, fi, slot, need_transpose, keep_hp):
    """(norm output for the caller [HP or None], fp8 data, fp8 transpose or None, scale_inv,
    mu, rsigma)."""
    if fi.rs.delayed and not keep_hp:
        scale, amax = cast_scale(fi.rs, None, True, slot, fi.replay)
        record_scale(fi.record, scale)
        kw = dict(fp8_dtype=fi.rs.fwd_dtype, scale=scale, amax=amax)
        rms = normalization == "RMSNorm"
        nc = _direct(x2d, gamma, None if rms else beta)
        if nc is not None:
            res = NormOutput(*norm_fwd_unchecked(nc, rms, x2d, gamma, beta, eps, bool(zcg), **kw))
        else:
            res = K.norm_fwd(rms, x2d, gamma, beta, eps, zcg, **kw)
        data_t = transposed(res.out) if need_transpose else None
        return None, res.out, data_t, res.scale_inv, res.mu, res.rsigma
    res = norm_hp(normalization, x2d, gamma, beta, eps, zcg)
    data, data_t, scale_inv = cast(fi.rs, res.out, True, slot, need_transpose, fi.replay, fi.record)
    return res.out, data, data_t, scale_inv, res.mu, res.rsigma


def norm_backward(normalization, dz, x2d, mu, rsigma, gamma, zcg, dresidual=None):
    """(dx, dgamma, dbeta or None); dresidual (x2d's shape and dtype, contiguous), when given, is
    added into dx by the same kernel."""
    rms = normalization == "RMSNorm"
    nc = (_direct(x2d, gamma, None) if dz.dtype == x2d.dtype and dz.shape == x2d.shape
          and dz.is_contiguous() else None)
    if nc is not None:
        return norm_bwd_unchecked(nc, rms, dz, x2d, mu, rsigma, gamma, bool(zcg), dresidual)
    return K.norm_bwd(rms, dz, x2d, mu, rsigma, gamma, zcg, dresidual)


def norm_for_gemm(module, x2d, gamma, beta, fi, fp8, need_transpose, keep_hp, tp):
    """The norm step of LayerNormLinear / LayerNormMLP with its tensor-parallel gather (see
    _parallel.NormTP): (norm output on this rank's rows [high precision, or None when it was
    written straight to FP8], GEMM input [FP8 data or high precision, all rows], its FP8
    transpose or None, its scale_inv or None, mu, rsigma)."""
    norm, eps, zcg = module.normalization, module.eps, module.zero_centered_gamma
    if fp8 and not tp.gather:
        ln_out, q, q_t, sinv, mu, rsigma = norm_fp8(norm, x2d, gamma, beta, eps, zcg, fi, 0,
                                                    need_transpose, keep_hp)
        return ln_out, q, q_t, sinv, mu, rsigma
    res = norm_hp(norm, x2d, gamma, beta, eps, zcg)
    full = tp.gather_rows(res.out)
    if not fp8:
        return res.out, full, None, None, res.mu, res.rsigma
    # gathered rows are cast after the gather: every rank's rows with one scale
    q, q_t, sinv = cast(fi.rs, full, True, 0, need_transpose, fi.replay, fi.record)
    return res.out, q, q_t, sinv, res.mu, res.rsigma
