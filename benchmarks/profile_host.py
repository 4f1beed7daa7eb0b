"""Where the host time of one te.Linear forward+backward goes (bench_modules.py measures the total;
this attributes it): cProfile over many steps at the host-bound shape, top functions by own time.

    python benchmarks/profile_host.py [--recipe bf16|delayed|current|torch] [--steps 500]
"""
import argparse
import cProfile
import pstats
import time

import torch

import transformer_engine.pytorch as te
from bench_modules import step_fn  # benchmarks/ is on sys.path when this script runs
from transformer_engine.common import recipe

TOKENS, FIN, FOUT = 64, 1024, 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--recipe", default="delayed", choices=["bf16", "delayed", "current", "torch"])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    dt = torch.bfloat16
    x = torch.randn(TOKENS, FIN, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(TOKENS, FOUT, device="cuda", dtype=dt)
    if args.recipe == "torch":
        mod = torch.nn.Linear(FIN, FOUT, device="cuda", dtype=dt)
    else:
        mod = te.Linear(FIN, FOUT, params_dtype=dt, device="cuda")
    r = {"bf16": None, "torch": None, "delayed": recipe.DelayedScaling(),
         "current": recipe.Float8CurrentScaling()}[args.recipe]
    step = step_fn(mod, x, dy, r)  # the step bench_modules.py times

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{args.recipe}: host {1e6 * (t1 - t0) / args.steps:.1f} us per step (no profiler)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
