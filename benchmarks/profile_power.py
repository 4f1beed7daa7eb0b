"""Clocks and power while the GPT block steps back to back: te.TransformerLayer BF16 against the
compiled plain-PyTorch block (attention_cases/transformer_layer.py), each run for `--steps`
steps in turn while a thread samples NVML (SM clock, board power, throttle reasons) every 5 ms.
A diagnostic, not a benchmark of record: it shows whether the step runs at the board's power
limit, where a step's time follows its energy (passes over memory removed) more than its
kernels' durations at boost clock (README, GPT block).

    python benchmarks/profile_power.py [--steps 120] [--repeats 2]

Needs nvidia-ml-py (pynvml). Throttle reasons are NVML's bit mask (4: software power cap).
"""
import argparse
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_cases.transformer_layer import (BATCH, DTYPE, HIDDEN, SEQ, PlainBlock,  # noqa: E402
                                               _step_fn, te_block)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    print(f"{torch.cuda.get_device_name()}: enforced power limit "
          f"{pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000:.0f} W")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(SEQ, BATCH, HIDDEN, device="cuda", dtype=DTYPE, generator=g).requires_grad_()
    grad = torch.randn(SEQ, BATCH, HIDDEN, device="cuda", dtype=DTYPE, generator=g)
    steps = {"te_bf16": _step_fn(te_block(), x, grad),
             "torch_compile": _step_fn(torch.compile(PlainBlock()), x, grad)}
    for _ in range(3):
        for fn in steps.values():
            fn()
    torch.cuda.synchronize()

    def sample(stop, out):
        while not stop.is_set():
            out.append((pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
            time.sleep(0.005)

    for _ in range(args.repeats):
        for name, fn in steps.items():
            samples, stop = [], threading.Event()
            thread = threading.Thread(target=sample, args=(stop, samples))
            thread.start()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.steps):
                fn()
            end.record()
            end.synchronize()
            stop.set()
            thread.join()
            steady = samples[len(samples) // 4:]  # past the clock ramp of the run's start
            reasons = {}
            for _, _, r in steady:
                reasons[r] = reasons.get(r, 0) + 1
            print(f"  {name:<14} {start.elapsed_time(end) / args.steps:.3f} ms/step, SM clock "
                  f"{statistics.mean(c for c, _, _ in steady):.0f} MHz, power "
                  f"{statistics.mean(p for _, p, _ in steady):.0f} W, throttle reasons "
                  f"{dict(sorted(reasons.items()))} (samples)", flush=True)


if __name__ == "__main__":
    main()
