"""Linear, LayerNormLinear, LayerNormMLP and GroupedLinear for the recipes whose GEMMs are
sequenced here rather than by the modules' fused paths: Float8BlockScaling, and any recipe with a
``backward_override`` (Float8CurrentScaling or Float8BlockScaling).

Float8BlockScaling quantises each GEMM operand in blocks along its reduction dimension, from its
own values at every call (no FP8 state in the module):
    fprop  y  = x @ W.T    A = W   (w_block_scaling_dim),    B = x  (x_block_scaling_dim)
    dgrad  dx = dy @ W     A = W.T (the weight's transposed copy), B = dy (grad_block_scaling_dim)
    wgrad  dW = dy.T @ x   A = x.T (the input's transposed copy),  B = dy.T
The transposed copies are quantised from the high-precision tensor along their own rows (not
transposed FP8 bytes), so every GEMM sees blocks along its k.

backward_override keeps the forward GEMM in FP8 (blocks, or one current-scaling scale per
tensor) and runs dgrad and wgrad in the activation dtype, dy unquantised, on the forward's
operands: the unquantised ones ('high_precision', saved as they are) or the FP8 ones the forward
multiplied, dequantised ('dequantized', saved in FP8).

The norm and the activation are the modules' differentiable high-precision ops; only the GEMMs
are handled here (kernels/blockwise.py and kernels/gemm.py: native on the GPU, the reference
elsewhere).
"""
from __future__ import annotations

import torch

from ..kernels import blockwise as B
from ..kernels.activation import CLAMPED_SWIGLU, apply_activation, apply_clamped_swiglu
from ..kernels.normalization import layernorm, rmsnorm
from ..kernels.cast import dequantize_reference
from ..kernels.gemm import general_gemm
from ..module.base import hp_weight
from ..quantization import FP8GlobalState, recipe_fp8_dtypes
from ..tensor import Float8BlockwiseQTensor
from ..tensor.current_scaling import quantize_current
from . import wgrad as _wgrad
from .norm_args import param_for


def active():
    """The recipe when an FP8 autocast is on whose GEMMs this file sequences (Float8BlockScaling,
    or a backward_override), else None."""
    s = FP8GlobalState
    r = s.recipe
    if not s.enabled or r is None:
        return None
    if r.float8_block_scaling() or getattr(r, "backward_override", None) is not None:
        return r
    return None


def _what(recipe) -> str:
    if recipe.float8_block_scaling() and recipe.backward_override is None:
        return "Float8BlockScaling"
    return f"{type(recipe).__name__}(backward_override={recipe.backward_override!r})"


def _check_supported(who: str, module, recipe, tokens: int, in_features: int, out_features: int):
    if getattr(module, "tp_size", 1) > 1:
        raise NotImplementedError(f"{who}: {_what(recipe)} with tensor parallelism "
                                  f"(tp_size={module.tp_size}) is not supported")
    if tokens % 16 or in_features % 16 or out_features % 16:
        raise ValueError(f"{who}: FP8 GEMMs need the token count ({tokens}), in_features "
                         f"({in_features}) and out_features ({out_features}) to be multiples of 16")


