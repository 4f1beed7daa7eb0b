"""Memory-bound kernel families (normalization, activation, softmax, RoPE) against plain PyTorch
eager, torch.compile of the same reference, and the measured device copy bandwidth.

Each family lives in benchmarks/kernel_cases/<family>.py and exposes CASES: a list of dicts
  {"family", "name", "shape", "bytes": bytes read once + written once,
   "make": i -> args (fresh random inputs), "te": fn(*args), "torch": fn(*args)}
torch.compile is applied to the "torch" function here, so every family is measured alike.
"""
import importlib
import os
import pkgutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import kernel_cases  # noqa: E402


def main():
    args = common.parse_args(__doc__)
    reps = 10 if args.quick else 30
    copy = common.copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s (read + write)")
    rows = []
    for mod in pkgutil.iter_modules(kernel_cases.__path__):
        cases = importlib.import_module(f"kernel_cases.{mod.name}").CASES
        for case in cases:
            pick = common.rotating(case["make"])
            compiled = torch.compile(case["torch"])
            row = {"family": case["family"], "name": case["name"], "shape": "x".join(map(str, case["shape"]))}
            for label, fn in (("te", case["te"]), ("eager", case["torch"]), ("compiled", compiled)):
                ms = common.time_ms(lambda: fn(*pick()), reps=reps)
                row[f"{label}_ms"] = ms
                row[f"{label}_gbs"] = case["bytes"] / (ms * 1e-3) / 1e9
            row["te_pct_copy"] = 100 * row["te_gbs"] / copy
            row["te_vs_compiled"] = row["compiled_ms"] / row["te_ms"]
            rows.append(row)
            torch.cuda.empty_cache()
    common.print_table(rows, ["family", "name", "shape", "te_gbs", "te_pct_copy", "eager_gbs",
                              "compiled_gbs", "te_vs_compiled"])
    common.write_json(args.json, {**common.device_record(), "copy_gbs": copy, "results": rows})


if __name__ == "__main__":
    main()
