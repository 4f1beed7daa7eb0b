"""te.Linear: y = x @ W.T + b as one autograd Function, in high precision or FP8 (see
library/gemm.py for the GEMMs; FP8: the input is cast and transposed in one pass, the weight's
FP8 copy and transpose are cached per step with is_first_microbatch, the bias rides the GEMM
epilogue). In eager mode on the native core each direction is one native call
(kernels/linear_step.py); the checked ops serve torch.compile, checkpoint recompute and the
reference backend."""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .. import quantization as q
from .. import distributed as dist_te
from ..kernels import eager, linear_step
from ..library import dispatch as K
from ..library import gemm as _gemms
from ..library.activation import bias_grad_of
from ..library.cast import cast, record_amax
from ..tensor import Float8Tensor
from ..module_parts import (blockwise as _blockwise, fp8_step_backward as _fp8_step,
                           original_input as _original_input, parallel as _parallel,
                           wgrad as _wgrad)
from ..module_parts.gather_gemm import (fp8_blocks_fit, gemm_over_gather, gemm_reduce_scatter,
                                        start_gather_rows)
from ..module_parts.input_check import check_fp8_dims, check_on_input_device
from ..module_parts.nv_options import check_off
from ..module_parts import side_stream, weight_cast_beside
from ..module_parts.sequence_parallel_fp8 import (fp8_amax_group, fp8_gather_applies,
                                                   gather_fp8_grad, start_fp8_gather)
