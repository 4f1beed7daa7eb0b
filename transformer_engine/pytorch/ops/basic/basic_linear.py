"""BasicLinear: y = x W^T, in high precision or FP8, with optional tensor parallelism."""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ... import distributed as dist_te
from ... import kernels
from ... import quantization as q
from ...quantization import FP8GlobalState
from ...tensor import Float8Tensor, delayed_weight
from .._fp8 import cast, fp8_call, record_amax
from ..op import PREFIX, BasicOperation, OperationContext, op_name
from ._common import (check_device, check_last_dim, default_device, default_dtype, high_precision,
                      param_as, positive_int)

_UNSET = object()


def _tp_world(group) -> tuple:
    """(group, size) of a tensor-parallel group; None means the world group, as in
    torch.distributed (size 1 when no process group is initialised)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None, 1
    group = dist.group.WORLD if group is None else group
    return group, dist.get_world_size(group)


class BasicLinear(BasicOperation):
    """Linear transformation without bias: ``y = x W^T``.

    The GEMMs run through ``transformer_engine.pytorch.kernels.general_gemm``: in the compute
    dtype (the input's, or the ``torch.autocast`` dtype), or in FP8 under ``te.fp8_autocast`` /
    ``te.autocast`` with DelayedScaling or Float8CurrentScaling (the input, the weight and the
    output gradient are cast with this operation's scales; token count, ``in_features`` and
    ``out_features`` must then be multiples of 16). Followed by :class:`Bias`, the bias is added
    in the GEMM epilogue and its gradient comes out of the weight-gradient GEMM. Created under
    ``te.quantized_model_init``, the weight is kept only in FP8 (a :class:`Float8Tensor`), which
    the FP8 GEMMs read as it is stored.

    Parameters
    ----------
    in_features : int
        Inner dimension of the input.
    out_features : int
        Inner dimension of the output.
    device : torch.device or str, optional
        Where to create the weight (default: the current GPU, else the CPU; ``"meta"`` defers
        initialisation to :meth:`reset_parameters`).
    dtype : torch.dtype, optional
        The weight's dtype (default ``torch.get_default_dtype()``).
    tensor_parallel_mode : {None, "column", "row"}, default None
        Split the weight over ``tensor_parallel_group``: "column" splits the output features
        (the input is copied to the group, or gathered along the first dimension with
        ``sequence_parallel``), "row" the input features (the output is all-reduced, or
        reduce-scattered with ``sequence_parallel``).
    tensor_parallel_group : torch.distributed.ProcessGroup, optional
        The group (default: the world group).
    sequence_parallel : bool, default False
        With tensor parallelism, the tokens are split over the group outside this operation.
    rng_state_tracker_function : callable, optional
        Returns a :class:`CudaRNGStatesTracker` whose "model-parallel-rng" state initialises
        a split weight on the GPU.
    accumulate_into_main_grad : bool, default False
        Add the weight gradient into ``weight.main_grad`` (set by the caller, for example an
        fp32 buffer of Megatron-LM) in the GEMM itself; the weight then gets no ``.grad`` and
        ``weight.grad_added_to_main_grad`` is set to True.
    userbuffers_options : dict, optional
        Communication overlap with Userbuffers; not supported (anything but None raises
        NotImplementedError).
    """

    fp8_slots = (2, 1)  # forward: input, weight; backward: output gradient

    def __init__(self, in_features: int, out_features: int, *, device=None,
                 dtype: Optional[torch.dtype] = None,
                 tensor_parallel_mode: Optional[str] = None,
                 tensor_parallel_group=None, sequence_parallel: bool = False,
                 rng_state_tracker_function: Optional[Callable] = None,
                 accumulate_into_main_grad: bool = False,
                 userbuffers_options: Optional[dict] = None) -> None:
        super().__init__()
        who = "BasicLinear"
        self.in_features = positive_int(who, "in_features", in_features)
        self.out_features = positive_int(who, "out_features", out_features)
        if tensor_parallel_mode not in (None, "column", "row"):
            raise ValueError(f"{PREFIX}.{who}: tensor_parallel_mode is {tensor_parallel_mode!r}; "
                             "expected None, 'column' or 'row'")
        if userbuffers_options is not None:
            raise NotImplementedError(f"{PREFIX}.{who}: userbuffers_options (communication "
                                      "overlap with Userbuffers) is not supported")
        # quantized_model_init: the weight is kept only in FP8 (a Float8Tensor)
        self._quantized_weight = FP8GlobalState.model_init
        self._weight_recipe = FP8GlobalState.model_init_recipe
        self._keep_hp_init_val = FP8GlobalState.model_init_keep_hp
        if self._quantized_weight and (self._weight_recipe
                                       or q.get_default_recipe()).float8_block_scaling():
            raise NotImplementedError(f"{PREFIX}.{who}: FP8 weights under Float8BlockScaling "
                                      "(quantized_model_init) are not supported by the fusible "
                                      "operations; create the weights in high precision")
        self.tensor_parallel_mode = tensor_parallel_mode
        self.sequence_parallel = bool(sequence_parallel)
        group, size = _tp_world(tensor_parallel_group) if tensor_parallel_mode else (None, 1)
        self.tensor_parallel_group, self.tensor_parallel_size = group, size
        self.local_in_features, self.local_out_features = self.in_features, self.out_features
        if tensor_parallel_mode == "column":
            self.local_out_features = dist_te.divide(out_features, size,
                                                     f"{PREFIX}.{who}: out_features")
        elif tensor_parallel_mode == "row":
            self.local_in_features = dist_te.divide(in_features, size,
                                                    f"{PREFIX}.{who}: in_features")
        self.rng_state_tracker_function = rng_state_tracker_function
        self.accumulate_into_main_grad = bool(accumulate_into_main_grad)
        device = default_device(device)
        weight = torch.empty(self.local_out_features, self.local_in_features, device=device,
                             dtype=default_dtype(who, dtype))
        self.weight = torch.nn.Parameter(weight)
        if device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise the weight as ``torch.nn.Linear`` does (Kaiming uniform), under the
        tensor-parallel RNG tracker when one was given. A weight on the meta device is left
        as it is (materialise it with ``to_empty`` first)."""
        w = self.weight
        if w.device.type == "meta":  # deferred: model.to_empty(device=...) first
            return

        if isinstance(w, Float8Tensor):  # re-initialising an FP8 weight: a new high-precision one
            w = torch.empty(w.shape, dtype=w.dtype, device=w.device)

        def init():
            with torch.no_grad():
                torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        if self.rng_state_tracker_function is not None and w.is_cuda:
            with self.rng_state_tracker_function().fork("model-parallel-rng"):
                init()
        else:
            init()
        if self._quantized_weight:
            self.weight = torch.nn.Parameter(self._to_fp8_weight(w.detach()))

    def _to_fp8_weight(self, w: torch.Tensor) -> Float8Tensor:
        recipe = self._weight_recipe or q.get_default_recipe()
        wq = delayed_weight.quantize_new_weight(w, q.RecipeState(recipe, w.device, 1, 0))
        if self._keep_hp_init_val:
            wq._high_precision_init_val = w.detach().to("cpu", copy=True)
        return wq

    # -- tensor parallelism around the group
    def _tp_active(self) -> bool:
        return self.tensor_parallel_mode is not None and self.tensor_parallel_size > 1

    def _group_input(self, x):
        if not self._tp_active() or self.tensor_parallel_mode != "column":
            return x
        if self.sequence_parallel:
            return dist_te.gather_from_sequence_parallel_region(x, self.tensor_parallel_group)
        return dist_te.copy_to_tensor_parallel_region(x, self.tensor_parallel_group)

    def _group_output(self, y):
        if not self._tp_active() or self.tensor_parallel_mode != "row":
            return y
        if self.sequence_parallel:
            return dist_te.reduce_scatter_to_sequence_parallel_region(y, self.tensor_parallel_group)
        return dist_te.reduce_from_tensor_parallel_region(y, self.tensor_parallel_group)

    # -- the GEMMs
    def _linear_forward(self, ctx: OperationContext, x: torch.Tensor, bias=None,
                        fp8=_UNSET, quantized_input=None) -> torch.Tensor:
        """y = x W^T (+ bias in the epilogue). fp8: the FP8Call a fused caller already made;
        quantized_input: (data [tokens, in], data_t or None, scale_inv) the caller cast."""
        dtype, k, m = ctx.dtype, self.local_in_features, self.local_out_features
        check_last_dim(self, x, k, "in_features")
        check_device(self, x, self.weight)
        if fp8 is _UNSET:
            fp8 = fp8_call(self, x.device, ctx.requires_grad)
        ctx.fp8, ctx.out_shape = fp8, tuple(x.shape[:-1]) + (m,)
        ctx.in_shape, ctx.has_bias = tuple(x.shape), bias is not None
        bias = None if bias is None else param_as(bias, dtype)
        if fp8 is not None and fp8.calibrating:  # high precision, recording the amaxes
            x = high_precision(x, dtype)
            record_amax(fp8, x, 0)
            record_amax(fp8, self._weight_in(dtype), 1)
        if fp8 is None or fp8.calibrating:
            x = high_precision(x, dtype)
            w = self._weight_in(dtype)
            ctx.save_for_backward(x, w)
            return kernels.general_gemm(w, x, layout="TN", bias=bias).out
        tokens = math.prod(x.shape[:-1])
        if tokens % 16 or k % 16 or m % 16:
            raise ValueError(f"{op_name(self)}: FP8 GEMMs need the token count, in_features and "
                             f"out_features to be multiples of 16; got input {tuple(x.shape)} and "
                             f"weight {tuple(self.weight.shape)}")
        rs, need_t = fp8.rs, ctx.requires_grad
        if quantized_input is not None:
            xq, xq_t, x_sinv = quantized_input
        elif isinstance(x, Float8Tensor):
            xq, x_sinv = x._data.reshape(tokens, k), x._scale_inv
            xq_t = kernels.transpose(xq) if need_t else None
        else:
            x2d = high_precision(x, dtype).reshape(tokens, k)
            xq, xq_t, x_sinv = cast(rs, x2d, True, 0, need_t)
        weight = self.weight
        if isinstance(weight, Float8Tensor):  # an FP8 weight is used as it is stored
            if rs.delayed:
                delayed_weight.follow_module_state(weight, rs, 1)
            wq, w_sinv = weight._data, weight._scale_inv
            wq_t = weight.transpose_fp8() if need_t else None
        else:
            wq, wq_t, w_sinv = cast(rs, param_as(weight, dtype).contiguous(), True, 1, need_t)
        ctx.save_for_backward(xq_t, x_sinv, wq_t, w_sinv)
        y = kernels.general_gemm(wq, xq, dtype, layout="TN", A_scale_inv=w_sinv,
                                 B_scale_inv=x_sinv, bias=bias).out
        return y.reshape(ctx.out_shape)

    def _weight_in(self, dtype):
        w = self.weight
        return w.dequantize(dtype) if isinstance(w, Float8Tensor) else param_as(w, dtype)

    def _wgrad_target(self):
        """(out buffer, accumulate) of the weight gradient."""
        if not self.accumulate_into_main_grad:
            return None, False
        main_grad = getattr(self.weight, "main_grad", None)
        if not isinstance(main_grad, torch.Tensor) or main_grad.shape != self.weight.shape:
            raise ValueError(f"{op_name(self)}: accumulate_into_main_grad=True needs "
                             f"weight.main_grad, a tensor of the weight's shape "
                             f"{tuple(self.weight.shape)}, set before backward")
        return main_grad, True

    def _finish_wgrad(self, dw):
        if self.accumulate_into_main_grad:
            self.weight.grad_added_to_main_grad = True
            return None
        return dw

    def _linear_backward(self, ctx: OperationContext, dy: torch.Tensor):
        """(dx, dW, dbias or None) from the output gradient."""
        dtype, k, m = ctx.dtype, self.local_in_features, self.local_out_features
        dy2d = high_precision(dy, dtype).reshape(-1, m)
        out, acc = self._wgrad_target()
        if ctx.fp8 is None or ctx.fp8.calibrating:
            x, w = ctx.saved_tensors
            dx = kernels.general_gemm(w, dy2d, layout="NN").out.reshape(ctx.in_shape)
            res = kernels.general_gemm(x.reshape(-1, k), dy2d, None if out is None else out.dtype,
                                       layout="NT", bias_grad=ctx.has_bias, out=out,
                                       accumulate=acc)
            return dx, self._finish_wgrad(res.out), res.bias_grad
        xq_t, x_sinv, wq_t, w_sinv = ctx.saved_tensors
        rs = ctx.fp8.rs
        dyq, dyq_t, dy_sinv = cast(rs, dy2d, False, 0, True)
        dx = kernels.general_gemm(wq_t, dyq, dtype, layout="TN", A_scale_inv=w_sinv,
                                  B_scale_inv=dy_sinv).out.reshape(ctx.in_shape)
        dw = kernels.general_gemm(xq_t, dyq_t, out.dtype if out is not None else self.weight.dtype,
                                  layout="TN", A_scale_inv=x_sinv, B_scale_inv=dy_sinv, out=out,
                                  accumulate=acc, use_split_accumulator=True).out
        db = kernels.dbias(dy2d) if ctx.has_bias else None
        return dx, self._finish_wgrad(dw), db

    # -- alone
    def _forward(self, ctx, x, extra_inputs):
        return self._linear_forward(ctx, x), ()

    def _backward(self, ctx, dy, grad_extra_outputs):
        dx, dw, _ = self._linear_backward(ctx, dy)
        return dx, (), [dw]
