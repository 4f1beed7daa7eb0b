"""The normalisation step of LayerNormLinear / LayerNormMLP: LayerNorm or RMSNorm, written
straight to FP8 when the recipe's scale is known before the norm runs (delayed scaling), else in
high precision and cast afterwards (current scaling needs the output's amax first)."""
from __future__ import annotations

import torch

from ..library import dispatch as K
from ._casts import cast, cast_scale, record_scale, transposed

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(who, normalization):
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{who}: normalization is {normalization!r}; expected 'LayerNorm' or 'RMSNorm'")


def param_for(w, x):
    if w is None:
        return None
    return w if w.dtype in (x.dtype, torch.float32) else w.to(x.dtype)


def norm_hp(normalization, x2d, gamma, beta, eps, zcg):
    return K.norm_fwd(normalization == "RMSNorm", x2d, gamma, beta, eps, zcg)


def norm_fp8(normalization, x2d, gamma, beta, eps, zcg, fi, slot, need_transpose, keep_hp):
    """(norm output for the caller [HP or None], fp8 data, fp8 transpose or None, scale_inv,
    mu, rsigma)."""
    if fi.rs.delayed and not keep_hp:
        scale, amax = cast_scale(fi.rs, None, True, slot, fi.replay)
        record_scale(fi.record, scale)
        kw = dict(fp8_dtype=fi.rs.fwd_dtype, scale=scale, amax=amax)
        res = K.norm_fwd(normalization == "RMSNorm", x2d, gamma, beta, eps, zcg, **kw)
        data_t = transposed(res.out) if need_transpose else None
        return None, res.out, data_t, res.scale_inv, res.mu, res.rsigma
    res = norm_hp(normalization, x2d, gamma, beta, eps, zcg)
    data, data_t, scale_inv = cast(fi.rs, res.out, True, slot, need_transpose, fi.replay, fi.record)
    return res.out, data, data_t, scale_inv, res.mu, res.rsigma


def norm_backward(normalization, dz, x2d, mu, rsigma, gamma, zcg):
    """(dx, dgamma, dbeta or None)."""
    return K.norm_bwd(normalization == "RMSNorm", dz, x2d, mu, rsigma, gamma, zcg)