from .base import (TransformerEngineBaseModule, default_device, default_init_method, fp8_weight,
                   hp_weight)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, residual, call):
        # residual (or None): added to the output by the GEMM (its C operand), so a residual
        # connection costs no separate add; its gradient is the output's, passed through
        # the call's non-tensor arguments come as one tuple: Function.apply inspects every
        # argument and the backward returns a gradient slot for each (host time per call)
        # sp: the sequence-parallel group (_parallel.NormTP) when this call gathers its input's
        # rows itself, in FP8 (see _sequence_parallel_fp8), else None
        # rs: the group (_parallel.NormTP) a row-parallel sequence-parallel call reduce-scatters
        # its output over, itself (see gather_gemm.gemm_reduce_scatter), else None
        module, fi, dtype, is_first_microbatch, fuse_wgrad, nc, sp, rs = call
        keep_input = getattr(module, "save_original_input", False)  # see module_parts/original_input.py
        out_features, in_features = weight.shape
        # reshape makes a view node even when nothing changes (host time): 2-D inputs skip it
        x2d = inp if inp.dim() == 2 else inp.reshape(-1, in_features)
        if x2d.dtype != dtype:
            x2d = x2d.to(dtype)
        x2d = x2d.contiguous()
        # under inference_mode no backward can follow (the weight still says requires_grad;
        # a traced graph cannot ask, and keeps what a backward needs)
        training = torch.compiler.is_compiling() or not torch.is_inference_mode_enabled()
        need_dgrad, need_wgrad = inp.requires_grad, training and weight.requires_grad
        tokens = x2d.shape[0] * (sp.size if sp is not None else 1)
        fp8 = fi.fp8 and tokens > 0
        # a row-parallel sequence-parallel call (rs) adds the bias to this rank's rows only, in
        # its block's GEMM: the backward sums those rows of dy before it gathers them
        bias_grad = bias is not None and bias.requires_grad
        ctx.has_bias_grad, ctx.rows_bias_grad = bias_grad and rs is None, bias_grad and rs is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        if bias is not None:
            # the direct path describes the bias by out_features: a bias of another shape must
            # fail here, not be read past its end
            if bias.shape != (out_features,):
                raise ValueError(f"Linear: bias has shape {tuple(bias.shape)}; expected "
                                 f"[{out_features}] (out_features)")
            if bias.dtype != dtype:
                bias = bias.to(dtype)
            if not bias.is_contiguous():
                bias = bias.contiguous()
        ctx.plan = None  # the FP8 step's native plan when the forward ran it
        r2d = None
        if residual is not None:
            r2d = residual.reshape(-1, out_features)  # the output's rows (this rank's with rs)
            r2d = (r2d if r2d.dtype == dtype else r2d.to(dtype)).contiguous()
        ctx.has_residual = residual is not None
        if fp8:
            if tokens % 16 or in_features % 16 or out_features % 16:
                check_fp8_dims(type(module).__name__, tokens, in_features, out_features)
            if nc is not None and rs is None:  # row parallel + SP: the blocks below instead
                y = _fp8_forward_fast(ctx, nc, module, fi, x2d, weight, bias, dtype, need_dgrad,
                                      need_wgrad, is_first_microbatch, r2d)
            elif sp is not None:
                # the weight's cast, then this rank's rows cast with the shared scale and their
                # bytes gathered under this rank's GEMM block; the gathered rows' transpose
                # serves wgrad
                def cast_weight():
                    return fp8_weight(module, weight, fi, 1, need_dgrad, is_first_microbatch)
                w8 = weight_cast_beside.cast_first(module, 1, cast_weight)
                xq, _, x_sinv = cast(fi.rs, x2d, True, 0, False, fi.replay, fi.record,
                                     amax_group=fp8_amax_group(fi, sp))
                pending = start_fp8_gather(xq, sp, need_wgrad, async_op=True,
                                           transpose_beside=True)
                wq, wq_t, w_sinv = w8 or cast_weight()
                if fp8_blocks_fit(pending):  # the gather goes on under this rank's block
                    y = x2d.new_empty((tokens, out_features))
                    xq, xq_t = gemm_over_gather(pending, (y,), lambda rows, o: _gemms.fprop_fp8(
                        wq, w_sinv, rows, x_sinv, dtype, bias, out=o[0]))
                else:
                    xq, xq_t = pending.wait()
                    y = _gemms.fprop_fp8(wq, w_sinv, xq, x_sinv, dtype, bias).out
                ctx.save_for_backward(xq_t, x_sinv, wq_t, w_sinv)
            else:
                xq, xq_t, x_sinv = cast(fi.rs, x2d, True, 0, need_wgrad and not keep_input,
                                        fi.replay, fi.record)
                wq, wq_t, w_sinv = fp8_weight(module, weight, fi, 1, need_dgrad,
                                                     is_first_microbatch)
                if rs is not None:  # bias and residual by this rank's block (gather_gemm.py)
                    y = gemm_reduce_scatter(xq, rs, out_features, dtype, lambda rows, o, b, r: (
                        _gemms.fprop_fp8(wq, w_sinv, rows, x_sinv, dtype, b, addend=r, out=o)),
                        block_multiple=16, bias=bias, addend=r2d)
                else:
                    y = _gemms.fprop_fp8(wq, w_sinv, xq, x_sinv, dtype, bias, addend=r2d).out
                kept_x = x2d if keep_input and need_wgrad else xq_t
                ctx.save_for_backward(kept_x, x_sinv, wq_t, w_sinv)
        else:
            w = hp_weight(weight, dtype)
            if fi.calibrating:
                record_amax(fi.rs, x2d, True, 0)
                record_amax(fi.rs, w, True, 1)
            if rs is not None:  # bias and residual by this rank's block (gather_gemm.py)
                w = w if w.is_contiguous() else w.contiguous()
                y = gemm_reduce_scatter(x2d, rs, out_features, dtype, lambda rows, o, b, r: (
                    _gemms.fprop_hp(w, rows, b, addend=r, out=o)), bias=bias, addend=r2d)
            elif nc is not None and tokens > 0:
                w = w if w.is_contiguous() else w.contiguous()
                y = linear_step.hp_forward(nc, x2d, w, bias, r2d, dtype)
            else:
                y = K.general_gemm(w, x2d, layout="TN", bias=bias, addend=r2d).out
            ctx.save_for_backward(x2d if need_wgrad else None, w if need_dgrad else None)
        ctx.fp8, ctx.fi, ctx.dtype, ctx.fuse, ctx.tokens = fp8, fi, dtype, fuse_wgrad, tokens
        ctx.sp, ctx.rs = sp, rs
        ctx.input_kept = fp8 and keep_input and need_wgrad
        ctx.nc = nc  # the backward reuses it (native_call_again)
        ctx.need_dgrad, ctx.need_wgrad = need_dgrad, need_wgrad
        ctx.delay = getattr(module, "delay_wgrad_compute", False)
        ctx.module = module if ctx.delay else None
        ctx.weight = weight if fuse_wgrad or ctx.delay else None
        ctx.shapes = (inp.shape, out_features, in_features)
        if inp.dim() == 2:
            return y
        return y.view(-1 if sp is not None or rs is not None else inp.shape[0], *inp.shape[1:-1],
                      out_features)

    @staticmethod
    def backward(ctx, grad_out):
        inp_shape, out_features, in_features = ctx.shapes
        side_stream.join()  # a gathered input's transpose made beside the forward
        dy = grad_out if grad_out.dim() == 2 else grad_out.reshape(-1, out_features)
        if dy.dtype != ctx.dtype:
            dy = dy.to(ctx.dtype)
        dy = dy.contiguous()
        fi = ctx.fi
        dx_rows = None  # high precision, row parallel + SP: dgrad made while dy's rows gathered
        fp8_dy = None  # FP8, row parallel + SP: (dyq, dyq_t, scale_inv, dx) of gather_fp8_grad
        saved = _fp8_saved(ctx) if ctx.fp8 else None
        db_rows = bias_grad_of(dy, ctx.bias_dtype) if ctx.rows_bias_grad else None
        if ctx.rs is not None:
            if (ctx.fp8 and dy.shape[0] > 0 and not ctx.has_bias_grad
                    and fp8_gather_applies(fi, ctx.rs)):
                xq_t, x_sinv, wq_t, w_sinv = _saved_fp8_tensors(ctx, saved)
                fp8_dy = gather_fp8_grad(fi, ctx.rs, dy, ctx.need_wgrad, in_features, (
                    (lambda rows, sinv, o: _gemms.dgrad_fp8(wq_t, w_sinv, rows, sinv, ctx.dtype,
                                                            out=o)) if ctx.need_dgrad else None))
            else:
                dy, dx_rows = _gather_output_grad(ctx, dy)
        # the direct path whenever it can serve the backward, whichever path the forward took
        # (a checkpoint recompute's forward replays scales on the checked ops): plain and
        # checkpointed steps then run the same backward kernels, bit for bit
        # a delayed weight gradient takes the checked ops (its GEMM runs later, in backward_dw)
        nc = (eager.native_call_again(ctx.nc, dy) if dy.shape[0] > 0 and eager.usable_backward(fi)
              and not ctx.delay and fp8_dy is None else None)
        # the direct path takes the bias gradient from a pass over dy it makes anyway: FP8, its
        # cast of dy; high precision and a small dy, the wgrad GEMM's epilogue (dW's dtype, so not
        # into an fp32 main_grad; see library/gemm.py, bias_grad_in_wgrad_epilogue)
        fused_db = nc is not None and ctx.need_wgrad and ctx.has_bias_grad and (
            ctx.fp8 or (not ctx.fuse and ctx.bias_dtype == ctx.dtype
                        and _gemms.bias_grad_in_wgrad_epilogue(dy)))
        # high precision on the direct path: linear_hp_backward makes the bias gradient too (the
        # epilogue, or the column-sum kernels in the same call)
        native_db = nc is not None and ctx.has_bias_grad and not ctx.fp8
        db = (bias_grad_of(dy, ctx.bias_dtype)
              if ctx.has_bias_grad and not fused_db and not native_db else None)
        dw_final = False  # True once dw is what autograd receives (see _wgrad)
        counted = False  # the step counted this backward as finished (backward_casts_done)
        if ctx.fp8:
            if fp8_dy is not None:
                dyq, dyq_t, dy_sinv, dx = fp8_dy
                counted = q.backward_casts_done(fi.step, dy.device)
                dw = (_wgrad.weight_grad(ctx.module, ctx.weight, ctx.fuse, lambda: _gemms.wgrad_fp8(
                    xq_t, x_sinv, dyq_t, dy_sinv, ctx.dtype, ctx.weight, ctx.fuse))
                      if ctx.need_wgrad else None)
                dw_final = True
            elif nc is not None:
                dx, dw, fdb = _fp8_backward_fast(ctx, nc, dy, saved)
                db = fdb if fused_db else db
            else:
                dx, dw = _fp8_backward(ctx, dy, *_saved_fp8_tensors(ctx, saved))
                dw_final = True
        else:
            x2d, w = ctx.saved_tensors
            if fi.calibrating:
                record_amax(fi.rs, dy, False, 0)
            if nc is not None:
                dx, dw, db = _hp_backward_fast(ctx, nc, dy, x2d, w, fused_db, dx_rows)
            else:
                dx = (dx_rows if dx_rows is not None else _gemms.dgrad_hp(w, dy)
                      if ctx.need_dgrad else None)
                dw = (_wgrad.weight_grad(ctx.module, ctx.weight, ctx.fuse, lambda: _gemms.wgrad_hp(
                    x2d, dy, ctx.weight, ctx.fuse, out_features, in_features))
                      if ctx.need_wgrad else None)
                dw_final = True
        if not dw_final:
            dw = _wgrad.autograd_weight_grad(ctx.weight, dw, ctx.fuse)
        if fi.step is not None and not counted:
            fi.step.backward_finished()
        if db_rows is not None:
            db = db_rows
        if dx is not None and ctx.sp is not None:
            dx = ctx.sp.reduce_grad(dx)  # back to this rank's rows (reduce-scatter)
        if dx is not None and len(inp_shape) != 2:
            dx = dx.view(inp_shape)
        return dx, dw, db, (grad_out if ctx.has_residual else None), None


