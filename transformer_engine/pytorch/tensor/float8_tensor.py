"""Float8Tensor: a torch.Tensor subclass that stores only FP8 data and its scale_inv.

Its dtype is the nominal (high-precision) dtype; any torch op that is not taught about FP8
sees the dequantised value (data * scale_inv), so it behaves like a plain tensor. In-place ops
(optimizer steps, copy_ from load_state_dict) compute in high precision and quantise back with a
fresh per-tensor scale (current scaling), so the parameter never holds a high-precision copy.
TE modules read `_data`, `_scale_inv` and the cached FP8 transpose directly.

Quantizers: objects that turn a high-precision tensor into a quantized tensor with a given
scaling rule, as NVIDIA Transformer Engine's public tensor API has them.

Float8Quantizer: a given per-tensor scale (delayed scaling); each quantize maxes the input's
amax into `amax`. Float8CurrentScalingQuantizer: the scale comes from the input's own amax at
each quantize (optionally all-reduced over a group, floored at amax_epsilon, rounded down to a
power of two). Both return Float8Tensor; `make_empty` allocates one without data.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils._pytree import tree_map

from ..constants import DType, torch_dtype_of
from .current_scaling import fp8_max_of_dtype  # noqa: F401  (its old home)
from .current_scaling import quantize_current as _quantize_current
from .quantized_tensor import QuantizedTensor, copy_user_attributes

aten = torch.ops.aten


class Float8Tensor(QuantizedTensor):
    """A tensor stored as FP8 data and one float32 inverse scale.

    Behaves as a tensor of its nominal ``dtype``: operations that do not know about FP8
    dequantise it (``data * scale_inv``). The modules use it for FP8-only weights (see
    :func:`quantized_model_init`) and keep its transpose cached for the backward GEMMs.
    ``_quantizer`` (when set) is the quantizer that made the tensor, which in-place updates
    reuse.

    Parameters
    ----------
    data : torch.Tensor
        The FP8 values (a ``torch.float8_*`` dtype).
    scale_inv : torch.Tensor
        One-element float32 tensor: the factor that turns ``data`` back into real values.
    dtype : torch.dtype
        The nominal (high-precision) dtype, e.g. ``torch.bfloat16``.
    requires_grad : bool, default False
        Whether autograd tracks the tensor.
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                requires_grad: bool = False):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=dtype, device=data.device,
                                                 requires_grad=requires_grad)
        t._data = data
        t._scale_inv = scale_inv
        t._transpose_cache = None
        t._quantizer = None
        return t

    @classmethod
    def quantize(cls, x: torch.Tensor, fp8_dtype: torch.dtype, dtype: Optional[torch.dtype] = None,
                 requires_grad: bool = False) -> "Float8Tensor":
        """Quantise ``x`` with its own amax (current scaling): ``scale = fp8_max / amax(x)``.

        Parameters
        ----------
        x : torch.Tensor
            The high-precision tensor.
        fp8_dtype : torch.dtype
            The FP8 dtype to store (see :func:`fp8_dtype` for the one a device uses).
        dtype : torch.dtype, optional
            The nominal dtype (default ``x.dtype``).
        requires_grad : bool, default False
            Whether autograd tracks the result.
        """
        data, scale_inv = _quantize_current(x.detach(), fp8_dtype)
        return cls(data, scale_inv, dtype or x.dtype, requires_grad)

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self._data.dtype

    def _get_quantizer(self):
        """The quantizer that made this tensor; one of current scaling (the rule that
        Float8Tensor.quantize and in-place updates use) when it was made without one."""
        if self._quantizer is None:
            self._quantizer = Float8CurrentScalingQuantizer(self._data.dtype, self._data.device)
        return self._quantizer

    # NVIDIA TE's names for the cached FP8 transpose and whether it must be remade
    @property
    def _transpose(self) -> Optional[torch.Tensor]:
        return self._transpose_cache

    @property
    def _transpose_invalid(self) -> bool:
        return self._transpose_cache is None

    @property
    def _fp8_dtype(self):
        from ..constants import TE_DType
        return TE_DType[self._data.dtype]

    def quantize_(self, tensor: torch.Tensor) -> "Float8Tensor":
        """Overwrite the value with `tensor`, quantized by this tensor's quantizer (current
        scaling when it has none).

        Parameters
        ----------
        tensor : torch.Tensor
            The new value, of this tensor's shape; a quantized tensor is dequantised first.

        Returns
        -------
        Float8Tensor
            This tensor, updated in place."""
        if self._quantizer is not None:
            if getattr(self._quantizer, "module_weight", False):
                # its scale is a module's delayed-scaling scale: a deferred update lands first
                from ..quantization import flush_deferred_updates
                flush_deferred_updates()
            self._quantizer.update_quantized(tensor.to(self.dtype), self)
        else:
            self._requantize_from(tensor.dequantize() if isinstance(tensor, QuantizedTensor) else tensor)
        return self

    def get_high_precision_init_val(self) -> Optional[torch.Tensor]:
        """The high-precision value this weight was initialised with, kept on the CPU when its
        module was built under ``quantized_model_init(preserve_high_precision_init_val=True)``
        (for example to seed an optimizer's FP32 master weights).

        Returns
        -------
        torch.Tensor or None
            The initial value, or None when none was kept or it was cleared.
        """
        return self.__dict__.get("_high_precision_init_val")

    def clear_high_precision_init_val(self) -> None:
        """Drops the kept initial value (see :meth:`get_high_precision_init_val`) to free its
        memory; later calls of that method return None."""
        self.__dict__.pop("_high_precision_init_val", None)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values in high precision (``data * scale_inv``).

        Parameters
        ----------
        dtype : torch.dtype, optional
            The result's dtype (default the nominal dtype).
        """
        from ..kernels import dequantize
        return dequantize(self._data, self._scale_inv, dtype or self.dtype)

    def transpose_fp8(self) -> torch.Tensor:
        """FP8 data of the 2-D transpose, made once and kept until the value changes."""
        if self._transpose_cache is None:
            from ..kernels import transpose
            self._transpose_cache = transpose(self._data)
        return self._transpose_cache

    def _map_storage(self, fn, dtype: torch.dtype) -> "Float8Tensor":
        """A tensor of this type whose storage tensors are fn(each of ours), nominal dtype
        `dtype`, sharing the quantizer (detach, clone and .to() are this with fn identity,
        clone and .to(device))."""
        out = Float8Tensor(fn(self._data), fn(self._scale_inv), dtype)
        out._quantizer = self._quantizer
        return out

    def _copy_storage_from(self, src: "Float8Tensor") -> None:
        self._data.copy_(src._data)
        self._scale_inv.copy_(src._scale_inv)
        self._transpose_cache = None

    def _requantize_from(self, value: torch.Tensor, amax: Optional[torch.Tensor] = None) -> None:
        data, scale_inv = _quantize_current(value.to(self.dtype), self._data.dtype, amax)
        self._data.copy_(data)
        self._scale_inv.copy_(scale_inv)
        self._transpose_cache = None

    def __repr__(self, *, tensor_contents=None):
        return (f"Float8Tensor(fp8_dtype={self._data.dtype}, scale_inv={self._scale_inv.item():.6g}, "
                f"nominal_dtype={self.dtype}, data={self.dequantize()})")

    def __reduce_ex__(self, protocol):
        return (_rebuild_float8_tensor, (self._data, self._scale_inv, self.dtype, self.requires_grad))

    # FSDP2's all-gather extension points (see tensor/float8_fsdp.py): the shard travels as FP8
    def fsdp_pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        """What fully_shard all-gathers for this shard: its FP8 bytes and inverse scale.

        Parameters
        ----------
        mesh : torch.distributed.device_mesh.DeviceMesh
            The mesh the parameter is sharded over.
        orig_size : torch.Size
            The unsharded parameter's shape.
        contiguous_orig_stride : tuple of int
            Its contiguous strides (unused: the gathered weight is contiguous).
        module : torch.nn.Module
            The module owning the parameter (unused).
        mp_policy : torch.distributed.fsdp.MixedPrecisionPolicy
            The mixed-precision policy; its ``param_dtype`` is the dtype of the fallback gather
            of a weight the mesh does not split evenly.

        Returns
        -------
        tuple
            (all-gather inputs, metadata passed to :meth:`fsdp_post_all_gather`).
        """
        from .float8_fsdp import pre_all_gather
        return pre_all_gather(self, mesh, orig_size, module, mp_policy)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The unsharded Float8Tensor from what fully_shard gathered (one inverse scale for the
        whole weight).

        Parameters
        ----------
        all_gather_outputs : tuple of torch.Tensor
            The gathered inputs of :meth:`fsdp_pre_all_gather`, in its order.
        metadata : tuple
            The metadata :meth:`fsdp_pre_all_gather` returned.
        param_dtype : torch.dtype
            The nominal dtype of the unsharded weight.
        out : Float8Tensor, optional
            The unsharded weight of an earlier gather, updated in place.

        Returns
        -------
        tuple or None
            (unsharded Float8Tensor, tensors whose storage FSDP frees between gathers), or None
            when ``out`` is given.
        """
        from .float8_fsdp import post_all_gather
        return post_all_gather(Float8Tensor, all_gather_outputs, metadata, param_dtype, out)

    def _view_of(self, data: torch.Tensor) -> "Float8Tensor":
        """A Float8Tensor over a view of this one's data that shares its inverse scale (so a copy_
        into a slice, as FSDP does into its padded shard, sets the whole tensor's scale)."""
        out = Float8Tensor(data, self._scale_inv, self.dtype)
        out._quantizer = self._quantizer
        return copy_user_attributes(self, out)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _VIEW_OPS and type(args[0]) is Float8Tensor:
            # shape-only ops stay in FP8 (FSDP shards and pads a parameter with these); one
            # scale per tensor only (a view of tiles is a plain tensor, below)
            src = args[0]
            res = func(src._data, *args[1:], **kwargs)
            if isinstance(res, (list, tuple)):
                return type(res)(src._view_of(r) for r in res)
            out = src._view_of(res)
            if (res.shape == src._data.shape and res.stride() == src._data.stride()
                    and res.storage_offset() == src._data.storage_offset()):
                out._transpose_cache = src._transpose_cache  # the same elements: still valid
            return out
        if func is aten.new_zeros.default and type(args[0]) is Float8Tensor \
                and kwargs.get("dtype") in (None, args[0].dtype):
            src = args[0]
            data = torch.zeros(tuple(args[1]), dtype=src._data.dtype,
                               device=kwargs.get("device") or src.device)
            out = Float8Tensor(data, src._scale_inv.clone().to(data.device), src.dtype)
            out._quantizer = src._quantizer
            return out
        if func in (aten.detach.default, aten.alias.default):
            src = args[0]
            out = src._map_storage(lambda t: t, src.dtype)
            out._transpose_cache = src._transpose_cache
            return copy_user_attributes(src, out)
        if func is aten.clone.default and isinstance(args[0], Float8Tensor):
            src = args[0]
            return copy_user_attributes(src, src._map_storage(torch.clone, src.dtype))
        if func is aten._to_copy.default and isinstance(args[0], Float8Tensor):
            src = args[0]
            dtype = kwargs.get("dtype") or src.dtype
            device = kwargs.get("device") or src.device
            if dtype in (torch.float32, torch.float16, torch.bfloat16):
                out = src._map_storage(lambda t: t.to(device), dtype)
                return copy_user_attributes(src, out)
        if func is aten.copy_.default and isinstance(args[0], Float8Tensor):
            dst, src = args[0], args[1]
            if type(src) is type(dst) and src._data.dtype == dst._data.dtype:
                dst._copy_storage_from(src)
            else:
                _requantize_written(dst, src.dequantize() if isinstance(src, Float8Tensor) else src)
            return dst
        plain = tree_map(lambda a: a.dequantize() if isinstance(a, Float8Tensor) else a, (args, kwargs))
        result = func(*plain[0], **plain[1])
        if func._schema.is_mutable:
            # in-place op (an optimizer's add_, or its _foreach_ form over a list of parameters):
            # the result lives in the dequantised copies, which are quantised back
            for i, arg in enumerate(func._schema.arguments[:len(args)]):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    _requantize_written(args[i], plain[0][i])
            if args and isinstance(args[0], Float8Tensor):
                return args[0]
        return result


