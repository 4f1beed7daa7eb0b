"""The first checks of a module call: its input is a floating-point tensor, on the device of
the parameters the call reads. Made at the module's entry so that the error names the module and
its argument (te.Linear: inp), not the first internal op that would have refused the tensor (or,
on the eager direct path, a kernel that read another device's memory)."""
from __future__ import annotations

import torch

FLOAT_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_float_input(module: torch.nn.Module, arg: str, x) -> None:
    if isinstance(x, torch.Tensor) and x.dtype not in FLOAT_INPUT_DTYPES:
        raise ValueError(f"te.{type(module).__name__}: {arg} has dtype "
                         f"{str(x.dtype).replace('torch.', '')}; expected a floating-point tensor "
                         f"(float32, float16 or bfloat16)")


# the current CUDA device's index (torch's raw query; torch.cuda.current_device() wraps it)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def call_checked(module: torch.nn.Module, arg: str, nn_call, args, kwargs,
                 float_input: bool = True):
    """nn.Module.__call__ after checking the first positional argument (or `arg` by keyword):
    a floating-point tensor (unless float_input is False: a module that checks its inputs' dtypes
    itself, naming each).

    An input on another GPU than the current one runs with that GPU made current for the call,
    as torch's own ops do: the native calls launch on the current device, with the stream and
    addresses of the input's, which on a device that cannot reach the other's memory faults.
    (The backward needs nothing: autograd runs each node with the stream its forward ran on
    made current, and with it that stream's GPU, on the device's own thread or, with autograd
    multithreading off, on the caller's.)"""
    x = args[0] if args else kwargs.get(arg)
    if float_input:
        check_float_input(module, arg, x)
    if (isinstance(x, torch.Tensor) and x.is_cuda and not torch.compiler.is_compiling()
            and _current_device is not None and x.get_device() != _current_device()):
        with torch.cuda.device(x.get_device()):
            return nn_call(module, *args, **kwargs)
    return nn_call(module, *args, **kwargs)


def check_fp8_dims(who: str, tokens: int, *dims: int) -> None:
    """FP8 GEMMs need every dimension to be a multiple of 16."""
    bad = [d for d in (tokens,) + dims if d % 16]
    if bad:
        raise ValueError(f"{who}: FP8 needs the token count (prod of the input's leading dims) and "
                         f"the feature sizes to be multiples of 16; got tokens={tokens}, "
                         f"features={list(dims)}. Pad the batch or run this module outside fp8_autocast.")


def check_on_input_device(who: str, inp: torch.Tensor, named_tensors) -> None:
    """Raises ValueError when a (name, tensor) of named_tensors (the parameters a call reads; None
    entries skipped) is not on inp's device. The eager direct calls hand the kernels raw
    addresses, checking only the input's device: a GPU kernel given a host or another device's
    address faults, and the fault ends the process's CUDA context. Two integer reads per
    tensor: cheap enough for every call."""
    index, meta = inp.get_device(), inp.is_meta
    for name, t in named_tensors:
        if t is not None and (t.get_device() != index or t.is_meta != meta):
            raise ValueError(f"{who}: inp is on {inp.device} but {name} is on {t.device}; move the "
                             f"input to the module's device, or the module to the input's "
                             f"(module.to('{inp.device}'))")
