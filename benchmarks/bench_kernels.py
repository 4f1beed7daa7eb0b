"""Memory-bound kernel families (normalization, activation, softmax, RoPE, the bias gradient's
column sum) against plain PyTorch eager, torch.compile of the same reference, and the measured
device copy bandwidth.

Each family lives in benchmarks/kernel_cases/<family>.py and exposes CASES: a list of dicts
  {"family", "name", "shape", "bytes": bytes read once + written once,
   "make": i -> args (fresh random inputs), "te": fn(*args), "torch": fn(*args)}
torch.compile is applied to the "torch" function here, so every family is measured alike, with
dynamic=False: each shape gets its own specialised kernel (a second shape of the same function
would otherwise be recompiled with dynamic shapes, a slower kernel that flatters our ratios).

te, eager and compiled are timed interleaved (common.time_interleaved_ms: rounds of graph
replays, each contender's median per round, then the median over rounds), so clock or thermal
drift during a case does not favour whichever contender ran at a better moment.

The kernels' bars are checked per row: % of copy (normalization forward 85, backward 75;
activations 85; softmax 80; RoPE and the bias gradient have none) and te at least as fast as
compiled (te_vs_compiled >= 1). Cases may name a group (with a weight per case): the group's
total time and bandwidth are printed after the table. `--filter REGEX` runs the cases whose
"family name shape" label matches.
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
    rounds, reps = (3, 5) if args.quick else (5, 10)
    copy = common.copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s (read + write)")
    rows = []
    for mod in pkgutil.iter_modules(kernel_cases.__path__):
        cases = importlib.import_module(f"kernel_cases.{mod.name}").CASES
        for case in cases:
            shape = "x".join(map(str, case["shape"]))
            if not common.selected(f"{case['family']} {case['name']} {shape}", args.filter):
                continue
            pick = common.rotating(case["make"])
            # A fresh dynamo state per case: peers built by one closure factory share a code
            # object, and past the recompile limit (8) dynamo silently runs the peer eagerly.
            torch._dynamo.reset()
            compiled = torch.compile(case["torch"], dynamic=False)
            row = {"family": case["family"], "name": case["name"], "shape": shape,
                   "bytes": case["bytes"]}
            contenders = {"te": case["te"], "eager": case["torch"], "compiled": compiled}
            times = common.time_interleaved_ms(
                {label: (lambda f=fn: f(*pick())) for label, fn in contenders.items()},
                rounds=rounds, reps=reps)
            for label, ms in times.items():
                row[f"{label}_ms"] = ms
                row[f"{label}_gbs"] = case["bytes"] / (ms * 1e-3) / 1e9
            row["te_pct_copy"] = 100 * row["te_gbs"] / copy
            row["te_vs_eager"] = row["eager_ms"] / row["te_ms"]
            row["te_vs_compiled"] = row["compiled_ms"] / row["te_ms"]
            if case.get("group"):
                row["group"], row["group_weight"] = case["group"]
            row["pct_bar"] = copy_bar(case["family"], case["name"])
            row["meets_bar"] = "yes" if meets_bar(row) else "NO"
            print(f"  {row['family']:>13} {row['name']:<20} {shape:>14}  {row['te_pct_copy']:5.1f}% "
                  f"of copy  x{row['te_vs_compiled']:.3f} compiled  {row['meets_bar']}", flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    for r in rows:  # LayerNorm with an FP8 output must cost at most 10% more than bf16 output
        if r["family"] == "normalization" and r["name"].endswith("_fp8"):
            plain = [p for p in rows if p["name"] == r["name"][:-4] and p["shape"] == r["shape"]]
            if plain:
                r["fp8_vs_bf16_time"] = r["te_ms"] / plain[0]["te_ms"]
                if r["fp8_vs_bf16_time"] > 1.1:
                    r["meets_bar"] = "NO"
    common.print_table(rows, ["family", "name", "shape", "te_gbs", "te_pct_copy", "eager_gbs",
                              "compiled_gbs", "te_vs_eager", "te_vs_compiled", "meets_bar"])
    print_groups(rows)
    misses = [f"{r['name']} {r['shape']}" for r in rows if r["meets_bar"] != "yes"]
    print(f"\nbars (% of copy per family, te >= compiled): {len(rows) - len(misses)}/{len(rows)} "
          "rows meet them" + (f"; below: {', '.join(misses)}" if misses else ""))
    common.write_json(args.json, {**common.device_record(), "copy_gbs": copy, "results": rows})


def print_groups(rows: list) -> None:
    """Totals of the cases a family groups (e.g. the bias gradients of one GPT block): each row's
    time and bytes counted group_weight times."""
    groups = {}
    for r in rows:
        if r.get("group"):
            groups.setdefault((r["family"], r["name"], r["group"]), []).append(r)
    for (family, name, group), members in groups.items():
        w = [m["group_weight"] for m in members]
        nbytes = sum(k * m["bytes"] for k, m in zip(w, members))
        total = {c: sum(k * m[c + "_ms"] for k, m in zip(w, members)) for c in ("te", "eager", "compiled")}
        parts = " + ".join(f"{k} x {m['shape']}" for k, m in zip(w, members))
        print(f"\n{family} {name}, {group} ({parts}): "
              + ", ".join(f"{c} {ms:.4f} ms = {nbytes / (ms * 1e-3) / 1e9:.0f} GB/s"
                          for c, ms in total.items())
              + f"; te vs eager x{total['eager'] / total['te']:.2f}, vs compiled "
                f"x{total['compiled'] / total['te']:.2f}")


def copy_bar(family: str, name: str):
    """The bandwidth bar for a case, in % of copy (None: the family has none)."""
    if family == "normalization":
        if name.endswith("_fp8"):
            return None  # its bar: within 10% of the time of the bf16 output (fp8_vs_bf16_time)
        return 75.0 if "bwd" in name else 85.0
    return {"activation": 85.0, "softmax": 80.0}.get(family)


def meets_bar(row: dict) -> bool:
    pct_ok = row["pct_bar"] is None or row["te_pct_copy"] >= row["pct_bar"]
    return pct_ok and row["te_vs_compiled"] >= 1.0


if __name__ == "__main__":
    main()
