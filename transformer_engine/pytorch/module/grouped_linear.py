"""te.GroupedLinear: num_gemms linear layers applied to consecutive row blocks of one input
(the experts of a mixture-of-experts layer after token dispatch):

    inp = [x_0; x_1; ...; x_{n-1}]   x_i: m_splits[i] rows        y_i = x_i @ W_i.T + b_i

Each group runs the same GEMMs as te.Linear (see library/gemm.py), in high precision or FP8, one
after the other on the caller's stream, writing its rows of the output (and of the input
gradient) in place: groups of different sizes need no padding in high
precision, and FP8 (which needs every m_i to be a multiple of 16: see Fp8Padding) gives each
group its own scaling slots (forward: input 2i and weight 2i+1; backward: output gradient i), as
the per-GEMM recipe state of NV TE does. Empty groups (m_i == 0) launch nothing; their weight
and bias gradients are zeros. The parameters are weight0, bias0, weight1, bias1, ... in that
registration order.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

import torch

from ..library import gemm as _gemms
from ..library.activation import bias_grad_of
from ..library.cast import cast, record_amax
from ..module_parts import (blockwise as _blockwise, original_input as _original_input,
                           parallel as _parallel, wgrad as _wgrad)
from ..module_parts.input_check import check_fp8_dims, check_on_input_device
from ..module_parts.nv_options import check_off
from .base import (TransformerEngineBaseModule, default_device, default_init_method, fp8_weight,
                   hp_weight)

_NAME = "GroupedLinear"


def is_module_grouped_tensor_path_supported(recipe, dtype: torch.dtype) -> bool:
    """Whether GroupedLinear has a grouped-tensor path (all experts' weights in one grouped
    parameter, one grouped GEMM over device-resident splits) for ``recipe`` and ``dtype``.

    Args:
        recipe: the FP8 recipe (``None`` for high precision).
        dtype: the parameter dtype.

    Returns:
        Always ``False`` in this library: GroupedLinear keeps one parameter per GEMM
        (``weight0`` ... ``weight{num_gemms-1}``) and reads ``m_splits`` on the host. Callers that
        need the single-parameter layout take their per-GEMM path.
    """
    del recipe, dtype
    return False


def _check_splits(m_splits, num_gemms: int, rows: int):
    if isinstance(m_splits, torch.Tensor):
        m_splits = m_splits.tolist()  # sizes decide shapes: they are needed on the host
    try:
        splits = tuple(int(m) for m in m_splits)
    except TypeError:
        raise TypeError(f"{_NAME}.forward: m_splits is {type(m_splits).__name__}; expected a "
                        f"sequence of {num_gemms} ints") from None
    if len(splits) != num_gemms:
        raise ValueError(f"{_NAME}.forward: m_splits has {len(splits)} entries; expected "
                         f"num_gemms={num_gemms}")
    if any(m < 0 for m in splits) or sum(splits) != rows:
        raise ValueError(f"{_NAME}.forward: m_splits {list(splits)} must be non-negative and add up "
                         f"to the input's {rows} rows")
    return splits


class _GroupedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, splits, module, fi, dtype, is_first_microbatch, *params):
        n = len(splits)
        weights, biases = params[:n], params[n:]
        in_features = weights[0].shape[1]
        out_features = weights[0].shape[0]
        x2d = inp.reshape(-1, in_features)
        x2d = (x2d if x2d.dtype == dtype else x2d.to(dtype)).contiguous()
        need_dgrad = inp.requires_grad
        need_wgrad = [w.requires_grad for w in weights]
        fp8 = fi.fp8 and x2d.shape[0] > 0
        keep_input = fp8 and getattr(module, "save_original_input", False)  # module_parts/original_input.py
        if fp8:
            check_fp8_dims(_NAME, 16, in_features, out_features)
            bad = [m for m in splits if m % 16]
            if bad:
                raise ValueError(f"{_NAME}: FP8 needs every m_splits entry to be a multiple of 16; "
                                 f"got {list(splits)} (pad the groups with te.Fp8Padding)")
        y = torch.empty(x2d.shape[0], out_features, dtype=dtype, device=x2d.device)
        saved = []
        start = 0
        for i, m in enumerate(splits):
            rows = slice(start, start + m)
            start += m
            b = biases[i] if biases else None
            if m == 0:
                saved.append(None)
                continue
            x_i = x2d[rows]
            if fp8:
                kept = keep_input and need_wgrad[i]
                xq, xq_t, x_sinv = cast(fi.rs, x_i, True, 2 * i, need_wgrad[i] and not kept,
                                        fi.replay, fi.record)
                wq, wq_t, w_sinv = fp8_weight(module, weights[i], fi, 2 * i + 1, need_dgrad,
                                                     is_first_microbatch)
                _gemms.fprop_fp8(wq, w_sinv, xq, x_sinv, dtype, b, out=y[rows])
                saved.append((x_i if kept else xq_t, x_sinv, wq_t, w_sinv))
            else:
                w = hp_weight(weights[i], dtype)
                if fi.calibrating:
                    record_amax(fi.rs, x_i, True, 2 * i)
                    record_amax(fi.rs, w, True, 2 * i + 1)
                _gemms.fprop_hp(w, x_i, b, out=y[rows])
                saved.append((x_i if need_wgrad[i] else None, w if need_dgrad else None))
        ctx.groups = saved  # per-group operands (a list: None entries for empty groups)
        ctx.splits, ctx.fp8, ctx.fi, ctx.dtype, ctx.module = splits, fp8, fi, dtype, module
        ctx.need_dgrad, ctx.need_wgrad = need_dgrad, need_wgrad
        ctx.keep_input = keep_input
        ctx.bias_grad = [b.requires_grad for b in biases] if biases else None
        ctx.bias_dtypes = [b.dtype for b in biases] if biases else None
        fuse = module.fuse_wgrad_accumulation
        ctx.weights = weights if fuse or module.delay_wgrad_compute else [None] * n
        ctx.shapes = (inp.shape, out_features, in_features)
        return y.view(*inp.shape[:-1], out_features)

    @staticmethod
    def backward(ctx, grad_out):
        inp_shape, out_features, in_features = ctx.shapes
        module, fi, dtype = ctx.module, ctx.fi, ctx.dtype
        fuse = module.fuse_wgrad_accumulation
        dy = grad_out.reshape(-1, out_features)
        dy = (dy if dy.dtype == dtype else dy.to(dtype)).contiguous()
        n = len(ctx.splits)
        dx = (torch.empty(dy.shape[0], in_features, dtype=dtype, device=dy.device)
              if ctx.need_dgrad else None)
        dws, dbs = [None] * n, [None] * n
        start = 0
        for i, m in enumerate(ctx.splits):
            rows = slice(start, start + m)
            start += m
            weight = ctx.weights[i]
            if ctx.bias_grad is not None and ctx.bias_grad[i]:
                dbs[i] = (bias_grad_of(dy[rows], ctx.bias_dtypes[i]) if m else
                          torch.zeros(out_features, dtype=ctx.bias_dtypes[i], device=dy.device))
            if m == 0:
                if ctx.need_wgrad[i]:
                    dws[i] = _wgrad.weight_grad(module, weight, fuse, lambda: None if fuse else
                                                torch.zeros(out_features, in_features, dtype=dtype,
                                                            device=dy.device))
                continue
            dy_i = dy[rows]
            group = ctx.groups[i]
            if ctx.fp8:
                xq_t, x_sinv, wq_t, w_sinv = group
                if ctx.keep_input and ctx.need_wgrad[i]:  # the saved input, cast again
                    xq_t, x_sinv = _original_input.cast_again(fi.rs, xq_t, 2 * i)
                dyq, dyq_t, dy_sinv = cast(fi.rs, dy_i, False, i, ctx.need_wgrad[i])
                if ctx.need_dgrad:
                    _gemms.dgrad_fp8(wq_t, w_sinv, dyq, dy_sinv, dtype, out=dx[rows])
                if ctx.need_wgrad[i]:
                    dws[i] = _wgrad.weight_grad(module, weight, fuse, _fp8_wgrad(
                        xq_t, x_sinv, dyq_t, dy_sinv, dtype, weight, fuse))
            else:
                x_i, w = group
                if fi.calibrating:
                    record_amax(fi.rs, dy_i, False, i)
                if ctx.need_dgrad:
                    _gemms.dgrad_hp(w, dy_i, out=dx[rows])
                if ctx.need_wgrad[i]:
                    dws[i] = _wgrad.weight_grad(module, weight, fuse, _hp_wgrad(
                        x_i, dy_i, weight, fuse, out_features, in_features))
        ctx.groups = None
        if fi.step is not None:
            fi.step.backward_finished()
        if dx is not None:
            dx = dx.view(inp_shape)
        bias_grads = dbs if ctx.bias_grad is not None else []
        return (dx, None, None, None, None, None, *dws, *bias_grads)


# The queued (or immediate) wgrad GEMMs bind their operands here, not in a loop's closure.
def _fp8_wgrad(xq_t, x_sinv, dyq_t, dy_sinv, dtype, weight, fuse):
    return lambda: _gemms.wgrad_fp8(xq_t, x_sinv, dyq_t, dy_sinv, dtype, weight, fuse)


def _hp_wgrad(x_i, dy_i, weight, fuse, out_features, in_features):
    return lambda: _gemms.wgrad_hp(x_i, dy_i, weight, fuse, out_features, in_features)


class GroupedLinear(TransformerEngineBaseModule):
    """``num_gemms`` linear layers applied to consecutive row blocks of one input:
    ``y_i = x_i W_i^T + b_i``, the block sizes given to :meth:`forward` as ``m_splits`` (the
    experts of a mixture-of-experts layer after token dispatch).

    Each group runs the GEMMs of :class:`Linear` on its rows, one group after the other, in the
    input's dtype or, inside :func:`autocast`, in FP8 with its own scaling state per group. Under
    FP8 every ``m_splits`` entry, ``in_features`` and ``out_features`` must be multiples of 16
    (:class:`Fp8Padding` pads the groups). Groups of zero rows launch nothing and get zero
    weight and bias gradients. The parameters are ``weight0, bias0, weight1, bias1, ...``.

    Parameters
    ----------
    num_gemms : int
        Number of groups (GEMMs), each with its own weight and bias; >= 1.
    in_features : int
        Size of the last dimension of the input (over all tensor-parallel ranks with
        ``parallel_mode='row'``).
    out_features : int
        Size of the last dimension of the output (over all tensor-parallel ranks with
        ``parallel_mode='column'``).
    sequence_parallel : bool, default False
        Recorded (effective only with ``tp_size > 1``); the module itself does no
        communication, which the caller runs around it.
    fuse_wgrad_accumulation : bool, default False
        Accumulate each weight's gradient into its ``main_grad`` (a float32 tensor the caller
        allocates, as Megatron-style optimizers do) instead of writing ``weight.grad``.
    tp_group : torch.distributed.ProcessGroup, optional
        The tensor-parallel group; its size overrides ``tp_size``.
    tp_size : int, default 1
        Tensor-parallel size: the weights hold ``1 / tp_size`` of the features split by
        ``parallel_mode``. With ``tp_size > 1`` only ``bias=False`` is supported.
    get_rng_state_tracker : callable, optional
        Returns a :class:`CudaRNGStatesTracker`; CUDA weights are initialised under its fork so
        that tensor-parallel shards draw different numbers.
    rng_tracker_name : str, optional
        Name of the tracker's state to fork (default ``'model-parallel-rng'``).
    init_method : callable, optional
        Called as ``init_method(weight)`` on each weight in place. Default: normal with mean 0
        and standard deviation 0.023.
    bias : bool, default True
        Whether each group has a learnable bias.
    return_bias : bool, default False
        Do not add the biases; :meth:`forward` returns ``(output, [bias0, bias1, ...])``.
    params_dtype : torch.dtype, optional
        Data type of the parameters (default ``torch.get_default_dtype()``).
    parallel_mode : {None, 'column', 'row'}, default None
        How the weights are split over the tensor-parallel group: ``'column'`` splits the output
        features, ``'row'`` the input features; ``None`` keeps whole weights.
    device : torch.device or str, optional
        Where the parameters are created: default the current CUDA/ROCm device when one exists,
        else the CPU. ``'meta'`` defers allocation (then ``to_empty()`` and
        ``reset_parameters()``).
    ub_overlap_rs, ub_overlap_ag : bool, default False
        Overlap of tensor-parallel communication with the GEMMs through NVIDIA's userbuffers.
        Not implemented: only False is accepted (True raises NotImplementedError).
    ub_name : str, optional
        Name of the userbuffers communicator; stored, without effect.
    delay_wgrad_compute : bool, default False
        The backward computes the input and bias gradients and queues the weight-gradient GEMMs
        on the module; :meth:`backward_dw` runs them later and then calls the hooks registered
        with :meth:`register_wgrad_accumulation_and_reduce_hooks`. The weights and biases are
        flagged with ``skip_backward_post_hook = True`` so that Megatron-style data-parallel
        wrappers leave their reduction to those hooks.
    save_original_input : bool, default False
        Under FP8, save each group's input as it came (high precision) for the backward instead
        of its FP8 copy, and cast it again there for the weight-gradient GEMM (the same bits).
        Works with Float8CurrentScaling and Float8BlockScaling; under DelayedScaling a call that
        makes a weight gradient raises ValueError. No effect without FP8.
    single_grouped_weight, single_grouped_bias : bool, default False
        One grouped parameter holding every GEMM's weight (bias). Not implemented: only False is
        accepted (True raises NotImplementedError); the weights are ``weight0`` ...
        ``weight{num_gemms-1}``.
    name : str, optional
        A name for the module, used in debug logging only.
    use_grouped_tensor : bool, optional
        The grouped-tensor path (one grouped GEMM over device-resident splits). Not
        implemented: None or False (the per-GEMM path) is accepted, True raises
        NotImplementedError.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group=None, tp_size: int = 1, get_rng_state_tracker: Optional[Callable] = None,
                 rng_tracker_name: Optional[str] = None, init_method: Optional[Callable] = None,
                 bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 device: Union[torch.device, str, None] = None, ub_overlap_rs: bool = False,
                 ub_overlap_ag: bool = False, ub_name: Optional[str] = None,
                 delay_wgrad_compute: bool = False, save_original_input: bool = False,
                 single_grouped_weight: bool = False, single_grouped_bias: bool = False,
                 name: Optional[str] = None, use_grouped_tensor: Optional[bool] = None):
        super().__init__()
        if not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(f"{_NAME}: num_gemms is {num_gemms!r}; expected a positive int")
        # use_grouped_tensor=False asks for the per-GEMM path, which is the only one
        check_off(_NAME, ub_overlap_ag=ub_overlap_ag, ub_overlap_rs=ub_overlap_rs,
                  single_grouped_weight=bool(single_grouped_weight),
                  single_grouped_bias=bool(single_grouped_bias),
                  use_grouped_tensor=use_grouped_tensor or None)
        _parallel.check_parallel_mode(_NAME, parallel_mode)
        self.num_gemms = num_gemms
        self.fp8_slots = (2 * num_gemms, num_gemms)  # per group: input, weight; output gradient
        self.tp_group = tp_group
        self.tp_size = _parallel.resolve_tp(tp_group, tp_size)
        if self.tp_size > 1 and bias:
            raise ValueError(f"{_NAME}: bias=True with tensor parallelism (tp_size="
                             f"{self.tp_size}) is not supported: the TP communication happens "
                             "outside this module; pass bias=False")
        self.parallel_mode = parallel_mode
        self.sequence_parallel = sequence_parallel and self.tp_size > 1
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self.save_original_input = bool(save_original_input)
        self.use_bias, self.return_bias = bias, return_bias
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.ub_name, self.name = ub_name, name
        self.in_features, self.out_features = _parallel.split_features(
            _NAME, in_features, out_features, parallel_mode, self.tp_size)
        self.init_method = init_method or default_init_method()
        device = default_device(device)
        for i in range(num_gemms):
            w = self.make_weight((self.out_features, self.in_features), self.params_dtype, device,
                                 self._init_weight)
            self.register_parameter(f"weight{i}", w)
            b = (torch.nn.Parameter(torch.zeros(self.out_features, dtype=self.params_dtype,
                                                device=device)) if bias else None)
            self.register_parameter(f"bias{i}", b)
            if self.parallel_mode in ("column", "row") and self.tp_size > 1:
                _parallel.dist_te.set_tensor_model_parallel_attributes(
                    w, True, 0 if parallel_mode == "column" else 1, 1)
        _wgrad.mark_delayed_params(self)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """(Re)initialises the parameters in place: each weight with ``init_method``, each bias
        with zeros (under :func:`quantized_model_init` the weights are then stored in FP8). Use
        it after creating the module on ``device='meta'`` and calling ``to_empty()``.

        Parameters
        ----------
        defer_init : bool, default False
            When True, do nothing (initialisation is left to a later call).
        """
        if defer_init:
            return
        with torch.no_grad():
            for name, p in self.named_parameters(recurse=False):
                if name.startswith("weight"):
                    self._init_weight(p)
                else:
                    p.zero_()
        self._quantize_deferred_weights()

    def _weights(self) -> List[torch.Tensor]:
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    def _biases(self) -> List[torch.Tensor]:
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)] if self.use_bias else []

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int],
                is_first_microbatch: Optional[bool] = None):
        """Applies group ``i``'s layer to the ``i``-th block of rows of ``inp``.

        Parameters
        ----------
        inp : torch.Tensor
            The input ``[..., in_features]``; its rows (all leading dimensions flattened) are
            the groups' rows one after another.
        m_splits : sequence of int or torch.Tensor
            Number of rows of each group: ``num_gemms`` non-negative entries adding up to the
            number of rows (a tensor is read on the host). Under FP8 each must be a multiple
            of 16.
        is_first_microbatch : bool, optional
            With gradient accumulation over micro-batches: True on the first micro-batch of a
            step (the FP8 weights are cast and cached), False on later ones (the cache is
            reused). None (default) casts the weights on every call.

        Returns
        -------
        torch.Tensor or tuple of (torch.Tensor, list of torch.Tensor)
            The output ``[..., out_features]`` with ``inp``'s leading shape; with
            ``return_bias``, also the list of biases, not added.
        """
        if not isinstance(inp, torch.Tensor) or inp.dim() < 1 or inp.shape[-1] != self.in_features:
            shape = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
            raise ValueError(f"{_NAME}.forward: inp has shape {shape}; expected [..., "
                             f"{self.in_features}] (in_features)")
        check_on_input_device("te.GroupedLinear", inp, self._parameters.items())
        rows = inp.numel() // self.in_features
        splits = _check_splits(m_splits, self.num_gemms, rows)
        dtype = self.activation_dtype(inp)
        biases = self._biases()
        gemm_biases = biases if not self.return_bias else []
        recipe = _blockwise.active()
        if recipe is not None:  # Float8BlockScaling or a backward_override: see module_parts/blockwise.py
            parts = inp.reshape(rows, self.in_features).split(list(splits))
            ws = self._weights()
            out = torch.cat([_blockwise.linear(_NAME, self, recipe, x, w,
                                               gemm_biases[i] if gemm_biases else None, dtype)
                             for i, (x, w) in enumerate(zip(parts, ws))])
            out = out.view(*inp.shape[:-1], self.out_features)
        else:
            fi = self.fp8_call_info(inp.device)
            if self.save_original_input:
                _original_input.check_recipe(_NAME, self, fi, self._weights())
            out = _GroupedLinearFn.apply(inp, splits, self, fi, dtype, is_first_microbatch,
                                         *self._weights(), *gemm_biases)
        if self.return_bias:
            return out, [b.to(out.dtype) for b in biases]
        return out