_RAW_APPLY = super(torch.autograd.Function, _LinearFn).apply


def _hp_backward_fast(ctx, nc, dy, x2d, w, fused_db, dx_made=None):
    """dgrad, then wgrad, and the bias gradient in one native call (kernels/linear_step.py): the
    bias gradient in the wgrad GEMM's epilogue when fused_db, else by the column-sum kernels; a
    wgrad accumulated into main_grad (fuse_wgrad_accumulation) follows (library/gemm.py).
    dx_made: the input gradient already made (row blocks under a gather), so no dgrad here.
    Returns (dx, dw, db)."""
    _, out_features, in_features = ctx.shapes
    dx, dw, db = linear_step.hp_backward(
        nc, dy, x2d, w, in_features, ctx.dtype, ctx.need_dgrad and dx_made is None,
        ctx.need_wgrad and not ctx.fuse, ctx.bias_dtype if ctx.has_bias_grad else None, fused_db)
    if dx_made is not None:
        dx = dx_made
    if ctx.need_wgrad and ctx.fuse:
        dw = _gemms.wgrad_hp(x2d, dy, ctx.weight, True, out_features, in_features)
    return dx, dw, db


def _gather_output_grad(ctx, dy):
    """(every row of the output gradient, the input gradient or None) of a row-parallel,
    sequence-parallel call, whose dy holds this rank's rows. High precision with an input
    gradient to make: the dgrad GEMM starts on this rank's rows while the others arrive
    (gather_gemm.py); otherwise the gather completes first."""
    if ctx.fp8 or not ctx.need_dgrad or dy.shape[0] == 0:
        return ctx.rs.gather_rows(dy), None
    w = ctx.saved_tensors[1]
    pending = start_gather_rows(dy, ctx.rs)
    dx = dy.new_empty((dy.shape[0] * ctx.rs.size, w.shape[1]))
    dy = gemm_over_gather(pending, (dx,), lambda rows, o: _gemms.dgrad_hp(w, rows, out=o[0]))
    return dy, dx


