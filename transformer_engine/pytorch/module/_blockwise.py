"""Linear, LayerNormLinear and LayerNormMLP under the Float8BlockScaling recipe.

Each GEMM operand is quantised in blocks along its reduction dimension, from its own values at
every call (no FP8 state in the module):
    fprop  y  = x @ W.T    A = W   (w_block_scaling_dim),    B = x  (x_block_scaling_dim)
    dgrad  dx = dy @ W     A = W.T (the weight's transposed copy), B = dy (grad_block_scaling_dim)
    wgrad  dW = dy.T @ x   A = x.T (the input's transposed copy),  B = dy.T
The transposed copies are quantised from the high-precision tensor along their own rows (not
transposed FP8 bytes), so every GEMM sees blocks along its k. The norm and the activation are
the modules' differentiable high-precision ops; only the GEMMs run in FP8 (kernels/blockwise.py:
native on Hopper, the dequantise-then-matmul reference elsewhere).
"""
from __future__ import annotations

import torch

from ...common import fp8_formats
from .. import native
from ..kernels import blockwise as B
from ..kernels.activation import CLAMPED_SWIGLU, apply_activation, apply_clamped_swiglu
from ..kernels.normalization import layernorm, rmsnorm
from ..quantization import FP8GlobalState
from ._norm_args import param_for
from .base import hp_weight


def active():
    """The block-scaling recipe when an FP8 autocast with it is on, else None."""
    s = FP8GlobalState
    if not s.enabled or s.recipe is None or not s.recipe.float8_block_scaling():
        return None
    return s.recipe


def _fp8_dtypes(recipe, device):
    flavor = (native.capability(device).fp8_flavor if device.type == "cuda" else None) or fp8_formats.OCP
    fmt = recipe.fp8_format.value
    return (getattr(torch, fp8_formats.fp8_dtype_name(fmt.fwd, flavor)),
            getattr(torch, fp8_formats.fp8_dtype_name(fmt.bwd, flavor)))


def _check_supported(who: str, module, tokens: int, in_features: int, out_features: int):
    if getattr(module, "tp_size", 1) > 1:
        raise NotImplementedError(f"{who}: Float8BlockScaling with tensor parallelism "
                                  f"(tp_size={module.tp_size}) is not supported")
    if getattr(module, "fuse_wgrad_accumulation", False) or getattr(module, "delay_wgrad_compute", False):
        raise NotImplementedError(f"{who}: Float8BlockScaling does not support "
                                  "fuse_wgrad_accumulation or delay_wgrad_compute")
    if tokens % 16 or in_features % 16 or out_features % 16:
        raise ValueError(f"{who}: FP8 GEMMs need the token count ({tokens}), in_features "
                         f"({in_features}) and out_features ({out_features}) to be multiples of 16")


class _BlockLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, dtype):
        fwd, bwd = _fp8_dtypes(recipe, x2d.device)
        w = hp_weight(weight, dtype)
        need_dgrad, need_wgrad = x2d.requires_grad, weight.requires_grad
        xq, xq_t = B.quantize_blockwise(x2d, fwd, recipe.x_block_scaling_dim,
                                        recipe.fp8_quant_fwd_inp.power_2_scale, need_wgrad)
        wq, wq_t = B.quantize_blockwise(w, fwd, recipe.w_block_scaling_dim,
                                        recipe.fp8_quant_fwd_weight.power_2_scale, need_dgrad)
        y = B.gemm_blockwise(wq, xq, dtype, bias)
        ctx.saved = (xq_t, wq_t)
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
        dyq, dyq_t = B.quantize_blockwise(dy, ctx.bwd, recipe.grad_block_scaling_dim,
                                          recipe.fp8_quant_bwd_grad.power_2_scale, need_wgrad)
        dx = B.gemm_blockwise(wq_t, dyq, ctx.dtype) if need_dgrad else None
        dw = B.gemm_blockwise(xq_t, dyq_t, ctx.dtype) if need_wgrad else None
        db = dy.float().sum(0).to(ctx.bias_dtype) if need_db else None
        return dx, dw, db, None, None


def linear(who: str, module, recipe, inp, weight, bias, dtype):
    """inp @ weight.T (+ bias) with block-scaled FP8 GEMMs; inp [..., in_features]."""
    out_features, in_features = weight.shape
    x2d = inp.reshape(-1, in_features)
    x2d = (x2d if x2d.dtype == dtype else x2d.to(dtype)).contiguous()
    _check_supported(who, module, x2d.shape[0], in_features, out_features)
    if bias is not None:
        bias = bias if bias.dtype == dtype else bias.to(dtype)
    y = _BlockLinearFn.apply(x2d, weight, bias, recipe, dtype)
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
