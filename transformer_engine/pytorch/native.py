"""The thin bridge from torch tensors to the native C API: dtype codes, descriptors, stream,
and the per-device capability (FP8 flavour) as torch sees it."""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ..common import capabilities, fp8_formats
from ..common.native import build_backend, emulation, native_module

DTYPE_CODE = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e4m3fnuz: 3,
    torch.float8_e5m2: 4,
    torch.float8_e5m2fnuz: 4,
    torch.int32: 5,
    torch.int64: 6,
    torch.uint8: 7,
    torch.int8: 7,
    torch.bool: 7,
}

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
HP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _torch_backend() -> str | None:
    if not torch.cuda.is_available():
        return None
    return "rocm" if torch.version.hip else "cuda"


@functools.lru_cache(maxsize=None)
def native_for_torch():
    """The native module when it was built for the vendor this torch runs on, else None."""
    mod = native_module()
    if mod is not None and emulation():
        return mod
    if mod is None or build_backend() != _torch_backend():
        return None
    return mod


def use_native(t: torch.Tensor) -> bool:
    # The emulated AMD build runs its kernels on the host: CPU tensors are its device memory.
    if t.is_cuda or (t.device.type == "cpu" and emulation()):
        return native_for_torch() is not None
    return False


def emulated_device(device) -> bool:
    """Whether `device` is the emulated AMD device (CPU memory of the emulated build)."""
    return emulation() is not None and torch.device(device).type == "cpu"


@functools.lru_cache(maxsize=None)
def _emulated_capability() -> capabilities.Capability:
    return capabilities.native_device_capability(0)


@functools.lru_cache(maxsize=None)
def device_capability(index: int) -> capabilities.Capability:
    props = torch.cuda.get_device_properties(index)
    arch = getattr(props, "gcnArchName", None) if torch.version.hip else f"sm_{props.major}{props.minor}"
    backend = "rocm" if torch.version.hip else "cuda"
    if native_for_torch() is None:
        backend = "reference"
    return capabilities.capability_for(backend, arch, props.name)


def capability(device: torch.device | str | int | None = None) -> capabilities.Capability:
    """What the native backend offers on a device.

    Parameters
    ----------
    device : torch.device, str or int, optional
        The device (an int is a CUDA/ROCm device index). Default: the current GPU, or the CPU when
        there is none. Any non-GPU device reports the reference backend.

    Returns
    -------
    transformer_engine.common.capabilities.Capability
        The backend (``'cuda'``, ``'rocm'`` or ``'reference'``), the device name and architecture,
        the FP8 flavour (``'ocp'``, ``'fnuz'`` or None), whether FP8 GEMMs are supported, and the
        reason for the answer.
    """
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type == "cpu" and emulation():
        return _emulated_capability()
    if device.type != "cuda":
        return capabilities.reference_capability(f"{device.type} tensors")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return device_capability(index)


def fp8_dtype(fmt: str, device=None) -> torch.dtype:
    """The torch FP8 dtype of a format on a device.

    Parameters
    ----------
    fmt : {'e4m3', 'e5m2'}
        The FP8 format.
    device : torch.device, str or int, optional
        The device (default: the current GPU, or the CPU). NVIDIA and AMD gfx950 use the OCP
        dtypes (``torch.float8_e4m3fn``, ``torch.float8_e5m2``), AMD gfx942 the FNUZ ones
        (``torch.float8_e4m3fnuz``, ``torch.float8_e5m2fnuz``); the CPU uses OCP.

    Raises
    ------
    NotImplementedError
        When the device has no FP8 support.
    """
    cap = capability(device)
    if cap.fp8_flavor is None:
        raise NotImplementedError(f"FP8 is not available on {cap.device or cap.arch}: {cap.reason}")
    return getattr(torch, fp8_formats.fp8_dtype_name(fmt, cap.fp8_flavor))


def address(v) -> int:
    """A device address for the bindings: 0 for None, an int as it is, else the tensor's."""
    if v is None:
        return 0
    return v if type(v) is int else v.data_ptr()


def describe(t: torch.Tensor | None, amax=None, scale=None, scale_inv=None, shape=None) -> tuple:
    """Descriptor tuple for the bindings: (ptr, shape, dtype, amax_ptr, scale_ptr, scale_inv_ptr);
    amax, scale and scale_inv are tensors, addresses (ints) or None."""
    return (t.data_ptr(), t.shape if shape is None else tuple(shape), DTYPE_CODE[t.dtype],
            address(amax), address(scale), address(scale_inv))


_raw_stream_of_index = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(index: Optional[int]) -> int:
    """The handle of the current stream on device `index` (None: the current device). torch's
    raw query when it has one: torch.cuda.current_stream() builds a Stream object per call, which
    cost more host time than some of the kernels it launches."""
    if emulation() and not torch.cuda.is_available():
        return 0  # the emulation's streams are sequential
    if index is None:
        index = torch.cuda.current_device()
    if _raw_stream_of_index is not None:
        return _raw_stream_of_index(index)
    return torch.cuda.current_stream(index).cuda_stream


def stream_of(t: torch.Tensor) -> int:
    """The handle of the current stream on t's device."""
    return stream_handle(t.device.index)
