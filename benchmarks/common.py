"""Shared benchmark machinery: event timing (median of many runs, inputs rotated so repeated
runs do not measure the cache), the device's measured copy bandwidth, and JSON results."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import statistics

import torch


@contextlib.contextmanager
def env_vars(values: dict):
    """os.environ updated with `values` for the block, every variable restored (or removed) after
    it: the library reads its switches at call or trace time."""
    saved = {var: os.environ.get(var) for var in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for var, val in saved.items():
            if val is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = val


def parse_args(description: str, flags: dict | None = None) -> argparse.Namespace:
    """The common options, plus a store_true option for each {name: help} in flags."""
    ap = argparse.ArgumentParser(description=description)
    for name, text in (flags or {}).items():
        ap.add_argument(f"--{name}", action="store_true", help=text)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--filter", default=None,
                    help="regular expression: run only the cases whose label matches")
    return ap.parse_args()


def selected(label: str, pattern: str | None) -> bool:
    """Whether a case labelled `label` runs under --filter `pattern` (all of them without one)."""
    return pattern is None or re.search(pattern, label) is not None


def time_ms(fn, warmup: int = 5, reps: int = 30, graph: bool = True, calls: int = 10) -> float:
    """Median milliseconds of one fn() on the device.

    With graph=True (default) `calls` consecutive fn() calls are captured in a CUDA graph and
    replayed between two events, so the time is the kernels' alone: host overhead (Python,
    argument checks, launch latency) is left out, for us and for the peers alike. Functions that
    cannot be captured fall back to timing single eager calls.
    """
    run, per_replay, _ = _replayable(fn, warmup, graph, calls)
    return _median_ms(run, per_replay, reps)


def time_interleaved_ms(fns: dict, rounds: int = 5, warmup: int = 5, reps: int = 20,
                        calls: int = 10, graph: bool = True, eager_calls: int = 1,
                        per_round: bool = False) -> dict:
    """{name: median milliseconds of one fn()} for several contenders timed in alternation.

    Every contender is prepared as in time_ms (a CUDA graph of `calls` calls, or eager calls if
    it cannot be captured or graph=False); then `rounds` rounds each time every contender once (the median of
    `reps` replays), the order reversed every other round, and a contender's result is the
    median of its round medians. Clock or thermal drift over the run then affects all
    contenders alike instead of whichever happened to run last; the protocol is the same for
    every contender.

    eager_calls > 1: an eager contender runs that many fn() back to back between the events
    (no synchronisation between them, as in a training loop) and its time is their mean. A
    single synchronised call also times the host's work before its first kernel, while the
    device idles; back-to-back calls measure the steady state, where that latency overlaps the
    previous call's kernels (as long as the host keeps ahead of the device).

    per_round=True returns {name: [round medians]} instead (for ratios paired by round)."""
    runners = {name: _replayable(fn, warmup, graph, calls, eager_calls) for name, fn in fns.items()}
    rounds_ms = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            run, per_replay, graphed = runners[name]
            if not graphed:
                # eager contenders share the caching allocator: one untimed call re-populates this
                # contender's blocks after the others ran, so no timed call pays for cudaMalloc
                run()
            rounds_ms[name].append(_median_ms(run, per_replay, reps))
    if per_round:
        return rounds_ms
    return {name: statistics.median(ms) for name, ms in rounds_ms.items()}


def paired_ratio(fn_a, fn_b, rounds: int, reps: int, eager_calls: int = 1) -> dict:
    """How many times faster fn_a is than fn_b, for two contenders whose difference is within
    the few percent by which the GPU's clocks drift (power, temperature): the two alone, timed
    eagerly in alternation (A B, B A, ...), the ratio taken within each round. Returns the
    median ratio, its quartiles and the number of rounds."""
    ms = time_interleaved_ms({"a": fn_a, "b": fn_b}, rounds=rounds, warmup=1, reps=reps,
                             graph=False, eager_calls=eager_calls, per_round=True)
    ratios = sorted(b / a for a, b in zip(ms["a"], ms["b"]))
    q = len(ratios) // 4
    return {"median": statistics.median(ratios), "quartiles": [ratios[q], ratios[-1 - q]],
            "rounds": len(ratios)}


def _replayable(fn, warmup: int, graph: bool, calls: int, eager_calls: int = 1):
    """(run, calls per run, graphed): a replay of a CUDA graph of `calls` fn() calls, or
    `eager_calls` eager fn() calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if not graph:
        return _eager(fn, eager_calls)
    try:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(g):
                for _ in range(calls):
                    fn()
        torch.cuda.current_stream().wait_stream(stream)
        g.replay()
        torch.cuda.synchronize()
        return g.replay, calls, True
    except Exception as exc:  # not capturable: say so and time eagerly
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc)[:80]}; timing eager calls)")
        torch.cuda.synchronize()
        return _eager(fn, eager_calls)


def _eager(fn, count: int):
    if count == 1:
        return fn, 1, False

    def run():
        for _ in range(count):
            fn()
    return run, count, False


def _median_ms(run, per_replay: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_replay)
    return statistics.median(times)


def rotating(make, count: int = 3):
    """count independent input sets (make(i) -> args) and a picker cycling through them, so
    consecutive timed runs do not find their inputs in L2."""
    sets = [make(i) for i in range(count)]
    state = {"i": 0}

    def next_args():
        state["i"] = (state["i"] + 1) % count
        return sets[state["i"]]
    return next_args


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    Timed eagerly: captured in a graph, a large copy_ becomes a memcpy node that the DMA copy
    engine runs (about 20% slower on an H100 than the SM copy eager mode uses), which would
    flatter every ratio against it. At 2 GiB the launch overhead is negligible."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    # Best of three medians after a longer warm-up: one H100 run measured 2794 GB/s at its
    # start against 2990-3020 in every other run, which inflated that run's % of copy by 7%.
    ms = min(time_ms(lambda: dst.copy_(src), warmup=10, reps=20, graph=False) for _ in range(3))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def device_record() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "sms": props.multi_processor_count}


def write_json(path: str | None, payload: dict) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=1)


def print_table(rows: list, columns: list) -> None:
    if not rows:  # e.g. every case of this table filtered out
        return
    widths = [max([len(str(c))] + [len(_fmt(r.get(c))) for r in rows]) for c in columns]
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)
