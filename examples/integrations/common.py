"""What the client scripts in this folder share: checking that the Transformer Engine layers a
client built come from this library and ran FP8, and writing the result as one JSON line."""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import transformer_engine
import transformer_engine.pytorch as te

PACKAGE_DIR = os.path.dirname(os.path.abspath(transformer_engine.__file__))


def parse_args(description: str, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, help="file the result is appended to as one JSON line")
    p.add_argument("--steps", type=int, default=12, help="training steps (at least 10)")
    if extra is not None:
        extra(p)
    args = p.parse_args()
    if args.steps < 10:
        p.error("--steps must be at least 10")
    return args


def te_layers(model: torch.nn.Module) -> list:
    """(qualified name, class name) of every module built on a transformer_engine.pytorch class."""
    found = []
    for name, m in model.named_modules():
        if any(c.__module__.startswith("transformer_engine.pytorch") for c in type(m).__mro__):
            found.append((name, type(m).__name__))
    return found


def check_ours(model: torch.nn.Module) -> list:
    """Every TE-derived module's transformer_engine classes come from this library's package
    (its files, its +portable version); returns the layer list. Raises when one does not."""
    if "+portable" not in transformer_engine.__version__:
        raise SystemExit(f"transformer_engine {transformer_engine.__version__} is not this library")
    layers = te_layers(model)
    if not layers:
        raise SystemExit("the client built no Transformer Engine layers")
    import inspect
    for name, _ in layers:
        m = model.get_submodule(name)
        for c in type(m).__mro__:
            if c.__module__.startswith("transformer_engine."):
                path = os.path.abspath(inspect.getfile(c))
                if not path.startswith(PACKAGE_DIR):
                    raise SystemExit(f"{name}: {c.__qualname__} comes from {path}, not {PACKAGE_DIR}")
    return layers


def fp8_ran(model: torch.nn.Module) -> bool:
    """Whether every TE GEMM module made FP8 state with recorded amaxes (FP8 really ran)."""
    gemm_modules = [m for m in model.modules()
                    if isinstance(m, te.module.base.TransformerEngineBaseModule)]
    if not gemm_modules:
        return False
    for m in gemm_modules:
        meta = m.fp8_meta
        if not meta["fp8_checkpoint"]:
            return False
        if meta["recipe"] is not None and meta["recipe"].delayed():
            if not bool((meta["scaling_fwd"].amax_history > 0).any()):
                return False
    return True


def write_result(path: str, record: dict) -> None:
    record = dict(record, transformer_engine=transformer_engine.__version__, torch=torch.__version__,
                  device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                  date=time.strftime("%Y-%m-%d"))
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(json.dumps(record))


def falling(losses: list) -> bool:
    """The loss fell: the mean of the last three steps below 90% of the first step's."""
    return sum(losses[-3:]) / 3 < 0.9 * losses[0]
