"""The FP8 backward of a module's GEMM on the eager native path, through the Linear step's native
plan (kernels/linear_step.py): te.Linear, LayerNormLinear and both GEMMs of LayerNormMLP let the
plan order the output gradient's cast (with the bias gradient), dgrad, wgrad and the step's
delayed-scaling update, in one native call per GEMM. The forward's FP8 operands come as tensors
(the norm or the activation made them). The checked ops (library/cast.py, library/gemm.py) make
the same bits and serve whatever the plan does not: torch.compile, delay_wgrad_compute (its wgrad
GEMM runs later) and a tensor-parallel backward (its reduction starts between dgrad and wgrad)."""
from __future__ import annotations

from ..kernels import eager, linear_step
from ..library.activation import bias_grad_of
from ..library.gemm import wgrad_out
from . import wgrad as _wgrad


def main_grad_of(who: str, weight):
    """weight.main_grad, the buffer that the plan's wgrad GEMM adds into (checked by
    library/gemm.wgrad_out: the weight's shape, contiguous, on its device)."""
    return wgrad_out(weight, True, who)[0]


def given_operands_plan(nc, rs, tokens, in_features, out_features, dtype, wq_t, need_dgrad,
                        need_wgrad, db_dtype):
    """The plan of a backward whose forward did not run one (its operands come as tensors):
    the weight's FP8 data given, not cast (fresh_w False)."""
    wq_dtype = wq_t.dtype if wq_t is not None else rs.fwd_dtype
    return linear_step.fp8_plan(nc, rs, (tokens, in_features, out_features, dtype, wq_dtype,
                                         wq_dtype, False, need_dgrad, need_wgrad, db_dtype))


def plan_call(fi, dy, tp, delay_wgrad: bool):
    """The NativeCall for a norm module's FP8 backward through the plan, or None: the checked
    ops serve a delayed weight gradient (queued for backward_dw, the plan makes it now) and an
    active tensor-parallel layout (its reduction of the norm output's gradient starts after
    dgrad and runs under the wgrad GEMMs, which one native call cannot interleave)."""
    if delay_wgrad or tp.active or not eager.usable_backward(fi):
        return None
    return eager.native_call(dy)


def final_update(fi, last: bool):
    """The step's delayed-scaling update for the native call that ends this backward (last),
    else None (see quantization._Step.take_final_update)."""
    step = fi.step
    return step.take_final_update() if last and step is not None else None


def fp8_backward(who, nc, fi, dy, operands, shape, dtype, bias_dtype, need_dgrad, need_wgrad,
                 weight, fuse, last):
    """(dx, dw as autograd receives it, db) of an FP8 GEMM from its high-precision output
    gradient dy [tokens, out]: dy's cast (with the bias gradient when there is a weight gradient
    too), dgrad, wgrad (into main_grad when fuse), in one native call. operands: the forward's
    (xq_t, x_sinv, wq_t, w_sinv); shape: the weight's (out, in); bias_dtype: the bias gradient's
    dtype, or None for none; last: this call ends the module's backward kernels and launches
    the step's update."""
    out_features, in_features = shape
    xq_t, x_sinv, wq_t, w_sinv = operands
    db = None
    if bias_dtype is not None and not need_wgrad:  # dy's cast without a transpose sums nothing
        db = bias_grad_of(dy, bias_dtype)
    db_dtype = bias_dtype if need_wgrad else None
    plan = given_operands_plan(nc, fi.rs, dy.shape[0], in_features, out_features, dtype, wq_t,
                               need_dgrad, need_wgrad, db_dtype)
    main_grad = main_grad_of(who, weight) if need_wgrad and fuse else None
    dx, dw, fused_db = linear_step.fp8_backward(nc, plan, dy, (None, xq_t, x_sinv, wq_t, w_sinv),
                                                dtype, bias_dtype, main_grad,
                                                final_update(fi, last))
    dw = _wgrad.autograd_weight_grad(weight, dw, fuse) if need_wgrad else None
    return dx, dw, (fused_db if db is None else db)


def fp8_backward_fp8_grad(who, nc, fi, grad, operands, shape, dtype, need_dgrad, need_wgrad,
                          weight, fuse, last):
    """(dx, dw as autograd receives it) of an FP8 GEMM whose output gradient the caller already
    cast: grad = (dyq, dyq_t or None, dy_sinv); dgrad, then wgrad, in one native call. operands,
    shape, fuse and last as in fp8_backward."""
    out_features, in_features = shape
    dyq, dyq_t, dy_sinv = grad
    plan = given_operands_plan(nc, fi.rs, dyq.shape[0], in_features, out_features, dtype,
                               operands[2], need_dgrad, need_wgrad, None)
    main_grad = main_grad_of(who, weight) if need_wgrad and fuse else None
    dx, dw = linear_step.fp8_backward_fp8_grad(nc, plan, dyq, dyq_t, dy_sinv, operands, dtype,
                                               main_grad, final_update(fi, last))
    dw = _wgrad.autograd_weight_grad(weight, dw, fuse) if need_wgrad else None
    return dx, dw
