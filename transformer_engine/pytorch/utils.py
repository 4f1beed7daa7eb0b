"""Helpers of NVIDIA Transformer Engine's transformer_engine.pytorch.utils that model code
imports: weight initialisers, the attention-mask function of unfused attention, and small
size helpers."""
from __future__ import annotations

import math
from typing import Callable

import torch

from .device_info import get_device_compute_capability  # noqa: F401


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """An initialiser drawing N(0, sigma^2) in place."""
    def init_(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)
    return init_


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """N(0, (sigma / sqrt(2 * num_layers))^2): the output layers' initialiser of GPT-2 style
    models (their residual contributions add up over 2 * num_layers blocks)."""
    if num_layers < 1:
        raise ValueError(f"scaled_init_method_normal: num_layers is {num_layers}; expected >= 1")
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def attention_mask_func(attention_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scores with masked positions (mask True: masked out) set to -10000, in place."""
    attention_scores.masked_fill_(attention_mask, -10000.0)
    return attention_scores


def round_up_to_nearest_multiple(value: int, multiple: int) -> int:
    if multiple <= 0:
        raise ValueError(f"round_up_to_nearest_multiple: multiple is {multiple}; expected > 0")
    return ((value + multiple - 1) // multiple) * multiple


def divide(numerator: int, denominator: int) -> int:
    """numerator / denominator, which must divide exactly."""
    if denominator == 0 or numerator % denominator:
        raise ValueError(f"divide: {numerator} is not divisible by {denominator}")
    return numerator // denominator