def _fp8_backward(ctx, dy, xq_t, x_sinv, wq_t, w_sinv):
    dx = dw = None
    dyq, dyq_t, dy_sinv = cast(ctx.fi.rs, dy, False, 0, ctx.need_wgrad)
    if ctx.need_dgrad:
        dx = _gemms.dgrad_fp8(wq_t, w_sinv, dyq, dy_sinv, ctx.dtype)
    if ctx.need_wgrad:
        dw = _wgrad.weight_grad(ctx.module, ctx.weight, ctx.fuse, lambda: _gemms.wgrad_fp8(
            xq_t, x_sinv, dyq_t, dy_sinv, ctx.dtype, ctx.weight, ctx.fuse))
    return dx, dw


# ----- the direct FP8 path: one native call per direction (kernels/linear_step.py) -------------
def _fp8_forward_fast(ctx, nc, module, fi, x2d, weight, bias, dtype, need_dgrad, need_wgrad,
                      is_first_microbatch, r2d=None):
    """y = x @ W.T (+ bias) in FP8 through the step's native plan (the same C API calls, kernels
    and bits as the checked path's casts and GEMM); a weight cast of this step (not a
    Float8Tensor, no microbatch cache) is the plan's to make."""
    rs = fi.rs
    tokens, in_features = x2d.shape
    out_features = weight.shape[0]
    fresh_w = is_first_microbatch is None and not isinstance(weight, Float8Tensor)
    if fresh_w:
        w = weight if weight.is_contiguous() else weight.contiguous()
        wq_t = w_sinv = None
        w_dtype, wq_dtype = w.dtype, rs.fwd_dtype
    else:
        w, wq_t, w_sinv = fp8_weight(module, weight, fi, 1, need_dgrad, is_first_microbatch, nc)
        w_dtype = wq_dtype = w.dtype
    # dy's cast sums the bias gradient when the backward makes a weight gradient (the cast with
    # the transpose)
    db_dtype = ctx.bias_dtype if ctx.has_bias_grad and need_wgrad else None
    plan = linear_step.fp8_plan(nc, rs, (tokens, in_features, out_features, dtype, w_dtype,
                                         wq_dtype, fresh_w, need_dgrad, need_wgrad, db_dtype))
    y, kept = linear_step.fp8_forward(nc, plan, x2d, w, w_sinv, bias, r2d, dtype)
    ctx.save_for_backward(kept, None, wq_t, w_sinv)
    ctx.plan = plan
    return y


def _fp8_saved(ctx):
    """The FP8 forward's saved tensors; an input the forward kept unquantized is cast again
    (for the wgrad GEMM)."""
    saved = ctx.saved_tensors
    if ctx.input_kept:
        saved = (*_original_input.cast_again(ctx.fi.rs, saved[0], 0), *saved[2:])
    return saved


def _saved_fp8_tensors(ctx, saved):
    """(xq_t, x_sinv, wq_t, w_sinv) as tensors, whichever forward path saved them (the checked
    backward needs tensor objects)."""
    if ctx.plan is None:
        return saved
    kept, _, wq_t, w_sinv = saved
    return linear_step.saved_operands(ctx.plan, kept, wq_t, w_sinv, ctx.fi.rs.fwd_dtype)