class _BlockLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, dtype, module):
        fwd, bwd = recipe_fp8_dtypes(recipe, x2d.device)
        need_dgrad, need_wgrad = x2d.requires_grad, weight.requires_grad
        override = recipe.backward_override
        # save_original_input (see module_parts/original_input.py): x itself is saved, its transposed
        # copy made in the backward
        keep_input = (getattr(module, "save_original_input", False) and need_wgrad
                      and override is None)
        # transposed copies only for FP8 backward GEMMs
        xq, xq_t = B.quantize_blockwise(x2d, fwd, recipe.x_block_scaling_dim,
                                        recipe.fp8_quant_fwd_inp.power_2_scale,
                                        need_wgrad and override is None and not keep_input)
        if _stored_tiles(weight, recipe, fwd):  # an FP8 weight (quantized_model_init)
            wq, wq_t = weight.blocks()
            w = weight.dequantize(dtype) if override is not None else None
        else:
            w = hp_weight(weight, dtype)
            wq, wq_t = B.quantize_blockwise(w, fwd, recipe.w_block_scaling_dim,
                                            recipe.fp8_quant_fwd_weight.power_2_scale,
                                            need_dgrad and override is None)
        y = B.gemm_blockwise(wq, xq, dtype, bias)
        if override is not None:
            ctx.override = _Operands(override, x2d, w, xq, wq, need_dgrad, need_wgrad, dtype)
        ctx.saved = (x2d if keep_input else xq_t, wq_t)
        ctx.keep_input, ctx.fwd = keep_input, fwd
        ctx.wgrad = _WgradTarget(module, weight)
        ctx.recipe, ctx.dtype, ctx.bwd = recipe, dtype, bwd
        ctx.need = (need_dgrad, need_wgrad, bias is not None and bias.requires_grad)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        xq_t, wq_t = ctx.saved
        ctx.saved = None
        need_dgrad, need_wgrad, need_db = ctx.need
        recipe = ctx.recipe
        dy = dy.to(ctx.dtype).contiguous()
        db = dy.float().sum(0).to(ctx.bias_dtype) if need_db else None
        if recipe.backward_override is not None:
            dx, dw = ctx.override.grads(dy, B.dequantize_blockwise, ctx.wgrad)
            return dx, dw, db, None, None, None
        if ctx.keep_input:  # the forward's quantisation again: the values alone decide it
            xq_t = B.quantize_blockwise(xq_t, ctx.fwd, recipe.x_block_scaling_dim,
                                        recipe.fp8_quant_fwd_inp.power_2_scale, True)[1]
        dyq, dyq_t = B.quantize_blockwise(dy, ctx.bwd, recipe.grad_block_scaling_dim,
                                          recipe.fp8_quant_bwd_grad.power_2_scale, need_wgrad)
        dx = B.gemm_blockwise(wq_t, dyq, ctx.dtype) if need_dgrad else None
        dw = (ctx.wgrad.deliver(lambda out: B.gemm_blockwise(xq_t, dyq_t, out), ctx.dtype)
              if need_wgrad else None)
        return dx, dw, db, None, None, None


def _stored_tiles(weight, recipe, fp8_dtype) -> bool:
    """Whether the weight's own tiles are the forward operand: a Float8BlockwiseQTensor of the
    recipe's weight blocks (128x128) and FP8 dtype."""
    return (isinstance(weight, Float8BlockwiseQTensor) and recipe.float8_block_scaling()
            and recipe.w_block_scaling_dim == 2 and weight._data.dtype == fp8_dtype)


class _WgradTarget:
    """Where a weight gradient goes: returned to autograd, accumulated into the weight's
    main_grad (fuse_wgrad_accumulation), or queued for backward_dw() (delay_wgrad_compute); the
    same rules as the modules' per-tensor FP8 paths (module_parts/wgrad.py)."""

    def __init__(self, module, weight):
        self.module = module
        self.fuse = bool(getattr(module, "fuse_wgrad_accumulation", False))
        # the weight itself is needed only to accumulate into it or to queue its gradient
        keep = self.fuse or getattr(module, "delay_wgrad_compute", False)
        self.weight = weight if keep else None

    def deliver(self, compute, dtype):
        """What autograd receives for the weight, given compute(out_dtype) -> dW: in `dtype`
        (the activation dtype) when returned, in main_grad's dtype when accumulated into it, so
        that the sum is not rounded to the activation dtype first."""
        weight, fuse = self.weight, self.fuse

        def run():
            if not fuse:
                return compute(dtype)
            dw = compute(weight.main_grad.dtype)
            weight.main_grad.add_(dw.to(weight.main_grad.dtype))
            return None
        if weight is None:
            return run()
        return _wgrad.weight_grad(self.module, weight, fuse, run)


class _Operands:
    """The forward operands a backward_override backward multiplies: x [tokens, in] and
    W [out, in] as they were ('high_precision') or their FP8 forms ('dequantized'), kept only
    where a gradient needs them (dgrad needs W, wgrad needs x)."""

    def __init__(self, mode, x, w, xq, wq, need_dgrad, need_wgrad, dtype):
        keep_x, keep_w = (x, w) if mode == "high_precision" else (xq, wq)
        self.mode, self.dtype = mode, dtype
        self.x = keep_x if need_wgrad else None
        self.w = keep_w if need_dgrad else None

    def grads(self, dy, dequantize, wgrad):
        """(dx, dW) in the activation dtype from dy [tokens, out] (None where not needed); dW
        goes through `wgrad` (a _WgradTarget)."""
        def hp(t):
            return t if self.mode == "high_precision" else dequantize(t, self.dtype)
        x, w = self.x, self.w
        self.x = self.w = None
        dx = dy @ hp(w) if w is not None else None
        dw = wgrad.deliver(lambda out: (dy.t() @ hp(x)).to(out), self.dtype) if x is not None else None
        return dx, dw


