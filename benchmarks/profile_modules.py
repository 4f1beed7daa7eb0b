"""Kernel-time breakdown of one forward+backward step of a te module at the GPT shape (tokens
16384, hidden 4096, ffn 16384), from torch.profiler: where the step's GPU time goes, to compare
with the GEMMs' share. Not a benchmark of record (bench_modules.py is); a tool to find waste.

    python benchmarks/profile_modules.py [--module LayerNormMLP] [--recipe delayed|current|bf16]
"""
import argparse

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

TOKENS, HIDDEN, FFN = 16384, 4096, 16384


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default="LayerNormMLP", choices=["Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer"])
    ap.add_argument("--recipe", default="delayed", choices=["bf16", "delayed", "current"])
    args = ap.parse_args()
    dt = torch.bfloat16
    if args.module == "Linear":
        mod, out = te.Linear(HIDDEN, FFN, params_dtype=dt), FFN
    elif args.module == "LayerNormLinear":
        mod, out = te.LayerNormLinear(HIDDEN, FFN, params_dtype=dt), FFN
    elif args.module == "LayerNormMLP":
        mod, out = te.LayerNormMLP(HIDDEN, FFN, params_dtype=dt), HIDDEN
    else:  # the GPT block of bench_attention.py: seq 2048, batch 2, 32 heads, causal
        mod = te.TransformerLayer(HIDDEN, FFN, 32, hidden_dropout=0.0, attention_dropout=0.0,
                                  self_attn_mask_type="causal", fuse_qkv_params=True, params_dtype=dt)
        out = HIDDEN
    r = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}[args.recipe]
    shape = (2048, 2) if args.module == "TransformerLayer" else (TOKENS,)
    x = torch.randn(*shape, HIDDEN, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(*shape, out, device="cuda", dtype=dt)

    def step():
        with te.autocast(enabled=r is not None, recipe=r):
            y = mod(x)
        y.backward(dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
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
    print(f"{args.module} {args.recipe}: GPU kernel time per step {total / steps / 1e3:.3f} ms")
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"{t / steps / 1e3:8.3f} ms  {n // steps:3d}x  {100 * t / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
