"""te.LayerNormLinear: y = norm(x) @ W.T + b (LayerNorm or RMSNorm) as one autograd Function.

FP8 with delayed scaling: the norm kernel writes FP8 directly (its output never exists in high
precision) and a 1-byte transpose feeds wgrad; current scaling normalises in high precision,
then casts and transposes in one pass. Backward: dgrad GEMM, then the norm backward; in eager mode
on the native core the cast of the output gradient and both GEMMs run as one call of the Linear
step's plan (module_parts/fp8_step_backward.py)."""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .. import quantization as q
from ..library import gemm as _gemms
from ..library.activation import bias_grad_of
from ..library.cast import cast, cast_grad, record_amax
from ..library.normalization import norm_backward, norm_fp8, norm_hp
from ..module_parts import (blockwise as _blockwise, fp8_step_backward as _fp8_step,
                           parallel as _parallel, wgrad as _wgrad)
from ..module_parts.input_check import check_fp8_dims, check_on_input_device
from ..module_parts.norm_args import check_normalization, param_for, reset_norm_params
from ..module_parts.nv_options import check_off
from ..module_parts.gather_gemm import (PendingRows, fp8_blocks_fit, gemm_over_gather,
                                        start_gather_rows)
from ..module_parts import side_stream, weight_cast_beside
from ..module_parts.sequence_parallel_fp8 import (PendingFP8Rows, arrived, fp8_amax_group,
                                                 fp8_gather_applies, start_fp8_gather)
from .base import (TransformerEngineBaseModule, default_device, default_init_method, fp8_weight,
                   hp_weight)
from .linear import _split_names, split_weight_and_bias


def norm_for_gemm(module, x2d, gamma, beta, fi, fp8, need_transpose, keep_hp, tp):
    """The norm step of LayerNormLinear / LayerNormMLP with its tensor-parallel gather (see
    _parallel.NormTP): (norm output on this rank's rows [high precision, or None when it was
    written straight to FP8], GEMM input [FP8 data or high precision, all rows], its FP8
    transpose or None, its scale_inv or None, mu, rsigma). A sequence-parallel gather is left
    in flight: the GEMM input is then a PendingFP8Rows or PendingRows (and the transpose None),
    which the caller hands to gather_gemm.gemm_over_gather (its GEMM starts on this rank's rows)
    or passes through `arrived`."""
    norm, eps, zcg = module.normalization, module.eps, module.zero_centered_gamma
    if fp8 and not tp.gather:
        ln_out, q, q_t, sinv, mu, rsigma = norm_fp8(norm, x2d, gamma, beta, eps, zcg, fi, 0,
                                                    need_transpose, keep_hp)
        return ln_out, q, q_t, sinv, mu, rsigma
    if fp8 and fp8_gather_applies(fi, tp):
        # this rank's rows in FP8 (the norm writes them directly under delayed scaling), then
        # the 1-byte gather and the transpose of the gathered rows. keep_hp
        # (return_layernorm_output) still gathers FP8: the module returns this rank's own
        # high-precision rows, which need no gather
        ln_out, q, _, sinv, mu, rsigma = norm_fp8(norm, x2d, gamma, beta, eps, zcg, fi, 0, False,
                                                  keep_hp, fp8_amax_group(fi, tp))
        pending = start_fp8_gather(q, tp, need_transpose, async_op=True,
                                   transpose_beside=True)
        return ln_out, pending, None, sinv, mu, rsigma
    res = norm_hp(norm, x2d, gamma, beta, eps, zcg)
    if not fp8 and tp.gather and not torch.compiler.is_compiling():
        # left in flight: the caller's GEMM starts on this rank's rows (gather_gemm.py)
        return res.out, start_gather_rows(res.out, tp), None, None, res.mu, res.rsigma
    full = tp.gather_rows(res.out)
    if not fp8:
        return res.out, full, None, None, res.mu, res.rsigma
    # delayed scaling whose scales the step does not reduce over the group: the gathered rows
    # are cast after the gather, every rank's rows with one scale
    q, q_t, sinv = cast(fi.rs, full, True, 0, need_transpose, fi.replay, fi.record)
    return res.out, q, q_t, sinv, res.mu, res.rsigma

