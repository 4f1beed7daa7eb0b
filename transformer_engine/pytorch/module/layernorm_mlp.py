"""te.LayerNormMLP: y = FC2(act(FC1(norm(x)))) as one autograd Function.

FP8 forward: norm straight to FP8 (delayed scaling), FC1 GEMM with the bias epilogue, the
activation kernel writing FP8 and its transpose for FC2's wgrad in one pass (delayed scaling;
current scaling needs the activation's amax first: activation, then cast+transpose), FC2 GEMM
with bias. Backward: dy cast+transposed with FC2's bias gradient in one pass, FC2 dgrad, then
one kernel for dact + FC1's bias gradient + FP8 cast + transpose (delayed scaling), FC1
dgrad/wgrad, norm backward. High precision GELU runs FC1 with the GELU epilogue (its aux output
is the saved pre-activation). On the native core in eager mode these run as the unchecked calls
of kernels/<family>.py, each GEMM's FP8 backward as one call of the Linear step's plan
(module_parts/fp8_step_backward.py); the checked ops serve torch.compile, checkpoint recompute
and the reference."""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .. import quantization as q
from ..checkpoint import checkpoint as _checkpoint
from ..kernels.activation import (ACTIVATIONS, CLAMPED_SWIGLU, GATED, clamped_swiglu_backward,
                                  clamped_swiglu_forward, clamped_swiglu_params)
from ..library import dispatch as K
from ..library import gemm as _gemms
from ..library.activation import (act_cast_transpose, activation_fp8, bias_grad_of,
                                  dact_cast_transpose, dbias_dactivation_fp8)
from ..library.cast import cast, cast_grad, cast_scale, record_amax, record_scale, transposed
from ..library.normalization import norm_backward
from ..module_parts import (blockwise as _blockwise, fp8_step_backward as _fp8_step,
                           parallel as _parallel, wgrad as _wgrad)
from ..module_parts.input_check import check_fp8_dims, check_on_input_device
from ..module_parts.norm_args import check_normalization, param_for, reset_norm_params
from ..module_parts.nv_options import check_off
from ..module_parts.gather_gemm import (PendingRows, fp8_blocks_fit, gemm_over_gather,
                                        gemm_reduce_scatter, start_gather_rows)
from ..module_parts import side_stream, weight_cast_beside
from ..module_parts.sequence_parallel_fp8 import (PendingFP8Rows, arrived, fp8_gather_applies,
                                                   gather_fp8_grad)
from .base import (TransformerEngineBaseModule, default_device, default_init_method, fp8_weight,
                   hp_weight)
from .layernorm_linear import norm_for_gemm

SUPPORTED_ACTIVATIONS = tuple(ACTIVATIONS) + tuple(GATED) + (CLAMPED_SWIGLU,)


def _gated(act: str) -> bool:
    """Whether FC1 makes 2N columns for the activation (gated forms, clamped SwiGLU)."""
    return act in GATED or act == CLAMPED_SWIGLU


# Clamped SwiGLU carries run-time parameters (limit, alpha) that the fused kernels of the other
# activations do not take: it runs its own kernels (activation with an FP8 output, then a
# transpose; backward, then the cast), through these two helpers.
def _act_forward(module, h, fp8_dtype=None, scale=None, amax=None):
    if module.activation == CLAMPED_SWIGLU:
        return clamped_swiglu_forward(h, *module._clamp_params, fp8_dtype, scale, amax)
    if fp8_dtype is None:
        return K.activation_forward(h, module.activation)
    return K.activation_forward(h, module.activation, fp8_dtype, scale, amax)


def _act_backward(module, da, h):
    if module.activation == CLAMPED_SWIGLU:
        return clamped_swiglu_backward(da, h, *module._clamp_params)
    return K.activation_backward(da, h, module.activation)


def _act_fp8(module, fi, h, activation, slot):
    """(fp8 activation output, scale_inv): the activation kernel casts as it writes (delayed),
    or high precision then cast (current scaling needs the amax first)."""
    if fi.rs.delayed:
        scale, amax = cast_scale(fi.rs, None, True, slot, fi.replay)
        record_scale(fi.record, scale)
        if activation != CLAMPED_SWIGLU:
            return activation_fp8(h, activation, fi.rs.fwd_dtype, scale, amax)
        return _act_forward(module, h, fi.rs.fwd_dtype, scale, amax)
    a = _act_forward(module, h)
    data, _, scale_inv = cast(fi.rs, a, True, slot, False, fi.replay, fi.record)
    return data, scale_inv


