"""The Linear step on the eager native path: y = x @ W.T (+ b) (+ residual) and its gradients in
one native call per direction (csrc/bindings/linear_step.cpp), in FP8 or high precision.

FP8: a native plan (LinearFp8Plan: shapes, dtypes, the recipe state's scaling pointers, flags,
workspace size and the layout of the step's buffers) is made once per problem and kept on the
recipe state; a call allocates the arenas the plan asks for, passes their addresses and gets the
tensors back. Everything here is unchecked: the module has checked shapes and dtypes, and the
plan refuses what it was not made for. The kernels, their order and their bits are those of the
checked ops (kernels/cast.py, kernels/gemm.py), which serve torch.compile, checkpoint recompute
and the reference backend.
"""
from __future__ import annotations

import torch

from .. import native
from .eager import arena, call_scratch, region_view, step_grads

_CODE = native.DTYPE_CODE
_MAX_PLANS = 64  # per recipe state: varying token counts make new plans; keep the table small


class Fp8Plan:
    """A native LinearFp8Plan with the fields the calls read kept as Python attributes (reading a
    bound C++ field costs several times a slot's host time), and its forward / backward."""
    __slots__ = ("native", "tokens", "in_features", "out_features", "fresh_w", "need_dgrad",
                 "need_wgrad", "dbias_in_cast", "kept_bytes", "forward_scratch_bytes",
                 "backward_scratch_bytes", "forward", "backward", "backward_fp8_grad")

    def __init__(self, plan):
        self.native = plan
        for name in self.__slots__[1:-3]:
            setattr(self, name, getattr(plan, name))
        self.forward, self.backward = plan.forward, plan.backward
        self.backward_fp8_grad = plan.backward_fp8_grad


def fp8_plan(nc, rs, key):
    """The plan of key = (tokens, in_features, out_features, dtype, w_dtype, wq_dtype, fresh_w,
    need_dgrad, need_wgrad, dbias_dtype), made on first use and kept on the recipe state rs
    (whose scaling pointers it holds). dtypes are torch dtypes; w_dtype is the high-precision
    weight's (fresh_w: cast by the forward), wq_dtype its FP8 data's; dbias_dtype None: dy's
    cast makes no bias gradient."""
    plans = rs.step_plans
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plan = plans[key] = Fp8Plan(_make_plan(nc, rs, *key))
    return plan


def _make_plan(nc, rs, tokens, in_features, out_features, dtype, w_dtype, wq_dtype, fresh_w,
               need_dgrad, need_wgrad, dbias_dtype):
    return nc.mod.LinearFp8Plan(
        tokens, in_features, out_features, _CODE[dtype], _CODE[w_dtype], _CODE[wq_dtype],
        _CODE[rs.fwd_dtype], _CODE[rs.bwd_dtype], fresh_w, need_dgrad, need_wgrad,
        _CODE[dbias_dtype] if dbias_dtype is not None else -1, rs.delayed, rs.ptrs_fwd,
        rs.ptrs_bwd)


def fp8_forward(nc, plan, x2d, w, w_sinv, bias, residual, dtype):
    """(y, kept): y = x2d @ W.T (+ bias) (+ residual) in FP8 through plan.forward. w: the
    high-precision weight when the plan casts it (fresh_w), else its FP8 data with w_sinv.
    kept: the one buffer that holds what the backward reads (saved_operands gives its tensors);
    the FP8 data that only this call's GEMM reads lives in the call's scratch."""
    kept = arena(plan.kept_bytes, x2d.device)
    scratch = call_scratch(nc, plan.forward_scratch_bytes)
    y = torch.empty(plan.tokens, plan.out_features, dtype=dtype, device=x2d.device)
    # addresses inline (a helper call per address would cost host time on every step)
    plan.forward(x2d.data_ptr(), w.data_ptr(), w_sinv.data_ptr() if w_sinv is not None else 0,
                 kept.data_ptr(), scratch.data_ptr(), y.data_ptr(),
                 bias.data_ptr() if bias is not None else 0,
                 residual.data_ptr() if residual is not None else 0, nc.env)
    return y, kept


def saved_operands(plan, kept, wq_t, w_sinv, fp8_dtype):
    """(xq_t, x_sinv, wq_t, w_sinv) of a forward as tensors: views of its kept buffer where the
    plan put them there, else the tensors given (the checked backward needs tensor objects)."""
    regions = plan.native.regions
    views = {}
    for name in ("x_t", "x_sinv", "w_t", "w_sinv"):
        r = regions.get(name)
        if r is not None:
            _, offset, shape, code = r
            views[name] = region_view(kept, offset, shape,
                                      torch.float32 if code == _CODE[torch.float32] else fp8_dtype)
    if plan.fresh_w:
        wq_t, w_sinv = views.get("w_t"), views["w_sinv"]
    return views.get("x_t"), views["x_sinv"], wq_t, w_sinv


def _fp8_grads(plan, device, dtype, bias_dtype, main_grad):
    """(dx, dw, db) buffers of an FP8 backward: dx when the plan makes it, dw when it makes it and
    main_grad is None, db when dy's cast sums it (of bias_dtype)."""
    tokens, in_features, out_features = plan.tokens, plan.in_features, plan.out_features
    own_dw = plan.need_wgrad and main_grad is None
    want_db = plan.dbias_in_cast
    if bias_dtype in (None, dtype):
        return step_grads(device, dtype, (
            (tokens, in_features) if plan.need_dgrad else None,
            (out_features, in_features) if own_dw else None,
            (out_features,) if want_db else None))
    dx, dw = step_grads(device, dtype, (
        (tokens, in_features) if plan.need_dgrad else None,
        (out_features, in_features) if own_dw else None))
    db = torch.empty(out_features, dtype=bias_dtype, device=device) if want_db else None
    return dx, dw, db