class _LayerNormLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, ln_weight, ln_bias, weight, bias, module, fi, dtype, is_first_microbatch,
                return_ln_out, pass_input):
        # pass_input: also return inp itself (a view), for a residual connection around the
        # block that starts here; its gradient then comes back to this backward, which adds it
        # into dx in the norm kernel instead of autograd adding it in a kernel of its own
        out_features, in_features = weight.shape
        x2d = inp.reshape(-1, in_features)
        x2d = (x2d if x2d.dtype == dtype else x2d.to(dtype)).contiguous()
        g, b = param_for(ln_weight, x2d), param_for(ln_bias, x2d)
        # under inference_mode no backward can follow (parameters still say requires_grad;
        # a traced graph cannot ask, and keeps what a backward needs)
        training = torch.compiler.is_compiling() or not torch.is_inference_mode_enabled()
        need_wgrad = training and weight.requires_grad
        need_dgrad = training and (inp.requires_grad or ln_weight.requires_grad
                                   or (ln_bias is not None and ln_bias.requires_grad))
        tp = module.norm_tp()
        tokens = x2d.shape[0] * (tp.size if tp.gather else 1)
        fp8 = fi.fp8 and tokens > 0
        w8 = None
        if fp8:
            check_fp8_dims(type(module).__name__, tokens, in_features, out_features)

            def cast_weight():
                return fp8_weight(module, weight, fi, 1, need_dgrad, is_first_microbatch)
            w8 = weight_cast_beside.cast_first(module, 1, cast_weight)
        ln_out, gemm_in, gemm_in_t, ln_sinv, mu, rsigma = norm_for_gemm(
            module, x2d, g, b, fi, fp8, need_wgrad, return_ln_out, tp)
        if fp8:
            wq, wq_t, w_sinv = w8 or cast_weight()
            # the norm wrote the GEMM's FP8 input and its transpose: the forward's FP8 step is
            # this one GEMM (the plan's forward would add only the weight's cast, a call of its own)
            if isinstance(gemm_in, PendingFP8Rows) and fp8_blocks_fit(gemm_in):
                # the gather hides under this rank's block (gather_gemm.py)
                y = x2d.new_empty((tokens, out_features))
                gemm_in, gemm_in_t = gemm_over_gather(gemm_in, (y,), lambda rows, o: _gemms.fprop_fp8(
                    wq, w_sinv, rows, ln_sinv, dtype, bias, out=o[0]))
            else:
                gemm_in, gemm_in_t = arrived(gemm_in, gemm_in_t)
                y = _gemms.fprop_fp8(wq, w_sinv, gemm_in, ln_sinv, dtype, bias).out
            ctx.save_for_backward(x2d, mu, rsigma, g, gemm_in_t, ln_sinv, wq_t, w_sinv)
        else:
            w = hp_weight(weight, dtype)
            if isinstance(gemm_in, PendingRows):  # its gather hides under this rank's block
                y = x2d.new_empty((tokens, out_features))
                gemm_in = gemm_over_gather(gemm_in, (y,), lambda rows, o: _gemms.fprop_hp(
                    w, rows, bias, out=o[0]))
            else:
                y = _gemms.fprop_hp(w, gemm_in, bias)
            if fi.calibrating:
                record_amax(fi.rs, gemm_in, True, 0)
                record_amax(fi.rs, w, True, 1)
            ctx.save_for_backward(x2d, mu, rsigma, g, gemm_in, None, w, None)
        ctx.tp = tp
        ctx.fp8, ctx.fi, ctx.dtype, ctx.module = fp8, fi, dtype, module
        ctx.need_dgrad, ctx.need_wgrad = need_dgrad, need_wgrad
        ctx.has_bias_grad = bias is not None and bias.requires_grad
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.ln_dtypes = (ln_weight.dtype, ln_bias.dtype if ln_bias is not None else None)
        ctx.weight = weight if module.fuse_wgrad_accumulation or module.delay_wgrad_compute else None
        ctx.shapes = (inp.shape, out_features, in_features)
        ctx.return_ln_out, ctx.pass_input = return_ln_out, pass_input
        y = y.view(-1, *inp.shape[1:-1], out_features)
        outputs = (y,) + ((ln_out.view(inp.shape),) if return_ln_out else ())
        outputs += (inp.view_as(inp),) if pass_input else ()
        return outputs if len(outputs) > 1 else y

    @staticmethod
    def backward(ctx, grad_out, *grad_extra):
        side_stream.join()  # a gathered input's transpose made beside the forward
        grad_ln_out = grad_extra[:1] if ctx.return_ln_out else ()
        grad_input = grad_extra[-1] if ctx.pass_input else None
        inp_shape, out_features, in_features = ctx.shapes
        module, fi = ctx.module, ctx.fi
        dy = grad_out.reshape(-1, out_features)
        dy = (dy if dy.dtype == ctx.dtype else dy.to(ctx.dtype)).contiguous()
        x2d, mu, rsigma, g, ln_saved, ln_sinv, w_saved, w_sinv = ctx.saved_tensors
        db_dtype = ctx.bias_dtype if ctx.has_bias_grad else None
        db = None
        dln = dw = None
        fuse = module.fuse_wgrad_accumulation
        # dgrad first: its tensor-parallel reduction (pending) then runs under the wgrad GEMM
        pending = None
        counted = False  # the step counted this backward as finished (backward_casts_done)
        nc = _fp8_step.plan_call(fi, dy, ctx.tp, module.delay_wgrad_compute) if ctx.fp8 else None
        if nc is not None:  # cast of dy (+ bias gradient), dgrad, wgrad: one native call
            dln, dw, db = _fp8_step.fp8_backward(
                "LayerNormLinear", nc, fi, dy, (ln_saved, ln_sinv, w_saved, w_sinv),
                (out_features, in_features), ctx.dtype, db_dtype, ctx.need_dgrad, ctx.need_wgrad,
                ctx.weight, fuse, True)
            pending = ctx.tp.start_reduce_grad(dln) if ctx.need_dgrad else None
        elif ctx.fp8:
            dyq, dyq_t, dy_sinv, db = cast_grad(fi, dy, ctx.need_wgrad, db_dtype)
            counted = q.backward_casts_done(fi.step, dy.device)
            # the weight gradient runs under the end of dgrad's reduction (dgrad_and_reduce)
            wgrad = (lambda: _wgrad.weight_grad(module, ctx.weight, fuse, lambda: _gemms.wgrad_fp8(
                ln_saved, ln_sinv, dyq_t, dy_sinv, ctx.dtype, ctx.weight, fuse))
            ) if ctx.need_wgrad else None
            if ctx.need_dgrad:
                pending, dw = ctx.tp.dgrad_and_reduce(dyq, in_features, ctx.dtype, lambda rows, o: (
                    _gemms.dgrad_fp8(w_saved, w_sinv, rows, dy_sinv, ctx.dtype, out=o)), 16, wgrad)
            elif wgrad is not None:
                dw = wgrad()
        else:
            if fi.calibrating:
                record_amax(fi.rs, dy, False, 0)

            def wgrads():  # (dw, db or None), under the end of dgrad's reduction as above
                if ctx.need_wgrad and db_dtype is not None and not module.delay_wgrad_compute:
                    dw_, db_ = _gemms.wgrad_bgrad_hp(ln_saved, dy, ctx.weight, fuse, out_features,
                                                     in_features, db_dtype)
                    return _wgrad.autograd_weight_grad(ctx.weight, dw_, fuse), db_
                if ctx.need_wgrad:
                    return _wgrad.weight_grad(module, ctx.weight, fuse, lambda: _gemms.wgrad_hp(
                        ln_saved, dy, ctx.weight, fuse, out_features, in_features)), None
                return None, None

            def dgrad(rows, o):
                _gemms.dgrad_hp(w_saved, rows, out=o)
            if ctx.need_dgrad:
                pending, (dw, db) = ctx.tp.dgrad_and_reduce(dy, in_features, ctx.dtype, dgrad, 1,
                                                            wgrads)
            else:
                dw, db = wgrads()
            if db_dtype is not None and db is None:
                db = bias_grad_of(dy, db_dtype)
        if fi.step is not None and not counted:
            fi.step.backward_finished()
        dx = dgamma = dbeta = None
        if ctx.need_dgrad:
            dln = pending.wait()
            if grad_ln_out and grad_ln_out[0] is not None:
                dln = dln + grad_ln_out[0].reshape(dln.shape).to(dln.dtype)
            dres = None
            if grad_input is not None:
                dres = grad_input.reshape(x2d.shape)
                dres = (dres if dres.dtype == x2d.dtype else dres.to(x2d.dtype)).contiguous()
            dx, dgamma, dbeta = norm_backward(module.normalization, dln.contiguous(), x2d, mu, rsigma,
                                              g, module.zero_centered_gamma, dres)
            dx = dx.view(inp_shape)
            dgamma = dgamma.to(ctx.ln_dtypes[0])
            dbeta = dbeta.to(ctx.ln_dtypes[1]) if dbeta is not None and ctx.ln_dtypes[1] else None
        elif grad_input is not None:  # no norm backward to ride: the input's gradient is its own
            dx = grad_input
        return dx, dgamma, dbeta, dw, db, None, None, None, None, None, None