def _forward_fp8(module, fi, x2d, g, b, w1, b1, w2, b2, dtype, is_first_microbatch, need, tp,
                 residual):
    act = module.activation
    def cast_w1():
        return fp8_weight(module, w1, fi, 1, need["dgrad"], is_first_microbatch)
    w1_8 = weight_cast_beside.cast_first(module, 1, cast_w1)
    ln_out, lnq, lnq_t, ln_sinv, mu, rsigma = norm_for_gemm(
        module, x2d, g, b, fi, True, need["w1"], module.return_layernorm_output, tp)
    w1q, w1q_t, w1_sinv = w1_8 or cast_w1()
    if isinstance(lnq, PendingFP8Rows) and fp8_blocks_fit(lnq):
        # a sequence-parallel FP8 gather goes on under this rank's block of FC1 (gather_gemm.py)
        h = torch.empty((lnq.data.shape[0], w1q.shape[0]), dtype=dtype, device=x2d.device)
        lnq, lnq_t = gemm_over_gather(lnq, (h,), lambda rows, o: _gemms.fprop_fp8(
            w1q, w1_sinv, rows, ln_sinv, dtype, b1, out=o[0]))
    else:
        lnq, lnq_t = arrived(lnq, lnq_t)
        h = _gemms.fprop_fp8(w1q, w1_sinv, lnq, ln_sinv, dtype, b1).out
    # activation, FP8 cast and FC2-wgrad transpose in one pass where the eager path serves it
    fused = act_cast_transpose(fi, h, act, 2) if need["w2"] else None
    if fused is not None:
        aq, aq_t, a_sinv = fused
    else:
        aq, a_sinv = _act_fp8(module, fi, h, act, 2)
        aq_t = transposed(aq) if need["w2"] else None
    # FC2's transposed weight serves the backward's FC2 dgrad
    w2q, w2q_t, w2_sinv = fp8_weight(module, w2, fi, 3, need["fc1"], is_first_microbatch)
    # the module's last forward cast: the step's forward update may start from here
    q.forward_casts_done(fi.step, x2d.device)
    if tp.gather:  # this rank's rows of the reduce-scattered FC2 output (gather_gemm.py), its
        # bias and residual added by the GEMM of this rank's block
        y = gemm_reduce_scatter(aq, tp, w2q.shape[0], dtype, lambda rows, o, bias, res: (
            _gemms.fprop_fp8(w2q, w2_sinv, rows, a_sinv, dtype, bias, addend=res, out=o)),
            block_multiple=16, bias=b2, addend=residual)
    else:
        y = _gemms.fprop_fp8(w2q, w2_sinv, aq, a_sinv, dtype, b2, addend=residual).out
    saved = (x2d, mu, rsigma, g, lnq_t, ln_sinv, w1q_t, w1_sinv, h, aq_t, a_sinv, w2q_t, w2_sinv)
    return y, ln_out, saved


def _forward_hp(module, fi, x2d, g, b, w1, b1, w2, b2, dtype, tp, residual):
    act = module.activation
    ln_out, ln_full, _, _, mu, rsigma = norm_for_gemm(module, x2d, g, b, fi, False, False, True, tp)
    w1, w2 = hp_weight(w1, dtype), hp_weight(w2, dtype)
    if isinstance(ln_full, PendingRows):
        # the sequence-parallel gather goes on under this rank's block of FC1 (gather_gemm.py);
        # the blocks write one buffer, so the activation runs after them, not in the epilogue
        h = torch.empty((ln_full.data.shape[0], w1.shape[0]), dtype=dtype, device=x2d.device)
        ln_full = gemm_over_gather(ln_full, (h,), lambda rows, o: _gemms.fprop_hp(
            w1, rows, b1, out=o[0]))
        a = _act_forward(module, h)
    elif act == "gelu":
        r = K.general_gemm(w1, ln_full, layout="TN", bias=b1, gelu=True)
        a, h = r.out, r.gelu_input
    else:
        h = _gemms.fprop_hp(w1, ln_full, b1)
        a = _act_forward(module, h)
    if fi.calibrating:
        for slot, t in ((0, ln_full), (1, w1), (2, a), (3, w2)):
            record_amax(fi.rs, t, True, slot)
    if tp.gather:  # this rank's rows of the reduce-scattered FC2 output (gather_gemm.py), its
        # bias and residual added by the GEMM of this rank's block
        y = gemm_reduce_scatter(a, tp, w2.shape[0], dtype, lambda rows, o, bias, res: (
            _gemms.fprop_hp(w2, rows, bias, addend=res, out=o)), bias=b2, addend=residual)
    else:
        y = _gemms.fprop_hp(w2, a, b2, addend=residual)
    saved = (x2d, mu, rsigma, g, ln_full, None, w1, None, h, a, None, w2, None)
    return y, ln_out, saved


def _dact(module, da, h, b1_grad, dtype):
    """(dh, db1) from FC2's dgrad `da`: the fused dbias + dact kernel for plain activations
    (one pass; cuBLASLt's dGELU + bias-grad epilogue runs as a separate, slower kernel after
    the GEMM, so it is not used), dact then a column sum for the gated ones."""
    act = module.activation
    if _gated(act):
        dh = _act_backward(module, da, h)
        return dh, (bias_grad_of(dh, dtype) if b1_grad else None)
    dh, db1 = K.dbias_dactivation(da, h, act)
    return dh, (db1 if b1_grad else None)