class _CurrentOverrideLinearFn(torch.autograd.Function):
    """y = x @ W.T (+ bias) with Float8CurrentScaling's forward GEMM (one scale per tensor, from
    its amax) and a backward_override backward."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, dtype, module):
        fwd, _ = recipe_fp8_dtypes(recipe, x2d.device)
        w = hp_weight(weight, dtype)
        need_dgrad, need_wgrad = x2d.requires_grad, weight.requires_grad
        xq = quantize_current(x2d, fwd)
        wq = quantize_current(w, fwd)
        y = general_gemm(wq[0], xq[0], dtype, layout="TN", A_scale_inv=wq[1], B_scale_inv=xq[1],
                         bias=bias).out
        ctx.override = _Operands(recipe.backward_override, x2d, w, xq, wq, need_dgrad, need_wgrad,
                                 dtype)
        ctx.wgrad = _WgradTarget(module, weight)
        ctx.need_db = bias is not None and bias.requires_grad
        ctx.dtype, ctx.bias_dtype = dtype, bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        dy = dy.to(ctx.dtype).contiguous()
        dx, dw = ctx.override.grads(dy, lambda q, dtype: dequantize_reference(*q, dtype), ctx.wgrad)
        db = dy.float().sum(0).to(ctx.bias_dtype) if ctx.need_db else None
        return dx, dw, db, None, None, None


class _NoTokensFn(torch.autograd.Function):
    """A GEMM over zero tokens (a GroupedLinear split of size 0): an empty output, and a zero
    weight gradient delivered like any other (returned, accumulated or queued)."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, dtype, module):
        ctx.wgrad = _WgradTarget(module, weight)
        ctx.shape, ctx.dtype = weight.shape, dtype
        ctx.need = (weight.requires_grad, bias is not None and bias.requires_grad)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return x2d.new_empty((0, weight.shape[0]))

    @staticmethod
    def backward(ctx, dy):
        need_wgrad, need_db = ctx.need
        dx = dy.new_empty((0, ctx.shape[1]))
        dw = (ctx.wgrad.deliver(lambda out: dy.new_zeros(ctx.shape, dtype=out), ctx.dtype)
              if need_wgrad else None)
        db = dy.new_zeros((ctx.shape[0],), dtype=ctx.bias_dtype) if need_db else None
        return dx, dw, db, None, None, None


def linear(who: str, module, recipe, inp, weight, bias, dtype):
    """inp @ weight.T (+ bias) with block-scaled FP8 GEMMs; inp [..., in_features]."""
    out_features, in_features = weight.shape
    x2d = inp.reshape(-1, in_features)
    x2d = (x2d if x2d.dtype == dtype else x2d.to(dtype)).contiguous()
    _check_supported(who, module, recipe, x2d.shape[0], in_features, out_features)
    if bias is not None:
        bias = bias if bias.dtype == dtype else bias.to(dtype)
    if x2d.shape[0] == 0:  # no tokens: nothing to quantize; zero gradients for the weights
        fn = _NoTokensFn
    else:
        fn = _BlockLinearFn if recipe.float8_block_scaling() else _CurrentOverrideLinearFn
    y = fn.apply(x2d, weight, bias, recipe, dtype, module)
    return y.view(*inp.shape[:-1], out_features)


def _norm(module, inp, dtype):
    x = (inp if inp.dtype == dtype else inp.to(dtype)).contiguous()
    gamma = param_for(module.layer_norm_weight, x)
    if module.normalization == "RMSNorm":
        return rmsnorm(x, gamma, module.eps, module.zero_centered_gamma)
    return layernorm(x, gamma, param_for(module.layer_norm_bias, x), module.eps,
                     module.zero_centered_gamma)


def layernorm_linear(module, recipe, inp, dtype):
    """(linear output, norm output) of LayerNormLinear; the output without its bias when the
    module returns the bias."""
    ln_out = _norm(module, inp, dtype)
    weight, bias = module._weight_and_bias()
    y = linear("LayerNormLinear", module, recipe, ln_out, weight,
               None if module.return_bias else bias, dtype)
    return y, ln_out


def layernorm_mlp(module, recipe, inp, dtype):
    """(FC2 output, norm output) of LayerNormMLP; FC2's bias left out when the module returns it."""
    ln_out = _norm(module, inp, dtype)
    h = linear("LayerNormMLP", module, recipe, ln_out, module.fc1_weight, module.fc1_bias, dtype)
    if module.activation == CLAMPED_SWIGLU:
        a = apply_clamped_swiglu(h, *module._clamp_params)
    else:
        a = apply_activation(h, module.activation)
    y = linear("LayerNormMLP", module, recipe, a, module.fc2_weight,
               None if module.return_bias else module.fc2_bias, dtype)
    return y, ln_out
