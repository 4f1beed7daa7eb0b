"""Argument checks shared by the ops: every message names the op, the argument and what was
expected, and is raised before anything touches device memory."""
from __future__ import annotations

import torch

from .. import native


def check_tensor(op: str, name: str, t, dtypes=None, contiguous=True):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name} has dtype {str(t.dtype).replace('torch.', '')}; expected one of {names}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{op}: {name} of shape {tuple(t.shape)} is not contiguous; call .contiguous() first")


def check_scalar_fp32(op: str, name: str, t, device):
    check_tensor(op, name, t, (torch.float32,))
    if t.numel() != 1:
        raise ValueError(f"{op}: {name} must hold one float32 value, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device}; expected {device} like the input")


def check_fp8_dtype(op: str, fp8_dtype, device):
    """The FP8 dtype must be one the device encodes (OCP on NVIDIA/gfx950, FNUZ on gfx942)."""
    if fp8_dtype not in native.FP8_DTYPES:
        raise ValueError(f"{op}: fp8_dtype is {fp8_dtype}; expected an FP8 dtype")
    if torch.device(device).type != "cuda" and not native.emulated_device(device):
        return  # the reference backend emulates both encodings
    cap = native.capability(device)
    if cap.fp8_flavor is None:
        raise NotImplementedError(f"{op}: device {cap.device or cap.arch} has no FP8: {cap.reason}")
    want_fnuz = cap.fp8_flavor == "fnuz"
    if (fp8_dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)) != want_fnuz:
        raise ValueError(f"{op}: fp8_dtype {fp8_dtype} does not match {cap.arch or 'this device'}, "
                         f"which uses the {cap.fp8_flavor.upper()} encodings")