# ops that only re-describe the data's shape: applied to the FP8 data, the scale shared
_VIEW_OPS = frozenset({aten.view.default, aten._unsafe_view.default, aten.as_strided.default,
                       aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default})


def _requantize_written(original, updated) -> None:
    """Quantises the new values of an in-place op back into the Float8Tensor(s) it wrote."""
    from .float8_fsdp import requantize_together
    if isinstance(original, Float8Tensor):
        requantize_together([(original, updated)])
    elif isinstance(original, (list, tuple)):
        requantize_together([(o, u) for o, u in zip(original, updated) if isinstance(o, Float8Tensor)])


def _rebuild_float8_tensor(data, scale_inv, dtype, requires_grad):
    return Float8Tensor(data, scale_inv, dtype, requires_grad)


# torch.load(weights_only=True), which torch.distributed.checkpoint's loader uses, accepts only
# allowlisted callables; this one builds a Float8Tensor from two tensors, a dtype and a bool
torch.serialization.add_safe_globals([_rebuild_float8_tensor])


# ----- quantizers ---------------------------------------------------------------------------------

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _fp8_torch_dtype(who: str, fp8_dtype, device) -> torch.dtype:
    if not isinstance(fp8_dtype, (DType, torch.dtype)):
        raise TypeError(f"{who}: fp8_dtype must be a transformer_engine.pytorch.DType or torch FP8 "
                        f"dtype, got {fp8_dtype!r}")
    dt = torch_dtype_of(fp8_dtype, device)
    if dt not in _FP8_DTYPES:
        raise ValueError(f"{who}: fp8_dtype is {fp8_dtype!r}; expected an FP8 type (E4M3 or E5M2)")
    return dt


