"""The normalisation step of LayerNormLinear / LayerNormMLP, the chooser of the normalization
family: LayerNorm or RMSNorm, written straight to FP8 when the recipe's scale is known before the
norm runs (delayed scaling), else in high precision and cast afterwards (current scaling needs
the output's amax first). In eager mode on the native core the unchecked calls of
kernels/normalization.py run; otherwise the checked ops (dispatch)."""
from __future__ import annotations

import torch

from . import dispatch as K
from .cast import cast, cast_scale, record_scale, transposed
from ..kernels import eager
from ..kernels.normalization import NormOutput, norm_bwd_unchecked, norm_fwd_unchecked


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


def norm_fp8(normalization, x2d, gamma, beta, eps, zcg, fi, slot, need_transpose, keep_hp,
             amax_group=None):
    """(norm output for the caller [HP or None], fp8 data, fp8 transpose or None, scale_inv,
    mu, rsigma). amax_group (current scaling): x2d is this rank's rows of a sequence split over
    that group, and the output's scale is the whole sequence's."""
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
    data, data_t, scale_inv = cast(fi.rs, res.out, True, slot, need_transpose, fi.replay, fi.record,
                                   amax_group=amax_group)
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