def fp8_backward(nc, plan, dy, saved, dtype, bias_dtype, main_grad, update):
    """(dx, dw, db) of an FP8 step through plan.backward. saved: (kept, xq_t, x_sinv, wq_t,
    w_sinv), kept None when a checked forward saved tensors (the others are then used). dx when
    the plan makes it, dw when it makes it and main_grad is None (else accumulated into
    main_grad, dw None), db when dy's cast sums it. update: the step's final delayed-scaling
    update (or None), launched by this call. dy's FP8 data, transpose, scale_inv and the
    bias-gradient workspace live in the call's scratch."""
    kept, xq_t, x_sinv, wq_t, w_sinv = saved
    dx, dw, db = _fp8_grads(plan, dy.device, dtype, bias_dtype, main_grad)
    out = main_grad if main_grad is not None else dw
    scratch = call_scratch(nc, plan.backward_scratch_bytes)
    if kept is not None:  # the forward's operands in its kept buffer (W's as given if not there)
        x_operands = (kept.data_ptr(), 0, 0)
    else:
        x_operands = (0, xq_t.data_ptr() if xq_t is not None else 0, x_sinv.data_ptr())
    plan.backward(dy.data_ptr(), *x_operands, wq_t.data_ptr() if wq_t is not None else 0,
                  w_sinv.data_ptr() if w_sinv is not None else 0, scratch.data_ptr(),
                  dx.data_ptr() if dx is not None else 0,
                  out.data_ptr() if out is not None else 0,
                  _CODE[out.dtype] if out is not None else 0,
                  1.0 if main_grad is not None else 0.0, db.data_ptr() if db is not None else 0,
                  nc.env, update)
    return dx, dw, db


def fp8_backward_fp8_grad(nc, plan, dyq, dyq_t, dy_sinv, saved, dtype, main_grad, update):
    """(dx, dw) of an FP8 step whose output gradient is already in FP8 (dyq, its transpose dyq_t
    when the plan makes dw, scale_inv dy_sinv: cast by the kernel that made it) through
    plan.backward_fp8_grad: dgrad, then wgrad, then update (or None). saved: (xq_t, x_sinv, wq_t,
    w_sinv) as tensors; dx, dw and main_grad as in fp8_backward. The plan is made without a
    bias gradient (dbias_dtype None)."""
    xq_t, x_sinv, wq_t, w_sinv = saved
    dx, dw, _ = _fp8_grads(plan, dyq.device, dtype, None, main_grad)
    out = main_grad if main_grad is not None else dw
    plan.backward_fp8_grad(
        dyq.data_ptr(), dyq_t.data_ptr() if dyq_t is not None else 0, dy_sinv.data_ptr(),
        xq_t.data_ptr() if xq_t is not None else 0, x_sinv.data_ptr() if x_sinv is not None else 0,
        wq_t.data_ptr() if wq_t is not None else 0, w_sinv.data_ptr() if w_sinv is not None else 0,
        dx.data_ptr() if dx is not None else 0, out.data_ptr() if out is not None else 0,
        _CODE[out.dtype] if out is not None else 0, 1.0 if main_grad is not None else 0.0,
        nc.env, update)
    return dx, dw


def hp_forward(nc, x2d, w, bias, residual, dtype):
    """y = x2d @ w.T (+ bias) (+ residual) in high precision (dtype: x2d's, w's, the bias's and
    the residual's) through one native call (linear_hp_forward)."""
    tokens, in_features = x2d.shape
    out_features = w.shape[0]
    y = torch.empty(tokens, out_features, dtype=dtype, device=x2d.device)
    code = _CODE[dtype]
    nc.mod.linear_hp_forward(x2d.data_ptr(), tokens, in_features, w.data_ptr(), out_features, code,
                             y.data_ptr(), bias.data_ptr() if bias is not None else 0, code,
                             residual.data_ptr() if residual is not None else 0, nc.env)
    return y


def hp_backward(nc, dy, x2d, w, in_features, dtype, need_dgrad, own_dw, bias_dtype, db_in_wgrad):
    """(dx or None, dw or None, db or None) in high precision through one native call
    (linear_hp_backward): dgrad (w: the weight), then wgrad (x2d: the input; own_dw: into a new
    dw), and the bias gradient
    (bias_dtype not None) in the wgrad GEMM's epilogue when db_in_wgrad, else by the column-sum
    kernels ahead of the GEMMs."""
    tokens, out_features = dy.shape
    db_shared = bias_dtype == dtype
    dx, dw, db = step_grads(dy.device, dtype, (
        (tokens, in_features) if need_dgrad else None,
        (out_features, in_features) if own_dw else None,
        (out_features,) if db_shared else None))
    if bias_dtype is not None and db is None:  # a bias of another dtype than the compute dtype
        db = torch.empty(out_features, dtype=bias_dtype, device=dy.device)
    code = _CODE[dtype]
    nc.mod.linear_hp_backward(
        dy.data_ptr(), tokens, out_features, in_features, code,
        w.data_ptr() if dx is not None else 0, dx.data_ptr() if dx is not None else 0,
        x2d.data_ptr() if dw is not None else 0, dw.data_ptr() if dw is not None else 0,
        db.data_ptr() if db is not None else 0, _CODE[db.dtype] if db is not None else code,
        db_in_wgrad, nc.env)
    return dx, dw, db