class Quantizer:
    """Base class of the quantizers: objects that turn a high-precision tensor into a quantized
    one (a :class:`Float8Tensor`) by a scaling rule that the subclass defines.

    Parameters
    ----------
    rowwise : bool, default True
        Produce the FP8 data in the tensor's own layout (what a GEMM reads for this operand
        as given).
    columnwise : bool, default True
        Also produce the FP8 transpose of a 2-D tensor at quantize time (what the backward
        GEMMs read); without it the transpose is made on first use.
    """

    def __init__(self, rowwise: bool = True, columnwise: bool = True):
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False

    def set_usage(self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None) -> None:
        """Changes which usages later quantizes produce; an argument left at None keeps its
        current setting.

        Parameters
        ----------
        rowwise : bool, optional
            See the class's ``rowwise``.
        columnwise : bool, optional
            See the class's ``columnwise``.
        """
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def __call__(self, tensor: torch.Tensor) -> Float8Tensor:
        """Quantizes ``tensor``: the same as ``quantize(tensor)``.

        Parameters
        ----------
        tensor : torch.Tensor
            A floating-point tensor (a quantized one is dequantised first).

        Returns
        -------
        Float8Tensor
        """
        return self.quantize(tensor)

    def _check_input(self, tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.quantize: expected a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if isinstance(tensor, Float8Tensor):
            tensor = tensor.dequantize()
        if not tensor.is_floating_point():
            raise TypeError(f"{type(self).__name__}.quantize: expected a floating-point tensor, "
                            f"got {tensor.dtype}")
        return tensor

    def _finish(self, x: torch.Tensor, data, scale_inv, dtype, out: Optional[Float8Tensor]):
        if out is not None:
            out._data.copy_(data.view(out._data.shape))
            out._scale_inv.copy_(scale_inv)
            out._transpose_cache = None
            return out
        t = Float8Tensor(data.view(x.shape), scale_inv, dtype or x.dtype)
        t._quantizer = self
        if self.columnwise_usage and x.dim() == 2 and x.numel():
            t.transpose_fp8()  # made now, as the quantizer was asked for the columnwise copy
        return t

    def make_empty(self, shape, dtype: torch.dtype = torch.float32,
                   device: Optional[torch.device] = None, requires_grad: bool = False) -> Float8Tensor:
        """A new quantized tensor with uninitialised data and an inverse scale of 1, tied to
        this quantizer (later in-place updates use its rule).

        Parameters
        ----------
        shape : sequence of int
            The tensor's shape.
        dtype : torch.dtype, default torch.float32
            The nominal (high-precision) dtype.
        device : torch.device, optional
            Where to allocate; default the quantizer's device (that of its scale).
        requires_grad : bool, default False
            Whether autograd tracks the tensor.

        Returns
        -------
        Float8Tensor
        """
        device = torch.device(device) if device is not None else self._device()
        data = torch.empty(tuple(shape), dtype=self.dtype, device=device)
        scale_inv = torch.ones(1, dtype=torch.float32, device=device)
        t = Float8Tensor(data, scale_inv, dtype, requires_grad)
        t._quantizer = self
        return t

    def update_quantized(self, src: torch.Tensor, dst: Float8Tensor) -> Float8Tensor:
        """Re-makes ``dst``'s FP8 data and inverse scale from ``src`` with this quantizer's
        rule, in place.

        Parameters
        ----------
        src : torch.Tensor
            The new high-precision value, of ``dst``'s shape.
        dst : Float8Tensor
            The tensor to overwrite; its cached transpose is dropped.

        Returns
        -------
        Float8Tensor
            ``dst``.
        """
        return self.quantize(src, out=dst)


class Float8Quantizer(Quantizer):
    """FP8 with a given per-tensor scale (the delayed-scaling rule): ``data = cast(x * scale)``,
    ``scale_inv = 1 / scale``, and each quantize raises ``amax`` to ``max(amax, max|x|)`` so that
    the caller can compute the next scale from it.

    Parameters
    ----------
    scale : torch.Tensor
        One-element float32 tensor; read at every quantize, so updating it in place changes the
        scale of later quantizes.
    amax : torch.Tensor
        One-element float32 tensor that each quantize maxes the input's absolute maximum into.
    fp8_dtype : DType or torch.dtype
        The FP8 format: ``DType.kFloat8E4M3`` / ``DType.kFloat8E5M2`` (mapped to the FP8 flavour
        of ``scale``'s device: OCP, or FNUZ on AMD gfx942) or a torch FP8 dtype.
    rowwise : bool, default True
        See :class:`Quantizer`.
    columnwise : bool, default True
        See :class:`Quantizer`.
    """

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype, *, rowwise: bool = True,
                 columnwise: bool = True):
        super().__init__(rowwise, columnwise)
        who = "Float8Quantizer"
        for name, t in (("scale", scale), ("amax", amax)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
                raise TypeError(f"{who}: {name} must be a one-element float32 tensor, got "
                                f"{getattr(t, 'dtype', type(t).__name__)} with "
                                f"{getattr(t, 'numel', lambda: '?')()} elements")
        self.scale, self.amax = scale, amax
        self.dtype = _fp8_torch_dtype(who, fp8_dtype, scale.device)

    def _device(self):
        return self.scale.device

    def quantize(self, tensor: torch.Tensor, *, out: Optional[Float8Tensor] = None,
                 dtype: Optional[torch.dtype] = None) -> Float8Tensor:
        """Quantizes a tensor with this quantizer's rule.

        Parameters
        ----------
        tensor : torch.Tensor
            A floating-point tensor (a quantized one is dequantised first).
        out : Float8Tensor, optional
            Write the result into this tensor (of the same shape) instead of a new one.
        dtype : torch.dtype, optional
            Nominal dtype of a new result; default ``tensor.dtype``.

        Returns
        -------
        Float8Tensor
            ``out`` when given, else a new tensor tied to this quantizer.
        """
        from ..kernels import quantize
        x = self._check_input(tensor).contiguous()
        scale = self.scale.reshape(1).to(x.device)
        amax = self.amax.reshape(1)
        if x.numel():
            data, scale_inv = quantize(x, scale, self.dtype, amax if amax.device == x.device else None)
            if amax.device != x.device:
                amax.copy_(torch.maximum(amax, x.abs().amax().float().reshape(1).to(amax.device)))
        else:
            data = torch.empty(x.shape, dtype=self.dtype, device=x.device)
            scale_inv = torch.reciprocal(scale)
        return self._finish(x, data, scale_inv, dtype, out)


class Float8CurrentScalingQuantizer(Quantizer):
    """FP8 with a per-tensor scale computed from each input's own amax at every quantize:
    ``scale = fp8_max / amax(x)``. The attributes ``scale`` and ``amax`` hold the last
    quantize's values.

    Parameters
    ----------
    fp8_dtype : DType or torch.dtype
        The FP8 format: ``DType.kFloat8E4M3`` / ``DType.kFloat8E5M2`` (mapped to the FP8 flavour
        of ``device``: OCP, or FNUZ on AMD gfx942) or a torch FP8 dtype.
    device : torch.device or str, optional
        Where ``scale`` and ``amax`` live; default the current GPU, else the CPU.
    rowwise : bool, default True
        See :class:`Quantizer`.
    columnwise : bool, default True
        See :class:`Quantizer`.
    use_existing_amax : bool, default False
        Use the ``amax`` attribute as it is (set by the caller) instead of measuring the input.
    with_amax_reduction : bool, default False
        All-reduce (maximum) the measured amax over ``amax_reduction_group`` before computing the
        scale, so that every rank uses the same scale; skipped when torch.distributed is not
        initialised.
    amax_reduction_group : torch.distributed.ProcessGroup, optional
        The group of that reduction; default the world group.
    force_pow_2_scales : bool, default False
        Round each scale down to a power of two.
    amax_epsilon : float, default 0.0
        Floor of the amax (>= 0), which bounds the scale of near-zero inputs.
    """

    def __init__(self, fp8_dtype, device=None, *, rowwise: bool = True, columnwise: bool = True,
                 use_existing_amax: bool = False, with_amax_reduction: bool = False,
                 amax_reduction_group=None, force_pow_2_scales: bool = False,
                 amax_epsilon: float = 0.0):
        super().__init__(rowwise, columnwise)
        who = "Float8CurrentScalingQuantizer"
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(device)
        self.dtype = _fp8_torch_dtype(who, fp8_dtype, device)
        if amax_epsilon < 0:
            raise ValueError(f"{who}: amax_epsilon is {amax_epsilon}; expected >= 0")
        self.device = device
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.use_existing_amax = use_existing_amax
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = float(amax_epsilon)

    def _device(self):
        return self.device

    def quantize(self, tensor: torch.Tensor, *, out: Optional[Float8Tensor] = None,
                 dtype: Optional[torch.dtype] = None) -> Float8Tensor:
        """Quantizes a tensor with this quantizer's rule.

        Parameters
        ----------
        tensor : torch.Tensor
            A floating-point tensor (a quantized one is dequantised first).
        out : Float8Tensor, optional
            Write the result into this tensor (of the same shape) instead of a new one.
        dtype : torch.dtype, optional
            Nominal dtype of a new result; default ``tensor.dtype``.

        Returns
        -------
        Float8Tensor
            ``out`` when given, else a new tensor tied to this quantizer.
        """
        from ..kernels import quantize
        from ..quantization import scale_from_amax
        x = self._check_input(tensor).contiguous()
        if not self.use_existing_amax:
            amax = x.abs().amax().float().reshape(1) if x.numel() else torch.zeros(1, device=x.device)
            if self.with_amax_reduction:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)
            self.amax = amax.to(self.device)
        amax = self.amax.to(x.device)
        if self.amax_epsilon:
            amax = torch.clamp(amax, min=self.amax_epsilon)
        fp8_max = torch.full((1,), fp8_max_of_dtype(self.dtype), device=x.device)
        scale = scale_from_amax(amax, fp8_max, self.force_pow_2_scales).contiguous()
        self.scale = scale.to(self.device)
        if x.numel():
            data, scale_inv = quantize(x, scale, self.dtype)
        else:
            data = torch.empty(x.shape, dtype=self.dtype, device=x.device)
            scale_inv = torch.reciprocal(scale)
        return self._finish(x, data, scale_inv, dtype, out)
