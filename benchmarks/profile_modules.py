"""Kernel-time breakdown of one forward+backward step of a te module at the GPT shape (tokens
16384, hidden 4096, ffn 16384), from torch.profiler: where the step's GPU time goes, to compare
with the GEMMs' share. Not a benchmark of record (bench_modules.py is); a tool to find waste.

    python benchmarks/profile_modules.py [--module LayerNormMLP] [--recipe delayed|current|bf16]
    python benchmarks/profile_modules.py --module PlainBlock [--compile]   # the GPT block's peer
    python benchmarks/profile_modules.py --module TorchLinear [--compile]  # te.Linear's BF16 peer

PlainBlock is the plain-PyTorch GPT block bench_attention.py times te.TransformerLayer against
(eager, or torch.compile'd with --compile); its table sits beside TransformerLayer's kernel by
kernel.
"""
import argparse
import os
import sys

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

TOKENS, HIDDEN, FFN = 16384, 4096, 16384


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default="LayerNormMLP",
                    choices=["Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "PlainBlock",
                             "TorchLinear"])
    ap.add_argument("--recipe", default="delayed", choices=["bf16", "delayed", "current"])
    ap.add_argument("--compile", action="store_true", help="PlainBlock, TorchLinear: torch.compile it")
    ap.add_argument("--top", type=int, default=40, help="rows of the kernel table")
    ap.add_argument("--gaps", default=None, metavar="TRACE.json",
                    help="also profile two steps with host activity, write their chrome trace "
                         "there and list the largest device idle gaps with what the host was doing")
    args = ap.parse_args()
    if args.module in ("PlainBlock", "TorchLinear"):
        args.recipe = "bf16"
    dt = torch.bfloat16
    if args.module == "Linear":
        mod, out = te.Linear(HIDDEN, FFN, params_dtype=dt), FFN
    elif args.module == "LayerNormLinear":
        mod, out = te.LayerNormLinear(HIDDEN, FFN, params_dtype=dt), FFN
    elif args.module == "TorchLinear":  # te.Linear's BF16 peer in bench_modules.py
        mod, out = torch.nn.Linear(HIDDEN, FFN, device="cuda", dtype=dt), FFN
        if args.compile:
            mod = torch.compile(mod)
    elif args.module == "LayerNormMLP":
        mod, out = te.LayerNormMLP(HIDDEN, FFN, params_dtype=dt), HIDDEN
    else:  # the GPT block of bench_attention.py: seq 2048, batch 2, 32 heads, causal
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from attention_cases.transformer_layer import PlainBlock, te_block
        mod = te_block() if args.module == "TransformerLayer" else PlainBlock()
        if args.compile:
            mod = torch.compile(mod)
        out = HIDDEN
    r = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}[args.recipe]
    shape = (2048, 2) if args.module in ("TransformerLayer", "PlainBlock") else (TOKENS,)
    x = torch.randn(*shape, HIDDEN, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(*shape, out, device="cuda", dtype=dt)

    params = list(mod.parameters())

    def step():  # as the benchmarks step: fresh gradients (no accumulation kernels)
        for p in params:
            p.grad = None
        x.grad = None
        with te.autocast(enabled=r is not None, recipe=r):
            y = mod(x)
        y.backward(dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    # wall time of a step between events (what the benchmarks time): its excess over the kernel
    # time below is the device idling on the host
    walls, steady = [], []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        walls.append(start.elapsed_time(end))
    for _ in range(10):  # four steps back to back, as the benchmarks time them (the mean of four)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(4):
            step()
        end.record()
        end.synchronize()
        steady.append(start.elapsed_time(end) / 4)
    steps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name[:90]
            t, n = rows.get(name, (0.0, 0))
            rows[name] = (t + ev.device_time_total, n + 1)
    total = sum(t for t, _ in rows.values())
    label = f"{args.module}{' compiled' if args.compile else ''} {args.recipe}"
    print(f"{label}: GPU kernel time per step {total / steps / 1e3:.3f} ms, step between events "
          f"{sorted(walls)[len(walls) // 2]:.3f} ms (median of {len(walls)}), four back to back "
          f"{sorted(steady)[len(steady) // 2]:.3f} ms per step")
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{t / steps / 1e3:8.3f} ms  {n // steps:3d}x  {100 * t / total:5.1f}%  {name}")
    if args.gaps:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        # four steps back to back, as the benchmarks time them: a gap here is the device
        # waiting on the host in the steady state (a sync, or host work slower than the kernels)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(4):
                step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(args.gaps)
        print_gaps(args.gaps, steps=4)


def print_gaps(path, steps, top=25):
    """Device idle between consecutive kernels of the trace, the largest gaps with the kernel
    that ended them and the host ops open when that kernel was launched (profiler overhead
    inflates host time: read the gaps as where, not how much)."""
    import json
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                     key=lambda e: e["ts"])
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("cat") == "cuda_runtime" and "args" in e}
    ops = [e for e in events if e.get("cat") in ("cpu_op", "python_function", "user_annotation")]
    gaps = []
    for prev, cur in zip(kernels, kernels[1:]):
        gap = cur["ts"] - (prev["ts"] + prev.get("dur", 0))
        gaps.append((gap, prev, cur))
    # host calls that can stall the device queue (a sync empties it; an allocation may sync)
    stalls = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and any(w in e["name"] for w in
                                                   ("ynchronize", "Memcpy", "Malloc", "Free", "Query")):
            stalls[e["name"]] = stalls.get(e["name"], 0) + 1
    print("host runtime calls that may stall, per step: "
          + (", ".join(f"{k} {v / steps:g}" for k, v in sorted(stalls.items())) or "none"))
    busy = sum(k.get("dur", 0) for k in kernels)
    idle = sum(g for g, _, _ in gaps if g > 0)
    print(f"trace {path}: {len(kernels)} device events, busy {busy / steps / 1e3:.3f} ms/step, "
          f"idle between them {idle / steps / 1e3:.3f} ms/step; largest gaps:")
    for gap, prev, cur in sorted(gaps, key=lambda g: -g[0])[:top]:
        launch = launches.get(cur.get("args", {}).get("correlation"))
        stack = ""
        if launch is not None:
            t = launch["ts"]
            open_ops = sorted((o for o in ops if o["ts"] <= t <= o["ts"] + o.get("dur", 0)),
                              key=lambda o: o["ts"])
            stack = " > ".join(o["name"][:40] for o in open_ops[-5:])
            stack += f" (launched {t - (prev['ts'] + prev.get('dur', 0)):+.0f} us after the previous kernel ended)"
        print(f"  {gap:8.1f} us  before {cur['name'][:60]!r}\n      after {prev['name'][:60]!r}\n      host: {stack}")


if __name__ == "__main__":
    main()