def _fc2_dgrad(ctx, w2_arg, w2_sinv, dyq, dy_sinv):
    """FC2's input gradient (high precision) from the output gradient (fp8 or high precision)."""
    if w2_sinv is not None:
        return _gemms.dgrad_fp8(w2_arg, w2_sinv, dyq, dy_sinv, ctx.dtype)
    return _gemms.dgrad_hp(w2_arg, dyq)


def _dact_fp8(ctx, da, h, need_transpose):
    """(dh fp8, dh_t fp8 or None, scale_inv, db1). Delayed scaling: one fused kernel (direct
    path), or the dbias + dact kernel writing FP8 then a 1-byte transpose (plain activations).
    Otherwise high precision, then cast + transpose (current scaling needs dh's amax first)."""
    rs, act = ctx.fi.rs, ctx.module.activation
    # dact (+ dbias), FP8 cast and FC1-wgrad transpose in one pass where the eager path serves it
    fused = (dact_cast_transpose(ctx.fi, da, h, act, 1, h.dtype if ctx.b1_grad else None)
             if need_transpose else None)
    if fused is not None:
        dhq, dhq_t, db1, dh_sinv = fused
        return dhq, dhq_t, dh_sinv, db1
    if rs.delayed and not _gated(act):
        scale, amax = cast_scale(rs, None, False, 1, None)
        dhq, db1, dh_sinv = dbias_dactivation_fp8(da, h, act, rs.bwd_dtype, scale, amax)
        dhq_t = transposed(dhq) if need_transpose else None
        return dhq, dhq_t, dh_sinv, (db1 if ctx.b1_grad else None)
    if rs.delayed and need_transpose and act != CLAMPED_SWIGLU and da.is_contiguous():
        # the eager path's fused kernel, checked: dh cast to FP8 from fp32 as the eager path
        # does (a bf16 dh then cast would round twice and give other bits)
        scale, amax = cast_scale(rs, None, False, 1, None)
        dhq, dhq_t, db1, dh_sinv = K.dact_dbias_cast_transpose(
            da, h, act, rs.bwd_dtype, scale, amax, h.dtype if ctx.b1_grad else None)
        return dhq, dhq_t, dh_sinv, db1
    dh, db1 = _dact(ctx.module, da, h, ctx.b1_grad, ctx.dtype)
    dhq, dhq_t, dh_sinv = cast(rs, dh, False, 1, need_transpose)
    return dhq, dhq_t, dh_sinv, db1


