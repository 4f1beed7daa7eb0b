"""Device queries of NVIDIA Transformer Engine's top-level API."""
from __future__ import annotations

from typing import Tuple, Union

import torch


def get_device_compute_capability() -> Tuple[int, int]:
    """(major, minor) compute capability of the current GPU; (0, 0) when no GPU is visible
    (the reference backend)."""
    if not torch.cuda.is_available():
        return (0, 0)
    return torch.cuda.get_device_capability()


def is_bf16_available(return_reason: bool = False) -> Union[bool, Tuple[bool, str]]:
    """Whether bfloat16 runs here: on the current GPU when one is visible (NVIDIA Ampere or
    newer, AMD CDNA2 or newer), else on the CPU reference backend (always)."""
    if not torch.cuda.is_available():
        result = (True, "")
    elif torch.cuda.is_bf16_supported():
        result = (True, "")
    else:
        result = (False, f"{torch.cuda.get_device_name()} has no bfloat16 support")
    return result if return_reason else result[0]
