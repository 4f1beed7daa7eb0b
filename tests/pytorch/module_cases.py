"""What test_sanity.py and test_numerics.py share: the modules of the public API built from one
description, the recipes, the shapes, and the case generator that keeps the cartesian product
bounded on CPU while the GPU (native backend present) runs a fuller one.

Case generation: each module names its axes; the `core` axes are crossed in full, every other
axis is spread over those cases in a balanced, seeded shuffle, so every value of every axis appears
and values meet in varied combinations. The CPU (reference backend, FP8 emulated, 2 cores in CI)
crosses few axes; a machine with the native GPU backend crosses more on "cuda" (same file, same
test, only a larger product).
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe
from utils import native_gpu_reason

HAS_NATIVE_GPU = not native_gpu_reason()

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RECIPES = ("none", "delayed", "current")
ACTIVATIONS = ("gelu", "relu", "qgelu", "srelu", "silu", "geglu", "reglu", "swiglu", "qgeglu", "sreglu",
               "glu", "clamped_swiglu")
GATED = ("geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu", "clamped_swiglu")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
SKIPS = ("none", "wgrad", "dgrad")
MODULES = ("Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP")
GEMM_MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP")


@dataclass(frozen=True)
class Shape:
    """Input [batch, seq, hidden]; ffn is the output features of Linear/LayerNormLinear and the
    FFN size of LayerNormMLP. fp8_ok: every GEMM dim a multiple of 16."""
    name: str
    batch: int
    seq: int
    hidden: int
    ffn: int

    @property
    def fp8_ok(self) -> bool:
        return self.hidden % 16 == 0 and self.ffn % 16 == 0 and (self.batch * self.seq) % 16 == 0

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


SHAPES = {
    "small": Shape("small", 2, 16, 64, 96),
    "odd": Shape("odd", 3, 37, 69, 35),       # nothing divisible by 16: FP8 must refuse it
    "empty": Shape("empty", 0, 16, 64, 96),   # zero tokens
}


def make_recipe(name: str):
    if name == "none":
        return None
    if name == "delayed":
        return te_recipe.DelayedScaling()
    if name == "current":
        return te_recipe.Float8CurrentScaling()
    if name == "block":
        return te_recipe.Float8BlockScaling()
    if name == "current_override":
        return te_recipe.Float8CurrentScaling(backward_override="high_precision")
    raise ValueError(name)


def autocast(recipe_name: str):
    """fp8_autocast as NVIDIA TE users write it (enabled=False for the high-precision cases)."""
    r = make_recipe(recipe_name)
    return te.fp8_autocast(enabled=r is not None, fp8_recipe=r)


def make_module(name: str, shape: Shape, dtype, device, *, bias=True, normalization="LayerNorm",
                activation="gelu", zero_centered_gamma=False, **extra):
    """One module of the public API, constructed with NVIDIA TE's argument names."""
    h, f = shape.hidden, shape.ffn
    common = dict(params_dtype=dtype, device=device, **extra)
    if name == "Linear":
        return te.Linear(h, f, bias=bias, **common)
    if name == "LayerNorm":
        return te.LayerNorm(h, zero_centered_gamma=zero_centered_gamma, **common)
    if name == "RMSNorm":
        return te.RMSNorm(h, zero_centered_gamma=zero_centered_gamma, **common)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(h, f, bias=bias, normalization=normalization,
                                  zero_centered_gamma=zero_centered_gamma, **common)
    if name == "LayerNormMLP":
        return te.LayerNormMLP(h, f, bias=bias, normalization=normalization, activation=activation,
                               zero_centered_gamma=zero_centered_gamma, **common)
    raise ValueError(name)


def module_axes(module: str, device: str) -> tuple:
    """(axes: name -> values, core: names crossed in full) of one module on one device."""
    axes = {"dtype": tuple(DTYPES), "shape": tuple(SHAPES), "skip": SKIPS}
    if module in GEMM_MODULES:
        axes.update(recipe=RECIPES, bias=(True, False), microbatch=(False, True))
    else:  # a norm alone has no GEMM; it still runs inside an FP8 autocast
        axes.update(recipe=("none", "current"))
    if module != "Linear":
        axes["zero_centered_gamma"] = (False, True)
    if module in ("LayerNormLinear", "LayerNormMLP"):
        axes["normalization"] = NORMALIZATIONS
    if module == "LayerNormMLP":
        axes["activation"] = ACTIVATIONS
    full = device == "cuda"
    core = {
        "Linear": ("dtype", "recipe", "shape", "bias", "skip", "microbatch") if full
        else ("dtype", "recipe", "shape", "bias"),
        "LayerNorm": ("dtype", "shape", "zero_centered_gamma", "skip") if full
        else ("dtype", "shape", "zero_centered_gamma"),
        "RMSNorm": ("dtype", "shape", "zero_centered_gamma", "skip") if full
        else ("dtype", "shape", "zero_centered_gamma"),
        "LayerNormLinear": ("dtype", "recipe", "shape", "normalization", "bias", "zero_centered_gamma", "skip")
        if full else ("dtype", "recipe", "shape", "normalization"),
        "LayerNormMLP": ("dtype", "recipe", "shape", "activation", "normalization", "bias") if full
        else ("dtype", "recipe", "activation"),
    }[module]
    return axes, core


def generate(module: str, device: str) -> list:
    """Case dicts of one module on one device (see the module docstring)."""
    axes, core = module_axes(module, device)
    return spread_cases(axes, core, f"{module}-{device}")


def spread_cases(axes: dict, core: tuple, seed: str) -> list:
    """The full product of the `core` axes, every other axis spread over it (balanced, shuffled)."""
    combos = list(itertools.product(*(axes[a] for a in core)))
    rng = random.Random(seed)
    spread = {}
    for a in (a for a in axes if a not in core):
        vals = list(axes[a]) * (len(combos) // len(axes[a]) + 1)
        vals = vals[:len(combos)]
        rng.shuffle(vals)
        spread[a] = vals
    cases = []
    for i, combo in enumerate(combos):
        case = dict(zip(core, combo))
        case.update({a: v[i] for a, v in spread.items()})
        cases.append(case)
    return cases


def case_id(module: str, case: dict) -> str:
    parts = [module, case["dtype"], case["recipe"], case["shape"]]
    for key in ("normalization", "activation"):
        if key in case:
            parts.append(case[key])
    if case.get("bias") is False:
        parts.append("nobias")
    if case.get("skip", "none") != "none":
        parts.append(f"skip_{case['skip']}")
    if case.get("microbatch"):
        parts.append("ubatch")
    if case.get("zero_centered_gamma"):
        parts.append("zcg")
    return "-".join(parts)


def parametrize_cases(modules=MODULES):
    """pytest params (device, module, case) for every module: the CPU product always, the fuller
    GPU product where the native backend is present, else one skipped placeholder saying why."""
    params = []
    for module in modules:
        for case in generate(module, "cpu"):
            params.append(pytest.param("cpu", module, case, id="cpu-" + case_id(module, case)))
        if HAS_NATIVE_GPU:
            for case in generate(module, "cuda"):
                params.append(pytest.param("cuda", module, case, id="cuda-" + case_id(module, case)))
    if not HAS_NATIVE_GPU:
        params.append(pytest.param("cuda", None, None, id="cuda-all",
                                   marks=pytest.mark.skip(reason=native_gpu_reason())))
    return params


def fp8_refused(module: str, case: dict) -> bool:
    """A GEMM module asked for FP8 at a shape whose dims are not multiples of 16 must raise."""
    return module in GEMM_MODULES and case["recipe"] != "none" and not SHAPES[case["shape"]].fp8_ok
