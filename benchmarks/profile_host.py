"""Where the host time of one te.Linear forward+backward goes (bench_modules.py measures the total;
this attributes it): cProfile over many steps at the host-bound shape, top functions by own time.

    python benchmarks/profile_host.py [--recipe bf16|delayed|current|torch|all] [--steps 500]
                                      [--sort tottime|cumulative]

--recipe all profiles every contender in one process (one start-up, one device call), after
timing their host time per step without the profiler in interleaved rounds (as bench_modules.py).
"""
import argparse
import cProfile
import pstats
import statistics

import torch

import transformer_engine.pytorch as te
from bench_modules import host_round_us, step_fn  # benchmarks/ is on sys.path when this script runs
from transformer_engine.common import recipe

TOKENS, FIN, FOUT = 64, 1024, 1024
RECIPES = ("torch", "bf16", "delayed", "current")


def make_step(name, x, dy):
    dt = torch.bfloat16
    if name == "torch":
        mod = torch.nn.Linear(FIN, FOUT, device="cuda", dtype=dt)
    else:
        mod = te.Linear(FIN, FOUT, params_dtype=dt, device="cuda")
    r = {"bf16": None, "torch": None, "delayed": recipe.DelayedScaling(),
         "current": recipe.Float8CurrentScaling()}[name]
    return step_fn(mod, x, dy, r)  # the step bench_modules.py times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--recipe", default="delayed", choices=list(RECIPES) + ["all"])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (no profiler)")
    args = ap.parse_args()
    x = torch.randn(TOKENS, FIN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(TOKENS, FOUT, device="cuda", dtype=torch.bfloat16)
    names = RECIPES if args.recipe == "all" else (args.recipe,)
    steps = {name: make_step(name, x, dy) for name in names}
    for step in steps.values():
        for _ in range(50):
            step()
    # contenders take turns (the host's speed drifts within a run); medians of the rounds
    rounds = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, step in steps.items():
            rounds[name].append(host_round_us(step, args.steps))
    base = statistics.median(rounds["torch"]) if "torch" in rounds else None
    for name in names:
        med = statistics.median(rounds[name])
        ratio = f"  ({med / base:.2f}x torch.nn)" if base else ""
        print(f"{name}: host {med:.1f} us per step (no profiler, median of {args.rounds} rounds: "
              f"{', '.join(f'{v:.0f}' for v in rounds[name])}){ratio}")
    for name, step in steps.items():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\n===== {name}: cProfile of {args.steps} steps, by {args.sort} =====")
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
