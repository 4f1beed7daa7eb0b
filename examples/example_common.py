"""What the four training examples share: the command line, the progress bar, the loss-curve
plot and the JSON summary of a BF16 run next to an FP8 run.

Each example trains the same model twice from the same initial weights and data order, once in
BF16 and once in FP8, and reports one final metric (accuracy in percent) for each.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable, Dict, Iterable, List

HERE = os.path.dirname(os.path.abspath(__file__))
# FP8 is expected to land within this many accuracy points of BF16 at full length.
FP8_TOLERANCE_POINTS = 1.0


def parse_args(description: str, full_steps: int, quick_steps: int, has_gpu: bool):
    """Command line of every example. Quick mode (a few steps) is chosen automatically when no
    GPU is visible to the example's framework, so that it finishes quickly on the reference
    backend; --full forces the full length anywhere."""
    p = argparse.ArgumentParser(description=description)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help=f"a few steps ({quick_steps}) as a smoke test (default without a GPU)")
    mode.add_argument("--full", action="store_true",
                      help=f"the full length ({full_steps} steps; default with a GPU)")
    p.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="folder for the loss-curve PNG and the JSON summary (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data and data order")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = p.parse_args()
    args.quick = args.quick or not (args.full or has_gpu)
    if args.steps is None:
        args.steps = quick_steps if args.quick else full_steps
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    return args


class _PlainProgress:
    """Stand-in for tqdm where it is not installed: a line every tenth of the run."""

    def __init__(self, steps: int, desc: str, disable: bool):
        self.steps, self.desc, self.disable, self.postfix = steps, desc, disable, {}

    def __iter__(self):
        every = max(1, self.steps // 10)
        for i in range(self.steps):
            yield i
            if not self.disable and ((i + 1) % every == 0 or i + 1 == self.steps):
                extra = " ".join(f"{k}={v}" for k, v in self.postfix.items())
                print(f"{self.desc}: {i + 1}/{self.steps} {extra}", flush=True)

    def set_postfix(self, refresh: bool = True, **values):
        self.postfix = values


def progress(steps: int, desc: str, disable: bool = False):
    """A tqdm progress bar over range(steps); its postfix shows the running loss."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainProgress(steps, desc, disable)
    return tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True, disable=disable)


def run_both(train: Callable[[str], Dict], precisions: Iterable[str] = ("bf16", "fp8")) -> Dict:
    """Call train(precision) for each precision and time it. train returns a dict with at least
    'losses' (one float per step) and 'metric' (a float)."""
    results = {}
    for precision in precisions:
        t0 = time.perf_counter()
        r = train(precision)
        r["seconds"] = round(time.perf_counter() - t0, 2)
        results[precision] = r
    return results


def smooth(values: List[float], window: int) -> List[float]:
    """Trailing moving average, so that curves of noisy mini-batch losses can be compared."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_curves(path: str, title: str, metric_name: str, results: Dict, args, device: str) -> bool:
    """The smoothed training loss of each run on one log-scale plot; False (and a note) when
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}")
        return False
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    window = max(1, min(50, args.steps // 20))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for precision, style in (("bf16", "-"), ("fp8", "--")):
        if precision in results:
            r = results[precision]
            ax.plot(range(1, len(r["losses"]) + 1), smooth(r["losses"], window), style,
                    label=f"{precision.upper()}: {metric_name} {r['metric']:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (moving average of {window})")
    ax.set_yscale("log")
    ax.set_title(f"{title} ({device}{', quick' if args.quick else ''})")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(name: str, title: str, metric_name: str, results: Dict, args, device: str) -> int:
    """Print the final metric of each run, write <name>.png and <name>.json (suffix _quick in
    quick mode) into args.out, and return the exit status: 1 when a full-length FP8 run lands
    more than FP8_TOLERANCE_POINTS below or above BF16."""
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, name + ("_quick" if args.quick else ""))
    plotted = plot_curves(stem + ".png", title, metric_name, results, args, device)
    gap = results["fp8"]["metric"] - results["bf16"]["metric"]
    summary = {
        "example": name, "device": device, "steps": args.steps, "quick": args.quick,
        "seed": args.seed, "metric": metric_name,
        "fp8_minus_bf16": round(gap, 3), "tolerance": FP8_TOLERANCE_POINTS,
        "runs": {p: {"metric": round(r["metric"], 3), "final_loss": round(r["losses"][-1], 5),
                     "seconds": r["seconds"]} for p, r in results.items()},
    }
    with open(stem + ".json", "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    for precision, r in results.items():
        print(f"{name} {precision.upper()}: final {metric_name} {r['metric']:.2f}, "
              f"final loss {r['losses'][-1]:.4f}, {r['seconds']:.1f} s")
    written = f"{stem}.png and {stem}.json" if plotted else f"{stem}.json"
    print(f"{name}: FP8 - BF16 = {gap:+.2f} {metric_name} points; wrote {written}")
    if args.quick:
        return 0
    if abs(gap) > FP8_TOLERANCE_POINTS:
        print(f"{name}: FP8 is more than {FP8_TOLERANCE_POINTS} points away from BF16")
        return 1
    return 0


def digits_split(seed: int, test_size: int = 544):
    """scikit-learn's bundled 8x8 digits (1797 images, offline), standardised, split into train
    and test sets. 544 test images: a multiple of 16, as FP8 GEMMs need."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32) / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed,
                                              stratify=y)
    mean, std = x_tr.mean(0), x_tr.std(0) + 1e-3
    return ((x_tr - mean) / std).astype(np.float32), y_tr, ((x_te - mean) / std).astype(np.float32), y_te
