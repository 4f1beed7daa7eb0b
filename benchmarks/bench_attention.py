"""Attention: forward and backward TFLOP/s of our backends against their peers, same run.

Cases come from benchmarks/attention_cases/<module>.py; a module exposes run_gpt_block(quick)
(the TransformerLayer step, rows of its own) or CASES, a list of
  {"group", "name", "shape", "flops_fwd", "flops_bwd", "make": i -> args,
   "fns": {label: (fwd(*args), fwd_bwd(*args))}, "ours": [labels], "peers": [labels],
   "reference": the peer every ratio is taken against}
Backward time = time(fwd_bwd) - time(fwd). A label whose call raises (e.g. a backend not built
or refusing the shape) is reported with its reason, not timed. Calls are timed as replays of a
CUDA graph of ten calls (kernel time alone, for every contender); slow calls (> 50 ms) with fewer
repetitions and without graph capture.

The sdpa backend against SDPA called directly, and the measurement behind the NVIDIA order of
sdpa and portable: --filter 'sdpa_backend|order' (attention_cases/sdpa_backend.py).

Only the GPT block (a TransformerLayer step): --filter gpt_block (or run
benchmarks/attention_cases/transformer_layer.py, which also records the bars in its JSON).
Kernel-level breakdown of the block: benchmarks/profile_modules.py --module TransformerLayer
--recipe bf16, and --module PlainBlock [--compile] for the torch peer.
"""
import importlib
import os
import pkgutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_cases  # noqa: E402
import common  # noqa: E402


def _time(fn, pick, reps):
    fn(*pick())  # first call: graph builds, autotuning
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*pick())
    end.record()
    end.synchronize()
    if start.elapsed_time(end) > 50.0:
        return common.time_ms(lambda: fn(*pick()), warmup=1, reps=3, graph=False)
    # kernel throughput: calls replayed from a CUDA graph, so no contender's host overhead (our
    # Python op, SDPA's dispatcher) lands in its kernel time (common.time_ms falls back to eager
    # calls, and says so, where capture fails)
    return common.time_ms(lambda: fn(*pick()), reps=reps, graph=True)


def measure(case, reps):
    pick = common.rotating(case["make"], count=2)
    shape = "x".join(map(str, case["shape"]))
    row = {"group": case["group"], "name": case["name"], "shape": shape}
    for label, (fwd, fwd_bwd) in case["fns"].items():
        try:
            t_fwd = _time(fwd, pick, reps)
            t_all = _time(fwd_bwd, pick, reps)
        except (NotImplementedError, RuntimeError, ValueError) as exc:
            row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            print(f"    {label}: not timed ({row[f'{label}_error']})", flush=True)
            continue
        t_bwd = max(t_all - t_fwd, 1e-6)
        row[f"{label}_fwd_ms"], row[f"{label}_bwd_ms"] = t_fwd, t_bwd
        if case.get("flops_fwd"):
            row[f"{label}_fwd_tflops"] = case["flops_fwd"] / (t_fwd * 1e-3) / 1e12
            row[f"{label}_bwd_tflops"] = case["flops_bwd"] / (t_bwd * 1e-3) / 1e12
        torch.cuda.empty_cache()
    ref = case["reference"]
    for label in case["ours"]:
        for part in ("fwd", "bwd"):
            if f"{label}_{part}_ms" in row and f"{ref}_{part}_ms" in row:
                row[f"{label}_{part}_vs_{ref}"] = row[f"{ref}_{part}_ms"] / row[f"{label}_{part}_ms"]
    return row


def main():
    args = common.parse_args(__doc__)
    reps = 5 if args.quick else 20
    rows = []
    for mod in pkgutil.iter_modules(attention_cases.__path__):
        module = importlib.import_module(f"attention_cases.{mod.name}")
        if hasattr(module, "run_gpt_block"):  # the TransformerLayer step (its own table)
            if common.selected("transformer_layer gpt_block", args.filter):
                print("  transformer_layer gpt_block", flush=True)
                rows.append({"group": "transformer_layer", **module.run_gpt_block(args.quick)})
            continue
        for case in module.CASES:
            label = f"{case['group']} {case['name']} {'x'.join(map(str, case['shape']))}"
            if not common.selected(label, args.filter):
                continue
            print(f"  {label}", flush=True)
            row = measure(case, reps)
            rows.append(row)
            parts = []
            for name in list(case["ours"]) + list(case["peers"]):
                if f"{name}_fwd_ms" in row:
                    tf = row.get(f"{name}_fwd_tflops")
                    tb = row.get(f"{name}_bwd_tflops")
                    parts.append(f"{name} " + (f"{tf:.0f}/{tb:.0f} TF/s" if tf else
                                               f"{row[f'{name}_fwd_ms']:.2f}/{row[f'{name}_bwd_ms']:.2f} ms"))
            ratios = [f"{k.replace('_vs_', ' vs ')} x{v:.2f}" for k, v in row.items() if "_vs_" in k]
            print("    " + ", ".join(parts) + ("\n    " + ", ".join(ratios) if ratios else ""),
                  flush=True)
        if hasattr(module, "run_wrapper_cost") and common.selected("sdpa_backend wrapper_cost", args.filter):
            print("  sdpa_backend wrapper_cost (eager, host work included)", flush=True)
            rows += [{"group": "sdpa_backend_eager", **row} for row in module.run_wrapper_cost(args.quick)]
    cols = ["group", "name", "shape"] + sorted({k for r in rows for k in r
                                                 if k.endswith("tflops") or "_vs_" in k})
    common.print_table(rows, cols)
    common.write_json(args.json, {**common.device_record(), "results": rows})


if __name__ == "__main__":
    main()