def _fp8_backward_fast(ctx, nc, dy, saved):
    """dgrad and wgrad in FP8 through the step's native plan on the saved operands; with a
    weight gradient to make, dy's cast also yields the bias gradient (returned third, else None).
    The backward that finishes a delayed-scaling step launches the step's update itself."""
    _, out_features, in_features = ctx.shapes
    plan = ctx.plan
    if plan is None:  # a checked forward (checkpoint recompute) saved tensors
        xq_t, x_sinv, wq_t, w_sinv = saved
        db_dtype = ctx.bias_dtype if ctx.has_bias_grad and ctx.need_wgrad else None
        plan = _fp8_step.given_operands_plan(nc, ctx.fi.rs, dy.shape[0], in_features,
                                             out_features, ctx.dtype, wq_t, ctx.need_dgrad,
                                             ctx.need_wgrad, db_dtype)
        operands = (None, xq_t, x_sinv, wq_t, w_sinv)
    else:
        kept, _, wq_t, w_sinv = saved
        operands = (kept, None, None, wq_t, w_sinv)
    main_grad = None
    if ctx.need_wgrad and ctx.fuse:  # accumulate into the fp32 main_grad
        main_grad = _fp8_step.main_grad_of("Linear", ctx.weight)
    return linear_step.fp8_backward(nc, plan, dy, operands, ctx.dtype, ctx.bias_dtype, main_grad,
                                    _fp8_step.final_update(ctx.fi, True))