class _LayerNormMLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, ln_weight, ln_bias, w1, b1, w2, b2, module, fi, dtype, is_first_microbatch,
                add_input):
        # add_input: y = inp + MLP(norm(inp)), the residual connection of a pre-norm block: the
        # FC2 GEMM adds inp (its C operand) and the norm backward adds y's gradient into dx, so
        # the connection costs no add kernel either way
        hidden = inp.shape[-1]
        x2d = inp.reshape(-1, hidden)
        x2d = (x2d if x2d.dtype == dtype else x2d.to(dtype)).contiguous()
        residual = x2d if add_input else None
        g, b = param_for(ln_weight, x2d), param_for(ln_bias, x2d)
        # under inference_mode no backward can follow (parameters still say requires_grad;
        # a traced graph cannot ask, and keeps what a backward needs)
        training = torch.compiler.is_compiling() or not torch.is_inference_mode_enabled()
        need = {"w1": training and w1.requires_grad, "w2": training and w2.requires_grad,
                "dgrad": training and (inp.requires_grad or ln_weight.requires_grad
                                       or (ln_bias is not None and ln_bias.requires_grad))}
        # "fc1": the backward goes through FC2's dgrad and the activation's backward, which any
        # gradient below FC2 needs, FC1's bias gradient alone included
        need["fc1"] = need["w1"] or need["dgrad"] or (training and b1 is not None
                                                      and b1.requires_grad)
        tp = module.norm_tp()
        tokens = x2d.shape[0] * (tp.size if tp.gather else 1)
        fp8 = fi.fp8 and tokens > 0
        if fp8:
            check_fp8_dims("LayerNormMLP", tokens, hidden, w1.shape[0], w2.shape[0], w2.shape[1])
            y, ln_out, saved = _forward_fp8(module, fi, x2d, g, b, w1, b1, w2, b2, dtype,
                                            is_first_microbatch, need, tp, residual)
        else:
            y, ln_out, saved = _forward_hp(module, fi, x2d, g, b, w1, b1, w2, b2, dtype, tp,
                                           residual)
        ctx.add_input = add_input
        ctx.save_for_backward(*saved)
        ctx.tp = tp
        ctx.fp8, ctx.fi, ctx.dtype, ctx.module, ctx.need = fp8, fi, dtype, module, need
        ctx.b1_grad = b1 is not None and b1.requires_grad
        ctx.b2_grad = b2 is not None and b2.requires_grad
        ctx.param_dtypes = (ln_weight.dtype, ln_bias.dtype if ln_bias is not None else None,
                            b1.dtype if b1 is not None else None, b2.dtype if b2 is not None else None)
        ctx.weights = ((w1, w2) if module.fuse_wgrad_accumulation or module.delay_wgrad_compute
                       else (None, None))
        ctx.shapes = (inp.shape, tuple(w1.shape), tuple(w2.shape))
        y = y.view(-1, *inp.shape[1:-1], w2.shape[0])
        if module.return_layernorm_output:
            return y, ln_out.view(inp.shape)
        return y

    @staticmethod
    def backward(ctx, grad_out, *grad_ln_out):
        side_stream.join()  # a gathered input's transpose made beside the forward
        inp_shape, w1_shape, w2_shape = ctx.shapes
        module, fi, dtype, need = ctx.module, ctx.fi, ctx.dtype, ctx.need
        fuse = module.fuse_wgrad_accumulation
        (x2d, mu, rsigma, g, ln_t, ln_sinv, w1_t, w1_sinv, h, a_t, a_sinv, w2_t, w2_sinv) = ctx.saved_tensors
        dy = grad_out.reshape(-1, w2_shape[0])
        dy = (dy if dy.dtype == dtype else dy.to(dtype)).contiguous()
        da = None
        db2_dtype = ctx.param_dtypes[3] if ctx.b2_grad else None
        fp8_dy = None  # (dyq, dyq_t, scale_inv, da) of the FP8 gather below
        dy_rows, db2_rows = dy, None  # this rank's rows (the residual's gradient)
        if ctx.tp.gather:
            # sequence parallel: this rank's rows of the output gradient; FC2 needs all of them.
            # FC2's bias went to this rank's rows only (its block's GEMM): its gradient is their
            # column sum, made before the gather. FC2's dgrad starts on this rank's rows while
            # the others arrive: in FP8 where the ranks share the scale (1-byte rows), else in
            # high precision
            if db2_dtype is not None:
                db2_rows, db2_dtype = bias_grad_of(dy, db2_dtype), None
            if ctx.fp8 and fp8_gather_applies(fi, ctx.tp):
                fp8_dy = gather_fp8_grad(fi, ctx.tp, dy, need["w2"], w2_shape[1], (
                    (lambda rows, sinv, o: _gemms.dgrad_fp8(w2_t, w2_sinv, rows, sinv, dtype, out=o))
                    if need["fc1"] else None))
            elif ctx.fp8:
                dy = ctx.tp.gather_rows(dy)
            else:
                pending = start_gather_rows(dy, ctx.tp)
                da = dy.new_empty((dy.shape[0] * ctx.tp.size, w2_shape[1]))
                dy = gemm_over_gather(pending, (da,), lambda rows, o: _gemms.dgrad_hp(
                    w2_t, rows, out=o[0]))
        db2 = None
        dw1 = dw2 = dln = None
        # the dgrad chain first (FC2 dgrad, activation, FC1 dgrad): FC1's input gradient then
        # travels over the tensor-parallel group (pending) while both wgrad GEMMs run
        pending = None
        db1 = None
        counted = False  # the step counted this backward as finished (backward_casts_done)
        # without a gradient below FC2 (need["fc1"] False) only FC2's weight and bias gradients
        # are made, on the checked ops, and FC2's transposed weight was never cast
        nc = (_fp8_step.plan_call(fi, dy, ctx.tp, module.delay_wgrad_compute)
              if ctx.fp8 and need["fc1"] and fp8_dy is None else None)
        if nc is not None:
            # each GEMM's casts and GEMMs in one native call of the Linear step's plan: FC2 casts
            # dy (+ FC2's bias gradient), then its dgrad and wgrad; the activation's backward
            # casts dh (+ FC1's bias gradient); FC1's dgrad and wgrad then take dh as it is, and
            # the step's update, which must follow dh's cast (its amax), rides that last call.
            # No tensor-parallel reduction waits on this path (plan_call), so FC2's wgrad may
            # run before FC1's dgrad: the GEMMs write separate outputs, the bits do not change
            da, dw2, db2 = _fp8_step.fp8_backward(
                "LayerNormMLP", nc, fi, dy, (a_t, a_sinv, w2_t, w2_sinv), w2_shape, dtype,
                db2_dtype, True, need["w2"], ctx.weights[1], fuse, False)
            dhq, dhq_t, dh_sinv, db1 = _dact_fp8(ctx, da, h, need["w1"])
            dln, dw1 = _fp8_step.fp8_backward_fp8_grad(
                "LayerNormMLP", nc, fi, (dhq, dhq_t, dh_sinv), (ln_t, ln_sinv, w1_t, w1_sinv),
                w1_shape, dtype, need["dgrad"], need["w1"], ctx.weights[0], fuse, True)
            pending = ctx.tp.start_reduce_grad(dln) if need["dgrad"] else None
        elif ctx.fp8:
            if fp8_dy is not None:
                dyq, dyq_t, dy_sinv, da = fp8_dy
            else:
                dyq, dyq_t, dy_sinv, db2 = cast_grad(fi, dy, need["w2"], db2_dtype)
                if need["fc1"]:
                    da = _fc2_dgrad(ctx, w2_t, w2_sinv, dyq, dy_sinv)
            if need["fc1"]:
                dhq, dhq_t, dh_sinv, db1 = _dact_fp8(ctx, da, h, need["w1"])
            counted = q.backward_casts_done(fi.step, dy.device)

            def wgrads_fp8():  # (dw2, dw1), under the end of FC1 dgrad's reduction
                return ((_wgrad.weight_grad(module, ctx.weights[1], fuse, lambda: _gemms.wgrad_fp8(
                            a_t, a_sinv, dyq_t, dy_sinv, dtype, ctx.weights[1], fuse))
                         if need["w2"] else None),
                        (_wgrad.weight_grad(module, ctx.weights[0], fuse, lambda: _gemms.wgrad_fp8(
                            ln_t, ln_sinv, dhq_t, dh_sinv, dtype, ctx.weights[0], fuse))
                         if need["w1"] else None))
            if need["dgrad"]:
                pending, (dw2, dw1) = ctx.tp.dgrad_and_reduce(
                    dhq, w1_shape[1], dtype, lambda rows, o: _gemms.dgrad_fp8(
                        w1_t, w1_sinv, rows, dh_sinv, dtype, out=o), 16, wgrads_fp8)
            else:
                dw2, dw1 = wgrads_fp8()
        else:
            if fi.calibrating:
                record_amax(fi.rs, dy, False, 0)
            dh = None
            if need["fc1"]:
                if da is None:
                    da = _fc2_dgrad(ctx, w2_t, None, dy, None)
                dh, db1 = _dact(module, da, h, ctx.b1_grad, dtype)
            if fi.calibrating and dh is not None:
                record_amax(fi.rs, dh, False, 1)

            def wgrads_hp():  # (dw2, db2 or None, dw1), under the end of FC1 dgrad's reduction
                dw2_ = db2_ = dw1_ = None
                if need["w2"] and db2_dtype is not None and not module.delay_wgrad_compute:
                    dw2_, db2_ = _gemms.wgrad_bgrad_hp(a_t, dy, ctx.weights[1], fuse, *w2_shape,
                                                       db2_dtype)
                    dw2_ = _wgrad.autograd_weight_grad(ctx.weights[1], dw2_, fuse)
                elif need["w2"]:
                    dw2_ = _wgrad.weight_grad(module, ctx.weights[1], fuse, lambda: _gemms.wgrad_hp(
                        a_t, dy, ctx.weights[1], fuse, *w2_shape))
                if need["w1"]:
                    dw1_ = _wgrad.weight_grad(module, ctx.weights[0], fuse, lambda: _gemms.wgrad_hp(
                        ln_t, dh, ctx.weights[0], fuse, *w1_shape))
                return dw2_, db2_, dw1_
            if need["dgrad"]:
                pending, (dw2, db2, dw1) = ctx.tp.dgrad_and_reduce(
                    dh, w1_shape[1], dtype, lambda rows, o: _gemms.dgrad_hp(w1_t, rows, out=o), 1,
                    wgrads_hp)
            else:
                dw2, db2, dw1 = wgrads_hp()
            if db2_dtype is not None and db2 is None:
                db2 = bias_grad_of(dy, db2_dtype)
        if fi.step is not None and not counted:
            fi.step.backward_finished()
        if db2_rows is not None:
            db2 = db2_rows
        if db1 is not None:
            db1 = db1.to(ctx.param_dtypes[2])
        dx = dgamma = dbeta = None
        if need["dgrad"]:
            dln = pending.wait()
            if grad_ln_out and grad_ln_out[0] is not None:
                dln = dln + grad_ln_out[0].reshape(dln.shape).to(dln.dtype)
            dx, dgamma, dbeta = norm_backward(module.normalization, dln.contiguous(), x2d, mu, rsigma,
                                              g, module.zero_centered_gamma,
                                              dy_rows if ctx.add_input else None)
            dx = dx.view(inp_shape)
            dgamma = dgamma.to(ctx.param_dtypes[0])
            dbeta = dbeta.to(ctx.param_dtypes[1]) if dbeta is not None and ctx.param_dtypes[1] else None
        return dx, dgamma, dbeta, dw1, db1, dw2, db2, None, None, None, None, None