class LayerNormLinear(TransformerEngineBaseModule):
    """A normalisation (LayerNorm or RMSNorm) followed by a linear layer, fused.

    Computes ``y = norm(x) W^T + b``. Under FP8 the norm kernel writes its output directly in FP8
    (and its transpose for the weight gradient), so the normalised activations never round-trip
    through memory in high precision. FP8 runs on NVIDIA sm_89 and newer (Ada, Hopper; OCP
    E4M3/E5M2), on AMD gfx942 (MI300, FNUZ formats) and gfx950 (OCP), and emulated on the reference
    backend (CPU or any device without the native library). Under FP8 the token count and both
    feature sizes
    must be multiples of 16.

    Parameters
    ----------
    in_features : int
        Size of the last dimension of the input (the normalised dimension).
    out_features : int
        Size of the last dimension of the output.
    eps : float, default 1e-5
        Added to the variance (or mean square) before the square root.
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
    normalization : {'LayerNorm', 'RMSNorm'}, default 'LayerNorm'
        The normalisation applied to the input.
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``): float32, bfloat16 or
        float16. The compute dtype follows the input (or ``torch.autocast``).
    parallel_mode : {None, 'column'}, default None
        ``'column'`` splits the output features over the tensor-parallel group; ``None`` keeps
        the whole weight on every rank. (A row split is not supported after a norm.)
    return_layernorm_output : bool, default False
        Also return the normalised input: ``forward`` returns ``(output, norm_output)`` (after the
        bias, if ``return_bias``), e.g. to use it as a residual.
    return_layernorm_output_gathered : bool, default False
        With sequence parallelism, return the norm output after the all-gather over the sequence
        dimension rather than the local shard.
    parameters_split : tuple of str or dict of str to int, optional
        Register the weight (and bias) as several named parameters split along the output
        features, e.g. ``("query_", "key_", "value_")`` for equal parts or ``{"q": 64, "kv": 128}``
        for given sizes. The parts are concatenated for the GEMM.
    zero_centered_gamma : bool, default False
        Store the norm's scale as ``gamma - 1`` (initialised to zero), which keeps it precise in low
        precision formats; the output is ``... * (1 + gamma)``.
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
    delay_wgrad_compute : bool, default False
        The backward computes the input gradient and queues the weight-gradient GEMMs on the
        module; :meth:`backward_dw` runs them later (pipeline
        schedules use this to fill bubbles) and then calls the hooks registered with
        :meth:`register_wgrad_accumulation_and_reduce_hooks`. The queued GEMMs keep their
        operands alive until then. The GEMM weights and biases are flagged with
        ``skip_backward_post_hook = True`` so that Megatron-style data-parallel wrappers leave
        their reduction to those hooks.
    """
    fp8_slots = (2, 1)

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group=None, tp_size: int = 1, get_rng_state_tracker: Optional[Callable] = None,
                 rng_tracker_name: Optional[str] = None, init_method: Optional[Callable] = None,
                 bias: bool = True, normalization: str = "LayerNorm", return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False,
                 parameters_split: Optional[Union[tuple, dict]] = None,
                 zero_centered_gamma: bool = False, device: Union[torch.device, str, None] = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_name: Optional[str] = None,
                 symmetric_ar_type: Optional[str] = None, name: Optional[str] = None,
                 delay_wgrad_compute: bool = False):
        super().__init__()
        check_off("LayerNormLinear", ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                  ub_overlap_rs_dgrad=ub_overlap_rs_dgrad, ub_bulk_wgrad=ub_bulk_wgrad,
                  ub_bulk_dgrad=ub_bulk_dgrad, symmetric_ar_type=symmetric_ar_type)
        check_normalization("LayerNormLinear", normalization)
        if parallel_mode == "row":
            raise ValueError("LayerNormLinear: parallel_mode='row' is not supported (the norm needs "
                             "the full hidden dimension); use 'column' or None")
        _parallel.check_parallel_mode("LayerNormLinear", parallel_mode)
        self.normalization, self.eps, self.zero_centered_gamma = normalization, eps, zero_centered_gamma
        self.tp_group = tp_group
        self.tp_size = _parallel.resolve_tp(tp_group, tp_size)
        self.parallel_mode = parallel_mode
        self.sequence_parallel = sequence_parallel and self.tp_size > 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.return_bias, self.use_bias = return_bias, bias
        self.return_layernorm_output = return_layernorm_output
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.in_features = in_features
        _, self.out_features = _parallel.split_features("LayerNormLinear", in_features, out_features,
                                                        parallel_mode, self.tp_size)
        self.init_method = init_method or default_init_method()
        self.name = name
        device = default_device(device)
        dt = self.params_dtype
        self.layer_norm_weight = torch.nn.Parameter(torch.empty(in_features, dtype=dt, device=device))
        self.layer_norm_bias = (torch.nn.Parameter(torch.empty(in_features, dtype=dt, device=device))
                                if normalization == "LayerNorm" else None)
        for p in (self.layer_norm_weight, self.layer_norm_bias):
            if p is not None:
                p.sequence_parallel = self.sequence_parallel
        self.splits = _split_names(parameters_split, self.out_features)
        if self.splits is None:
            self.weight = self.make_weight((self.out_features, in_features), dt, device, self._init_weight)
            self.bias = (torch.nn.Parameter(torch.zeros(self.out_features, dtype=dt, device=device))
                         if bias else None)
        else:
            self.weight = self.bias = None
            # every weight, then every bias (NVIDIA TE's order)
            for prefix, rows in self.splits:
                self.register_parameter(prefix + "weight", self.make_weight(
                    (rows, in_features), dt, device, self._init_weight))
            for prefix, rows in self.splits:
                self.register_parameter(prefix + "bias", torch.nn.Parameter(
                    torch.zeros(rows, dtype=dt, device=device)) if bias else None)
        if device.type != "meta":
            self._reset_norm()
        _wgrad.mark_delayed_params(self)

    def norm_tp(self):
        """The tensor-parallel layout of the norm's input.

        How the fused norm gathers a sequence-parallel input before the GEMM (nothing to do
        without tensor parallelism).
        """
        if self.parallel_mode != "column" or self.tp_size == 1:
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
            for n, p in self.named_parameters(recurse=False):
                if n.startswith("layer_norm"):
                    continue
                if n.endswith("weight"):
                    self._init_weight(p)
                else:
                    p.zero_()
        self._quantize_deferred_weights()

    def _weight_and_bias(self):
        return split_weight_and_bias(self)

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: bool = False, fp8_grad: bool = False, *, _pass_input: bool = False):
        """Apply the norm and the linear layer to ``inp``.

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
        fp8_output : bool, default False
            Accepted for compatibility with NVIDIA Transformer Engine's API; the output is returned
            in
            the activation dtype.
        fp8_grad : bool, default False
            Accepted for compatibility; the input gradient is returned in the activation dtype.

        Returns
        -------
        torch.Tensor or tuple
            The output ``[..., out_features]``; with ``return_bias`` also the bias, and with
            ``return_layernorm_output`` also the norm's output, in that order.
        """
        pass_input = _pass_input and (self.activation_dtype(inp) == inp.dtype
                                      and self.norm_tp() is _parallel.NO_TP
                                      and not torch.compiler.is_compiling())
        if inp.shape[-1] != self.in_features:
            raise ValueError(f"LayerNormLinear: input has shape {tuple(inp.shape)}; expected last "
                             f"dimension {self.in_features} (in_features)")
        check_on_input_device("te.LayerNormLinear", inp, self._parameters.items())
        weight, bias = self._weight_and_bias()
        dtype = self.activation_dtype(inp)
        recipe = _blockwise.active()
        if recipe is not None:  # Float8BlockScaling: its own GEMMs (see module_parts/blockwise.py)
            y, block_ln_out = _blockwise.layernorm_linear(self, recipe, inp, dtype)
            out = (y, block_ln_out.view(inp.shape)) if self.return_layernorm_output else y
            pass_input = False
        else:
            fi = self.fp8_call_info(inp.device)
            gemm_bias = bias if not self.return_bias else None
            out = _LayerNormLinearFn.apply(inp, self.layer_norm_weight, self.layer_norm_bias,
                                           weight, gemm_bias, self, fi, dtype, is_first_microbatch,
                                           self.return_layernorm_output, pass_input)
        ln_out = None
        passed = inp
        if pass_input:
            *out, passed = out
            out = tuple(out) if len(out) > 1 else out[0]
        if self.return_layernorm_output:
            out, ln_out = out
        if self.return_bias:
            out = (out, bias.to(out.dtype) if bias is not None else None)
        if self.return_layernorm_output:
            out = (*out, ln_out) if self.return_bias else (out, ln_out)
        return (out, passed) if _pass_input else out