def _split_names(parameters_split, out_features):
    """[(prefix, rows)] of each named split of the weight's rows."""
    if parameters_split is None:
        return None
    if isinstance(parameters_split, dict):
        items = list(parameters_split.items())
    else:
        names = list(parameters_split)
        if out_features % len(names):
            raise ValueError(f"Linear: out_features={out_features} is not divisible into "
                             f"{len(names)} parameters_split parts")
        items = [(n, out_features // len(names)) for n in names]
    if sum(r for _, r in items) != out_features:
        raise ValueError(f"Linear: parameters_split sizes {[r for _, r in items]} do not add up to "
                         f"out_features={out_features}")
    return [(n if n.endswith("_") else n + "_", r) for n, r in items]


def split_weight_and_bias(module):
    """(weight, bias) of a module whose parameters may be split by name (parameters_split): the
    parts concatenated along the output rows."""
    if module.splits is None:
        return module.weight, module.bias
    ws = [getattr(module, p + "weight") for p, _ in module.splits]
    bs = [getattr(module, p + "bias") for p, _ in module.splits] if module.use_bias else None
    return torch.cat(ws, 0), (torch.cat(bs, 0) if bs is not None else None)


class Linear(TransformerEngineBaseModule):
    """A fully connected layer, ``y = x W^T + b``, with FP8 GEMMs inside :func:`autocast`.

    Outside an FP8 autocast the GEMM runs in the input's dtype (float32, bfloat16 or float16;
    ``torch.autocast`` is respected). Inside one, the input, the weight and the output gradient are
    cast to FP8 as the recipe says and the GEMMs run on FP8 tensor cores. FP8 runs on NVIDIA sm_89
    and newer (Ada, Hopper; OCP E4M3/E5M2), on AMD gfx942 (MI300, FNUZ formats) and gfx950 (OCP),
    and emulated on the reference backend (CPU or any device without the native library). Under FP8
    the
    number of tokens (the product of the input's leading dimensions) and both feature sizes must be
    multiples of 16.

    Parameters
    ----------
    in_features : int
        Size of the last dimension of the input.
    out_features : int
        Size of the last dimension of the output.
    sequence_parallel : bool, default False
        With tensor parallelism (``tp_size > 1``), the input and output of the module are split
        along the sequence dimension across the tensor-parallel group, and the module gathers or
        reduce-scatters them around its GEMMs. Has no effect when ``tp_size`` is 1.
    fuse_wgrad_accumulation : bool, default False
        Accumulate weight gradients into ``weight.main_grad`` (a float32 tensor the caller
        allocates, as Megatron-style optimizers do) instead of writing ``weight.grad``.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel process group. ``None`` (default) means no tensor parallelism.
    tp_size : int, default 1
        Number of ranks in ``tp_group``; taken from the group when one is given. Any
        ``torch.distributed`` backend (NCCL on NVIDIA, RCCL on AMD, gloo on the CPU).
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker`; weights are initialised under its fork so that
        tensor-parallel shards draw different random numbers. ``None`` (default) uses the global
        generator.
    rng_tracker_name : str, optional
        Name of the tracker's state to fork (default ``'model-parallel-rng'``).
    init_method : callable, optional
        Called as ``init_method(weight)`` to initialise each weight in place. Default: normal with
        mean 0 and standard deviation 0.023.
    bias : bool, default True
        Whether the layer has a learnable additive bias.
    return_bias : bool, default False
        When True the bias is not added; ``forward`` returns ``(output, bias)`` so that the caller
        can fuse the addition into a later operation.
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``): float32, bfloat16 or
        float16. The compute dtype follows the input (or ``torch.autocast``).
    parallel_mode : {None, 'column', 'row'}, default None
        How the weight is split over the tensor-parallel group: ``'column'`` splits the output
        features, ``'row'`` the input features (the outputs are then all-reduced); ``None``
        keeps the whole weight on every rank.
    skip_weight_param_allocation : bool, default False
        Create no weight or bias parameters; ``forward`` must then be given ``weight`` (and
        ``bias``) explicitly.
    parameters_split : tuple of str or dict of str to int, optional
        Register the weight (and bias) as several named parameters split along the output
        features, e.g. ``("query_", "key_", "value_")`` for equal parts or ``{"q": 64, "kv": 128}``
        for given sizes. The parts are concatenated for the GEMM.
    device : torch.device or str, optional
        Where the parameters are created: default the current CUDA/ROCm device when one exists,
        else the CPU. ``'meta'`` defers allocation: call ``to_empty()`` and then
        ``reset_parameters()`` to materialise the module.
    name : str, optional
        A name for the module, used in debug logging only.

    ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad : bool, default False
        Overlap of tensor-parallel communication with the GEMMs through NVIDIA's userbuffers.
        Not implemented: only False is accepted; True raises NotImplementedError. The
        tensor-parallel communication runs as separate ``torch.distributed`` collectives.
    ub_name : str, optional
        Name of the userbuffers communicator of this layer; stored, without effect (userbuffers
        overlap is not implemented).
    symmetric_ar_type : str, optional
        All-reduce of the row-parallel output through symmetric memory. Not implemented: only
        None is accepted (a value raises NotImplementedError); the plain
        ``torch.distributed.all_reduce`` is used.
    save_original_input : bool, default False
        Under FP8, save the input as it came (high precision) for the backward instead of its
        FP8 copy, and cast it again there for the weight-gradient GEMM: the gradients are the
        same bits, and memory drops where the caller keeps the input alive anyway. Works with
        Float8CurrentScaling and Float8BlockScaling; under DelayedScaling a call that makes a
        weight gradient raises ValueError. No effect without FP8 or under a
        ``backward_override`` (which decides what is saved).
    delay_wgrad_compute : bool, default False
        The backward computes the input gradient and queues the weight-gradient GEMMs on the
        module; :meth:`backward_dw` runs them later (pipeline
        schedules use this to fill bubbles) and then calls the hooks registered with
        :meth:`register_wgrad_accumulation_and_reduce_hooks`. The queued GEMMs keep their
        operands alive until then. The GEMM weights and biases are flagged with
        ``skip_backward_post_hook = True`` so that Megatron-style data-parallel wrappers leave
        their reduction to those hooks.

    Examples
    --------
    >>> import torch, transformer_engine.pytorch as te
    >>> from transformer_engine.common import recipe
    >>> layer = te.Linear(768, 3072)
    >>> x = torch.randn(2048, 768, device=layer.weight.device)
    >>> with te.autocast(recipe=recipe.DelayedScaling()):
    ...     y = layer(x)
    """
    fp8_slots = (2, 1)  # forward: input, weight; backward: output gradient

    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group=None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable] = None, rng_tracker_name: Optional[str] = None,
                 init_method: Optional[Callable] = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 skip_weight_param_allocation: bool = False,
                 parameters_split: Optional[Union[tuple, dict]] = None,
                 device: Union[torch.device, str, None] = None, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_name: Optional[str] = None, symmetric_ar_type: Optional[str] = None,
                 save_original_input: bool = False, name: Optional[str] = None,
                 delay_wgrad_compute: bool = False):
        super().__init__()
        check_off("Linear", ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                  ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_dgrad=ub_bulk_dgrad,
                  ub_bulk_wgrad=ub_bulk_wgrad, symmetric_ar_type=symmetric_ar_type)
        self.save_original_input = bool(save_original_input)
        _parallel.check_parallel_mode("Linear", parallel_mode)
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.tp_group = tp_group
        self.tp_size = _parallel.resolve_tp(tp_group, tp_size)
        self.parallel_mode = parallel_mode
        self.sequence_parallel = sequence_parallel and self.tp_size > 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.return_bias = return_bias
        self.use_bias = bias
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.name = name
        self.in_features, self.out_features = _parallel.split_features(
            "Linear", in_features, out_features, parallel_mode, self.tp_size)
        self.init_method = init_method or default_init_method()
        device = default_device(device)
        self.splits = _split_names(parameters_split, self.out_features)
        self.skip_weight_param_allocation = skip_weight_param_allocation
        if not skip_weight_param_allocation:
            self._make_params(device)
        else:
            self.weight = self.bias = None
        _wgrad.mark_delayed_params(self)

    def _make_params(self, device):
        shape_in = self.in_features
        if self.splits is None:
            self.weight = self.make_weight((self.out_features, shape_in), self.params_dtype, device,
                                           self._init_weight)
            self.bias = (torch.nn.Parameter(torch.zeros(self.out_features, dtype=self.params_dtype,
                                                        device=device)) if self.use_bias else None)
            self._mark_parallel(self.weight, self.bias)
            return
        self.weight = self.bias = None
        # every weight, then every bias: NVIDIA TE's registration order (state_dict keys and
        # optimizer state line up with its checkpoints)
        for prefix, rows in self.splits:
            self.register_parameter(prefix + "weight", self.make_weight(
                (rows, shape_in), self.params_dtype, device, self._init_weight))
        for prefix, rows in self.splits:
            b = (torch.nn.Parameter(torch.zeros(rows, dtype=self.params_dtype, device=device))
                 if self.use_bias else None)
            self.register_parameter(prefix + "bias", b)
            self._mark_parallel(getattr(self, prefix + "weight"), b)

    def _mark_parallel(self, w, b):
        if self.parallel_mode in ("column", "row"):
            dist_te.set_tensor_model_parallel_attributes(w, True, 0 if self.parallel_mode == "column" else 1, 1)
            if b is not None and self.parallel_mode == "column":
                dist_te.set_tensor_model_parallel_attributes(b, True, 0, 1)
        if b is not None and self.parallel_mode == "row" and self.sequence_parallel:
            b.sequence_parallel = True

    def reset_parameters(self, defer_init: bool = False) -> None:
        """(Re)initialise the parameters in place.

        Weights get ``init_method``, biases zeros. Use it after creating the module on
        ``device='meta'`` and calling ``to_empty()``. Under :func:`quantized_model_init` the
        weights are
        then stored in FP8.

        Parameters
        ----------
        defer_init : bool, default False
            When True, do nothing (initialisation is left to a later call).
        """
        if defer_init:
            return
        with torch.no_grad():
            for n, p in self.named_parameters(recurse=False):
                if n.endswith("weight"):
                    self._init_weight(p)
                else:
                    p.zero_()
        self._quantize_deferred_weights()

    def _weight_and_bias(self):
        return split_weight_and_bias(self)

    def _fp8_sequence_gather(self, fi, inp, residual):
        """The sequence-parallel group (a _parallel.NormTP) when this column-parallel call gathers
        its input in FP8 inside its GEMM step, else None (the gather stays before the step, in
        high precision: no FP8, a scale the ranks may not share, an empty input, a residual
        to add in the GEMM, whose shape is checked against the gathered input, or
        save_original_input, which keeps the gathered high-precision rows for wgrad)."""
        if fi is None or not self.sequence_parallel or self.tp_size == 1:
            return None
        if residual is not None or inp.numel() == 0 or self.save_original_input:
            return None
        tp = _parallel.NormTP(self.tp_group, self.tp_size, True, True)
        return tp if fp8_gather_applies(fi, tp) else None

    def residual_in_gemm(self, residual: torch.Tensor, inp: torch.Tensor) -> bool:
        """Whether a residual connection around this layer can be added inside its GEMM.

        True when the output has the residual's shape and device, the bias is added by the layer
        (no ``return_bias``) and no row-parallel all-reduce follows the GEMM (a row-parallel
        sequence-parallel layer reduce-scatters its output in blocks, and the GEMM of this
        rank's block adds the residual). Used by :class:`TransformerLayer` to fuse its residual
        adds.

        Parameters
        ----------
        residual : torch.Tensor
            The tensor that would be added to the output.
        inp : torch.Tensor
            The input that would be passed to ``forward``.
        """
        lead = tuple(inp.shape[:-1])
        if self.parallel_mode == "row" and self.tp_size > 1 and self.sequence_parallel:
            if not lead or lead[0] % self.tp_size:
                return False
            lead = (lead[0] // self.tp_size, *lead[1:])  # this rank's rows of the output
        return self.residual_fits_output(residual, lead, inp.device)

    def residual_fits_output(self, residual: torch.Tensor, out_lead: tuple,
                             device: torch.device) -> bool:
        """:meth:`residual_in_gemm` for an output whose leading dimensions are known before the
        input is: for a caller such as :class:`MultiheadAttention`, whose projection's output
        has its input's rows.

        Parameters
        ----------
        residual : torch.Tensor
            The residual that would be passed as ``_residual``.
        out_lead : tuple of int
            The output's leading dimensions (all but the last), this rank's rows under
            sequence parallelism.
        device : torch.device
            The device of the input that would be passed to ``forward``.

        Returns
        -------
        bool
            Whether the residual can be added inside the GEMM.
        """
        return (not self.return_bias
                and not (self.parallel_mode == "row" and self.tp_size > 1
                         and not self.sequence_parallel)
                and residual.shape == (*out_lead, self.out_features)
                and residual.device == device)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                fp8_output: bool = False, fp8_grad: bool = False, *,
                _residual: Optional[torch.Tensor] = None):
        """Apply the layer to ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            Input of shape ``[..., in_features]``, float32, bfloat16 or float16.
        is_first_microbatch : bool, optional
            With gradient accumulation over micro-batches: ``True`` on the first micro-batch of a
            step
            (the FP8 copy of the weight is cast and cached), ``False`` on the later ones (the cached
            copy is reused, as the weights do not change within a step). ``None`` (default) casts
            the
            weight on every call.
        weight : torch.Tensor, optional
            The weight ``[out_features, in_features]`` to use; required (only) when the module was
            made with ``skip_weight_param_allocation=True``.
        bias : torch.Tensor, optional
            The bias ``[out_features]`` to use together with ``weight``.
        fp8_output : bool, default False
            Accepted for compatibility with NVIDIA Transformer Engine's API; the output is returned
            in
            the activation dtype.
        fp8_grad : bool, default False
            Accepted for compatibility; the input gradient is returned in the activation dtype.

        Returns
        -------
        torch.Tensor or tuple
            The output ``[..., out_features]``; ``(output, bias)`` with ``return_bias``.
        """
        if self.skip_weight_param_allocation:
            if weight is None:
                raise ValueError("Linear: skip_weight_param_allocation=True needs the weight passed "
                                 "to forward(inp, weight=..., bias=...)")
        elif self.splits is None:
            # registered parameters read directly (nn.Module.__getattr__'s fallback costs more host
            # time than the lookup); the attributes when something else provides them (a
            # parametrization's property, a bias of None)
            params = self._parameters
            weight = params.get("weight")
            if weight is None:
                weight = self.weight
            bias = params["bias"] if "bias" in params else self.bias
        else:
            weight, bias = self._weight_and_bias()
        if inp.shape[-1] != weight.shape[1]:
            raise ValueError(f"Linear: input has shape {tuple(inp.shape)}; expected last dimension "
                             f"{weight.shape[1]} (in_features)")
        check_on_input_device("te.Linear", inp, (("weight", weight), ("bias", bias)))
        # the parallel layout's checks come before any FP8 step bookkeeping (fp8_call_info)
        if self.parallel_mode == "row":
            _parallel.check_row_input(inp, self.tp_group, self.tp_size, self.sequence_parallel)
        elif self.parallel_mode == "column" and self.tp_size > 1:
            _parallel.require_group(self.tp_group, self.tp_size)
        recipe = _blockwise.active()
        fi = self.fp8_call_info(inp.device) if recipe is None else None
        sp = None
        if self.parallel_mode == "column":
            sp = self._fp8_sequence_gather(fi, inp, _residual)
            if sp is None:
                inp = _parallel.column_input(inp, self.tp_group, self.tp_size,
                                             self.sequence_parallel)
        dtype = self.activation_dtype(inp)
        if recipe is not None:  # Float8BlockScaling: its own GEMMs (see module_parts/blockwise.py)
            out = _blockwise.linear("Linear", self, recipe, inp, weight,
                                    None if self.return_bias else bias, dtype)
            out = out if _residual is None else _residual + out
            if self.return_bias:
                return out, (bias.to(out.dtype) if bias is not None else None)
            return out
        if self.save_original_input:
            _original_input.check_recipe("Linear", self, fi, (weight,))
        # row parallel + SP: the call reduce-scatters its own output, its bias and residual
        # added by this rank's block (its rows were checked by check_row_input above, before
        # any collective); row parallel otherwise: the bias after the all-reduce
        rs = (_parallel.NormTP(self.tp_group, self.tp_size, True, True)
              if self.parallel_mode == "row" and self.sequence_parallel and self.tp_size > 1
              else None)
        add_bias_in_gemm = bias is not None and not self.return_bias and not (
            self.parallel_mode == "row" and self.tp_size > 1 and rs is None)
        # delay_wgrad_compute: the checked path, whose backward can queue the wgrad GEMM;
        # save_original_input under FP8: the checked path, which can save the input unquantized
        nc = (eager.native_call(inp) if eager.usable(fi) and not self.delay_wgrad_compute
              and sp is None and not (self.save_original_input and fi.fp8) else None)
        # eager native calls skip Function.apply's Python wrapper (its default-argument binding
        # and functorch checks cost more host time than the rest of the call)
        apply = (_RAW_APPLY if nc is not None and not torch._C._are_functorch_transforms_active()
                 else _LinearFn.apply)
        if _residual is not None and not self.residual_in_gemm(_residual, inp):
            raise ValueError("Linear: _residual needs a residual of the output's shape, no "
                             "return_bias and no row-parallel split without sequence "
                             "parallelism (see residual_in_gemm)")
        # a residual of another dtype than the GEMM's output keeps torch's type promotion: added after
        fused = _residual if _residual is not None and _residual.dtype == dtype else None
        out = apply(inp, weight, bias if add_bias_in_gemm else None, fused,
                    (self, fi, dtype, is_first_microbatch, self.fuse_wgrad_accumulation, nc, sp, rs))
        if _residual is not None and fused is None:
            out = _residual + out
        if self.parallel_mode == "row":
            if rs is None:  # with it, the call reduce-scattered its own output
                out = _parallel.row_output(out, self.tp_group, self.tp_size, self.sequence_parallel)
            if bias is not None and not add_bias_in_gemm and not self.return_bias:
                out = out + bias.to(out.dtype)
        if self.return_bias:
            return out, (bias.to(out.dtype) if bias is not None else None)
        return out