class LayerNormMLP(TransformerEngineBaseModule):
    """A normalisation followed by a two-layer MLP, fused: ``FC2(act(FC1(norm(x))))``.

    Under FP8 the norm writes FP8 directly, the activation kernel casts its output to FP8 as it
    writes it, and the backward fuses the activation's derivative with the bias gradient. FP8 runs
    on NVIDIA sm_89 and newer (Ada, Hopper; OCP E4M3/E5M2), on AMD gfx942 (MI300, FNUZ formats) and
    gfx950 (OCP), and emulated on the reference backend (CPU or any device without the native
    library).
    Under FP8 the token count, ``hidden_size`` and ``ffn_hidden_size`` must be multiples of 16.

    Parameters
    ----------
    hidden_size : int
        Size of the last dimension of the input and of the output.
    ffn_hidden_size : int
        Size of the intermediate (FC1 output) dimension.
    eps : float, default 1e-5
        Added to the variance (or mean square) before the square root.
    sequence_parallel : bool, default False
        With tensor parallelism (``tp_size > 1``), the input and output of the module are split
        along the sequence dimension across the tensor-parallel group, and the module gathers or
        reduce-scatters them around its GEMMs. Has no effect when ``tp_size`` is 1.
    return_bias : bool, default False
        When True FC2's bias is not added; ``forward`` returns ``(output, fc2_bias)``.
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker`; weights are initialised under its fork so that
        tensor-parallel shards draw different random numbers.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel process group. ``None`` (default) means no tensor parallelism.
    tp_size : int, default 1
        Number of ranks in ``tp_group``; taken from the group when one is given. Any
        ``torch.distributed`` backend (NCCL on NVIDIA, RCCL on AMD, gloo on the CPU).
    init_method : callable, optional
        Initialises FC1's weight in place (default: normal, standard deviation 0.023).
    bias : bool, default True
        Whether FC1 and FC2 have biases.
    normalization : {'LayerNorm', 'RMSNorm'}, default 'LayerNorm'
        The normalisation applied to the input.
    activation : str, default 'gelu'
        The activation between the GEMMs: ``'gelu'``, ``'relu'``, ``'qgelu'`` (quick GELU),
        ``'srelu'`` (squared ReLU), ``'silu'``, or a gated one, for which FC1 produces twice
        ``ffn_hidden_size`` features: ``'geglu'``, ``'reglu'``, ``'qgeglu'``, ``'sreglu'``,
        ``'swiglu'``. All are supported on every backend.
    output_layer_init_method : callable, optional
        Initialises FC2's weight in place (default: as ``init_method``).
    fuse_wgrad_accumulation : bool, default False
        Accumulate weight gradients into ``weight.main_grad`` (a float32 tensor the caller
        allocates, as Megatron-style optimizers do) instead of writing ``weight.grad``.
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``): float32, bfloat16 or
        float16. The compute dtype follows the input (or ``torch.autocast``).
    return_layernorm_output : bool, default False
        Also return the normalised input: ``forward`` returns ``(output, norm_output)`` (after the
        bias, if ``return_bias``), e.g. to use it as a residual.
    return_layernorm_output_gathered : bool, default False
        With sequence parallelism, return the norm output after the all-gather over the sequence
        dimension rather than the local shard.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero), which keeps it precise in low
        precision formats; the output is ``... * (1 + gamma)``.
    device : torch.device or str, optional
        Where the parameters are created: default the current CUDA/ROCm device when one exists,
        else the CPU. ``'meta'`` defers allocation: call ``to_empty()`` and then
        ``reset_parameters()`` to materialise the module.
    set_parallel_mode : bool, default False
        With tensor parallelism, split FC1 by columns and FC2 by rows over the group (the
        Megatron-style MLP split; one all-reduce after FC2).
    name : str, optional
        A name for the module, used in debug logging only.
    seq_length : int, optional
        Sequence length; a size hint of NVIDIA TE's userbuffers, stored without effect (shapes
        come from the input).
    micro_batch_size : int, optional
        Micro-batch size; stored without effect, like ``seq_length``.
    ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad : bool, default False
        Overlap of tensor-parallel communication with the GEMMs through NVIDIA's userbuffers.
        Not implemented: only False is accepted; True raises NotImplementedError. The
        tensor-parallel communication runs as separate ``torch.distributed`` collectives.
    symmetric_ar_type : str, optional
        All-reduce of the row-parallel output through symmetric memory. Not implemented: only
        None is accepted (a value raises NotImplementedError); the plain
        ``torch.distributed.all_reduce`` is used.
    delay_wgrad_compute : bool, default False
        The backward computes the input gradient and queues the weight-gradient GEMMs on the
        module; :meth:`backward_dw` runs them later (pipeline
        schedules use this to fill bubbles) and then calls the hooks registered with
        :meth:`register_wgrad_accumulation_and_reduce_hooks`. The queued GEMMs keep their
        operands alive until then.
    activation_params : dict, optional
        Parameters of the activation. Only ``activation='clamped_swiglu'`` takes them:
        ``{'limit': float, 'alpha': float}`` (defaults 7.0 and 1.702; a finite limit > 0): the
        gate is clamped to at most ``limit`` and the linear half to ``[-limit, limit]``, and the
        output is ``gate * sigmoid(alpha * gate) * (linear + 1)``. Any other activation with
        parameters raises ValueError.
    checkpoint : bool, default False
        Recompute the module's forward in the backward instead of keeping its intermediate
        activations: the forward keeps only its input, and the backward replays the forward
        through :func:`checkpoint` (same RNG states, same FP8 scales), so the gradients equal
        those without it. Applies when gradients are enabled.
    """
    fp8_slots = (4, 2)  # forward: norm out, FC1 weight, activation out, FC2 weight; backward: dy, dh

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5,
                 sequence_parallel: bool = False, return_bias: bool = False,
                 get_rng_state_tracker: Optional[Callable] = None, tp_group=None, tp_size: int = 1,
                 init_method: Optional[Callable] = None, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu",
                 output_layer_init_method: Optional[Callable] = None,
                 fuse_wgrad_accumulation: bool = False, params_dtype: Optional[torch.dtype] = None,
                 return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False, zero_centered_gamma: bool = False,
                 device: Union[torch.device, str, None] = None, set_parallel_mode: bool = False,
                 seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, symmetric_ar_type: Optional[str] = None,
                 name: Optional[str] = None,
                 delay_wgrad_compute: bool = False, activation_params: Optional[dict] = None,
                 checkpoint: bool = False):
        super().__init__()
        check_off("LayerNormMLP", ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                  ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_dgrad=ub_bulk_dgrad,
                  ub_bulk_wgrad=ub_bulk_wgrad, symmetric_ar_type=symmetric_ar_type)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size  # size hints only
        check_normalization("LayerNormMLP", normalization)
        if activation not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"LayerNormMLP: activation is {activation!r}; expected one of "
                             f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        self.normalization, self.eps, self.zero_centered_gamma = normalization, eps, zero_centered_gamma
        self.activation = activation
        self.activation_params = activation_params
        if activation == CLAMPED_SWIGLU:
            self._clamp_params = clamped_swiglu_params("LayerNormMLP", activation_params)
        elif activation_params:
            raise ValueError(f"LayerNormMLP: activation_params is {activation_params!r}; only "
                             f"activation='{CLAMPED_SWIGLU}' takes parameters")
        # checkpoint=True: the forward keeps only its input; the backward recomputes the
        # module's forward (te.checkpoint: the forward's RNG states and FP8 scales)
        self.checkpoint = bool(checkpoint)
        self.tp_group = tp_group
        self.tp_size = _parallel.resolve_tp(tp_group, tp_size)
        self.set_parallel_mode = set_parallel_mode
        self.sequence_parallel = sequence_parallel and self.tp_size > 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.return_bias, self.use_bias = return_bias, bias
        self.return_layernorm_output = return_layernorm_output
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, None
        self.hidden_size = hidden_size
        tp = self.tp_size if set_parallel_mode else 1
        self.size_per_partition = _parallel.dist_te.divide(ffn_hidden_size, tp, "LayerNormMLP: ffn_hidden_size")
        self.ffn_hidden_size = ffn_hidden_size
        self.init_method = init_method or default_init_method()
        self.output_layer_init_method = output_layer_init_method or self.init_method
        self.name = name
        device = default_device(device)
        dt = self.params_dtype
        fc1_out = self.size_per_partition * (2 if _gated(activation) else 1)
        self.layer_norm_weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=dt, device=device))
        self.layer_norm_bias = (torch.nn.Parameter(torch.empty(hidden_size, dtype=dt, device=device))
                                if normalization == "LayerNorm" else None)
        for p in (self.layer_norm_weight, self.layer_norm_bias):
            if p is not None:
                p.sequence_parallel = self.sequence_parallel
        # NVIDIA TE's registration order: fc1 weight, fc1 bias, fc2 weight, fc2 bias
        self.fc1_weight = self.make_weight((fc1_out, hidden_size), dt, device, self._init_weight)
        self.fc1_bias = torch.nn.Parameter(torch.zeros(fc1_out, dtype=dt, device=device)) if bias else None
        self.fc2_weight = self.make_weight((hidden_size, self.size_per_partition), dt, device,
                                           lambda w: self._init_weight(w, self.output_layer_init_method))
        self.fc2_bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dt, device=device)) if bias else None
        if self.fc2_bias is not None:
            self.fc2_bias.sequence_parallel = self.sequence_parallel  # added after the reduce-scatter
        if set_parallel_mode and self.tp_size > 1:
            _parallel.dist_te.set_tensor_model_parallel_attributes(self.fc1_weight, True, 0, 1)
            _parallel.dist_te.set_tensor_model_parallel_attributes(self.fc2_weight, True, 1, 1)
        if device.type != "meta":
            self._reset_norm()
        _wgrad.mark_delayed_params(self)

    def norm_tp(self):
        """The tensor-parallel layout of the norm's input.

        How the fused norm gathers a sequence-parallel input before the GEMM (nothing to do
        without tensor parallelism).
        """
        if not (self.set_parallel_mode and self.tp_size > 1):
            return _parallel.NO_TP
        return _parallel.NormTP(self.tp_group, self.tp_size, True, self.sequence_parallel)

    def _reset_norm(self):
        reset_norm_params(self.layer_norm_weight, self.layer_norm_bias, self.zero_centered_gamma)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """(Re)initialise the parameters in place.

        The norm's scale gets ones (zeros with ``zero_centered_gamma``) and its bias zeros; weights
        get
        ``init_method`` and biases zeros. Use it after creating the module on ``device='meta'`` and
        calling ``to_empty()``.

        Parameters
        ----------
        defer_init : bool, default False
            When True, do nothing (initialisation is left to a later call).
        """
        if defer_init:
            return
        self._reset_norm()
        with torch.no_grad():
            self._init_weight(self.fc1_weight)
            self._init_weight(self.fc2_weight, self.output_layer_init_method)
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None:
                    b.zero_()
        self._quantize_deferred_weights()

    def residual_in_gemm(self) -> bool:
        """Whether a residual connection around this block can be added inside FC2's GEMM.

        True when FC2's output is complete on this rank (no split, or sequence parallelism:
        this rank's rows, whose block GEMM then adds the residual) with its bias added in the
        GEMM and the norm's output is not returned. Used by :class:`TransformerLayer` to fuse
        its residual add.
        """
        return not (self.return_bias or self.return_layernorm_output
                    or (self.set_parallel_mode and self.tp_size > 1 and not self.sequence_parallel))

    def _fused_call(self, inp, is_first_microbatch, fused):
        recipe = _blockwise.active()
        if recipe is not None:  # Float8BlockScaling: its own GEMMs (see module_parts/blockwise.py)
            y, ln_out = _blockwise.layernorm_mlp(self, recipe, inp, self.activation_dtype(inp))
            y = inp + y if fused else y
            if self.set_parallel_mode and self.tp_size > 1 and self.sequence_parallel:
                # the native Function reduce-scatters its own output; this path's comes whole
                y = _parallel.row_output(y, self.tp_group, self.tp_size, True)
            return (y, ln_out.view(inp.shape)) if self.return_layernorm_output else y
        # split without sequence parallelism: the bias after the all-reduce (forward); with it,
        # the call's reduce-scatter adds it once (gather_gemm.gemm_reduce_scatter)
        parallel = self.set_parallel_mode and self.tp_size > 1 and not self.sequence_parallel
        b2 = self.fc2_bias if not (self.return_bias or parallel) else None
        return _LayerNormMLPFn.apply(inp, self.layer_norm_weight, self.layer_norm_bias,
                                     self.fc1_weight, self.fc1_bias, self.fc2_weight, b2, self,
                                     self.fp8_call_info(inp.device), self.activation_dtype(inp),
                                     is_first_microbatch, fused)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None, *,
                _add_input: bool = False):
        """Apply the norm and the MLP to ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            Input of shape ``[..., hidden_size]``, float32, bfloat16 or float16.
        is_first_microbatch : bool, optional
            With gradient accumulation over micro-batches: ``True`` on the first micro-batch of a
            step
            (the FP8 copy of the weight is cast and cached), ``False`` on the later ones (the cached
            copy is reused, as the weights do not change within a step). ``None`` (default) casts
            the
            weight on every call.

        Returns
        -------
        torch.Tensor or tuple
            The output ``[..., hidden_size]``; with ``return_bias`` also FC2's bias, and with
            ``return_layernorm_output`` also the norm's output, in that order.
        """
        if _add_input and not self.residual_in_gemm():
            raise ValueError("LayerNormMLP: _add_input needs return_bias=False, "
                             "return_layernorm_output=False and no tensor-parallel split "
                             "without sequence parallelism")
        if inp.shape[-1] != self.hidden_size:
            raise ValueError(f"LayerNormMLP: input has shape {tuple(inp.shape)}; expected last "
                             f"dimension {self.hidden_size} (hidden_size)")
        check_on_input_device("te.LayerNormMLP", inp, self._parameters.items())
        parallel = self.set_parallel_mode and self.tp_size > 1
        # an input of another dtype than the GEMMs' output keeps torch's type promotion: added after
        fused = _add_input and inp.dtype == self.activation_dtype(inp)
        if self.checkpoint and torch.is_grad_enabled():
            out = _checkpoint(self._fused_call, inp, is_first_microbatch, fused)
        else:
            out = self._fused_call(inp, is_first_microbatch, fused)
        if _add_input and not fused:
            out = inp + out
        ln_out = None
        if self.return_layernorm_output:
            out, ln_out = out
        if parallel and not self.sequence_parallel:  # with it, the call reduce-scattered already
            out = _parallel.row_output(out, self.tp_group, self.tp_size, False)
            if self.fc2_bias is not None and not self.return_bias:
                out = out + self.fc2_bias.to(out.dtype)
        if self.return_bias:
            out = (out, self.fc2_bias.to(out.dtype) if self.fc2_bias is not None else None)
        if self.return_layernorm_output:
            return (*out, ln_out) if self.return_bias else (out, ln_out)
        return out
