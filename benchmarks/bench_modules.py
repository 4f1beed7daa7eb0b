"""Module benchmark: te.Linear, te.LayerNormLinear, te.LayerNormMLP against their
torch.nn equivalents, in the same run, on the same weights and inputs.

1. Step time: forward + backward at GPT shapes (tokens 16384, hidden 4096, ffn 16384) of
     te BF16, te FP8 DelayedScaling, te FP8 Float8CurrentScaling   vs
     torch.nn BF16 eager and torch.compile'd (inductor)
   torch.nn equivalents: Linear; LayerNorm + Linear; LayerNorm + Linear + tanh-GELU + Linear.
   Timed eagerly (graph=False: autograd's backward and the FP8 recipe state are not captured
   into graphs here) with events around STEP_CALLS steps issued back to back, as a training loop
   issues them: the mean step of that steady state. (Around one synchronised step the events
   would also time the host's work before the step's first kernel, while the GPU idles: on the
   slow, shared hosts that is 0.1-1 ms per step, for every contender.) The
   contenders take turns over STEP_ROUNDS rounds, each keeping its median round. te BF16 and
   torch.compile are then timed once more, the two alone in alternation, and their ratio is taken
   within each round (paired_te_bf16_vs_compile: see paired_bf16_vs_compile).
   Parameter grads are dropped (set to None) before each step for every contender alike.
   Bars: LayerNormMLP FP8 >= 1.75x torch.nn BF16 eager, Linear FP8 >= 1.6x, te BF16 no slower
   than torch.compile of torch.nn.

2. Host time of one te.Linear forward + backward at 64 x 1024 x 1024 against torch.nn.Linear, BF16
   and FP8 (current and delayed scaling): N steps are issued back to back with no synchronisation
   and the wall time of the Python loop is divided by N. At this shape the kernels of a step take
   less time than issuing them, so the loop measures the host. Shared hosts vary: other
   work slows single rounds by up to 3x, so a round times its N steps in chunks of HOST_CHUNK and
   keeps the best chunk (the time of the code itself; interference only adds), the contenders
   take turns (order reversed every other round), and te's ratio to torch.nn is taken within
   each round, its median over HOST_ROUNDS rounds reported (te_over_torch). The median of the
   whole-round times (the earlier method) is kept beside it (te_over_torch_round_medians). Shown
   too: the GPU's own time per step (steps queued behind a busy-wait kernel, so they run without
   host gaps: see gpu_time_us); host_us > gpu_us confirms that the host was the bottleneck.
   Bar: te <= 1.5x torch.nn.Linear.

3. Memory: parameter bytes and peak allocated memory of a LayerNormMLP forward + backward step
   (FP8 current scaling) with high-precision BF16 weights and with fp8_model_init (FP8-only weights).

4. Graphed step: the host time of one te.Linear forward + backward at the host-time shape (2.)
   captured with te.make_graphed_callables (BF16 and FP8 DelayedScaling, whose scaling update
   replays inside the graphs) against an eager torch.nn.Linear step, measured as in 2. (best
   chunks, contenders taking turns, ratio per round); the eager te.Linear step is shown beside.

Prints one line per measurement, then a short table last. --json writes every number. --filter
runs the sections whose label matches: "steps:Linear", "steps:LayerNormLinear", "steps:LayerNormMLP",
"host", "memory", "graphed" (e.g. --filter host: the host-time section alone).
"""
import copy
import gc
import os
import statistics
import sys
import time

import torch
import torch._dynamo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

TOKENS, HIDDEN, FFN = 16384, 4096, 16384
HOST_SHAPE = (64, 1024, 1024)  # tokens, in, out
DTYPE = torch.bfloat16
DEVICE = "cuda"
STEP_ROUNDS = 5
STEP_CALLS = 4  # steps between the timing events (see 1. above)
BARS = {"LayerNormMLP_fp8": 1.75, "Linear_fp8": 1.6, "bf16_vs_compile": 1.0, "host": 1.5}


def recipes():
    return {"bf16": None, "fp8_delayed": recipe.DelayedScaling(), "fp8_current": recipe.Float8CurrentScaling()}


# ----- modules and their torch.nn equivalents ---------------------------------------------------

def make_te(name, hidden, ffn):
    if name == "Linear":
        return te.Linear(hidden, ffn, params_dtype=DTYPE, device=DEVICE)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(hidden, ffn, params_dtype=DTYPE, device=DEVICE)
    return te.LayerNormMLP(hidden, ffn, activation="gelu", params_dtype=DTYPE, device=DEVICE)


class TorchLayerNormMLP(torch.nn.Module):
    def __init__(self, hidden, ffn, **kw):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden, eps=1e-5, **kw)
        self.fc1 = torch.nn.Linear(hidden, ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)), approximate="tanh"))


def make_torch_like(name, te_module, hidden, ffn):
    """torch.nn equivalent holding a copy of the te module's weights."""
    kw = dict(device=DEVICE, dtype=DTYPE)
    if name == "Linear":
        m = torch.nn.Linear(hidden, ffn, **kw)
        pairs = {"weight": "weight", "bias": "bias"}
    elif name == "LayerNormLinear":
        m = torch.nn.Sequential(torch.nn.LayerNorm(hidden, eps=1e-5, **kw), torch.nn.Linear(hidden, ffn, **kw))
        pairs = {"0.weight": "layer_norm_weight", "0.bias": "layer_norm_bias", "1.weight": "weight", "1.bias": "bias"}
    else:
        m = TorchLayerNormMLP(hidden, ffn, **kw)
        pairs = {"norm.weight": "layer_norm_weight", "norm.bias": "layer_norm_bias", "fc1.weight": "fc1_weight",
                 "fc1.bias": "fc1_bias", "fc2.weight": "fc2_weight", "fc2.bias": "fc2_bias"}
    src = dict(te_module.named_parameters())
    with torch.no_grad():
        for mine, theirs in pairs.items():
            m.get_parameter(mine).copy_(src[theirs])
    return m


def step_fn(module, x, dy, fp8_recipe):
    params = [p for p in module.parameters()]

    def step():
        for p in params:
            p.grad = None
        if fp8_recipe is None:
            out = module(x)
        else:
            with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
                out = module(x)
        out.backward(dy)
        return out
    return step


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ----- 1. step time ------------------------------------------------------------------------------

def bench_steps(name, reps, with_compile):
    out_features = FFN if name != "LayerNormMLP" else HIDDEN
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device=DEVICE, dtype=DTYPE, generator=g).requires_grad_()
    dy = torch.randn(TOKENS, out_features, device=DEVICE, dtype=DTYPE, generator=g)
    te_mod = make_te(name, HIDDEN, FFN)
    nn_mod = make_torch_like(name, te_mod, HIDDEN, FFN)
    row = {"module": name, "shape": f"{TOKENS}x{HIDDEN}x{FFN}"}

    with torch.no_grad():
        row["bf16_rel_err_vs_torch"] = rel_err(te_mod(x), nn_mod(x))
    # one te module per recipe (same weights), so that taking turns never switches recipe state
    steps = {f"te_{rname}": step_fn(te_mod if r is None else copy.deepcopy(te_mod), x, dy, r)
             for rname, r in recipes().items()}
    steps["torch_eager"] = step_fn(nn_mod, x, dy, None)
    if with_compile:
        t0 = time.perf_counter()
        steps["torch_compile"] = step_fn(torch.compile(nn_mod), x, dy, None)
        for _ in range(3):
            steps["torch_compile"]()
        torch.cuda.synchronize()
        row["compile_s"] = time.perf_counter() - t0
    # contenders take turns over STEP_ROUNDS rounds and keep their median round: clocks and
    # temperature drift over a run by a few percent, and every contender then sees the same drift
    times = common.time_interleaved_ms(steps, rounds=STEP_ROUNDS, warmup=3,
                                       reps=max(3, reps // STEP_ROUNDS), graph=False,
                                       eager_calls=STEP_CALLS)
    row.update({f"{k}_ms": v for k, v in times.items()})
    for k, v in times.items():
        if k != "torch_eager":
            row[f"{k}_speedup_vs_eager"] = times["torch_eager"] / v
    if "torch_compile" in times:
        row["te_bf16_speedup_vs_compile"] = times["torch_compile"] / times["te_bf16"]
        row.update(paired_bf16_vs_compile(steps["te_bf16"], steps["torch_compile"], reps))
    print(f"{name:>16}: " + "  ".join(f"{k} {v:.3f} ms" for k, v in times.items())
          + f"  (te bf16 vs torch rel err {row['bf16_rel_err_vs_torch']:.2e})", flush=True)
    del te_mod, nn_mod, x, dy
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


# The BF16-vs-compile bar compares two contenders that run the same cuBLAS GEMMs, so their
# difference is within the few percent by which the GPU's clocks drift over the five-contender
# rounds above (and a contender's neighbours in the round order change its clocks): a second
# measurement alternates the two alone (common.paired_ratio) for PAIR_ROUNDS rounds.
PAIR_ROUNDS = 12


def paired_bf16_vs_compile(te_step, compile_step, reps):
    p = common.paired_ratio(te_step, compile_step, PAIR_ROUNDS, max(3, reps // STEP_ROUNDS), STEP_CALLS)
    q1, q3 = p["quartiles"]
    print(f"{'':>16}  te bf16 vs compile, {p['rounds']} paired rounds: median {p['median']:.4f}"
          f" (quartiles {q1:.4f}-{q3:.4f})", flush=True)
    return {"paired_te_bf16_vs_compile": p["median"], "paired_ratio_iqr": p["quartiles"],
            "paired_rounds": p["rounds"]}


# ----- 2. host time ------------------------------------------------------------------------------

# 15 rounds: on shared hosts single rounds of one contender vary up to 3x (243 to 795 us
# within one run), and the median of 7 moved by a third between two runs of one tree
HOST_ROUNDS = 15


def gpu_time_us(step, iters=20, sleep_cycles=400_000_000):
    """The GPU's own time per step: a busy-wait kernel holds the stream while the host queues
    `iters` steps behind it; the start event, queued after the busy-wait, fires when the steps
    begin, so the events span the steps alone, run back to back with no host gaps. 4e8 cycles
    (~0.2 s) outlast queueing 20 steps, and 20 steps stay well inside the device's queue of
    pending launches (a full queue would block the host and let gaps back in)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


HOST_CHUNK = 20


def host_round_us(step, iters):
    """(best chunk, whole round): wall time per step of the Python loop issuing `iters` steps back
    to back, in chunks of HOST_CHUNK steps (see 2. above)."""
    chunks = max(1, iters // HOST_CHUNK)
    torch.cuda.synchronize()
    best, total = float("inf"), 0.0
    for _ in range(chunks):
        t0 = time.perf_counter()
        for _ in range(HOST_CHUNK):
            step()
        dt = time.perf_counter() - t0
        best, total = min(best, dt), total + dt
    torch.cuda.synchronize()
    return 1e6 * best / HOST_CHUNK, 1e6 * total / (chunks * HOST_CHUNK)


def bench_host(iters):
    """Contenders take turns, HOST_ROUNDS rounds of `iters` steps each, and each keeps its median
    round: the host's speed drifts (shared machine, clocks) by tens of percent within a run, and
    interleaving makes every contender see the same drift."""
    tokens, fin, fout = HOST_SHAPE
    x = torch.randn(tokens, fin, device=DEVICE, dtype=DTYPE).requires_grad_()
    dy = torch.randn(tokens, fout, device=DEVICE, dtype=DTYPE)
    te_lin = te.Linear(fin, fout, params_dtype=DTYPE, device=DEVICE)
    nn_lin = make_torch_like("Linear", te_lin, fin, fout)
    steps = {"torch": step_fn(nn_lin, x, dy, None)}
    # one module per recipe, so that taking turns never switches a module's recipe state
    steps.update({name: step_fn(te_lin if r is None else te.Linear(fin, fout, params_dtype=DTYPE,
                                                                    device=DEVICE), x, dy, r)
                  for name, r in recipes().items()})
    for step in steps.values():
        for _ in range(20):
            step()
    best = {name: [] for name in steps}
    rounds = {name: [] for name in steps}
    names = list(steps)
    for r in range(HOST_ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            b, whole = host_round_us(steps[name], iters)
            best[name].append(b)
            rounds[name].append(whole)
    host = {name: statistics.median(v) for name, v in best.items()}
    paired = {name: statistics.median(t / u for t, u in zip(best[name], best["torch"])) for name in steps}
    medians = {name: statistics.median(v) for name, v in rounds.items()}
    gpu = {}
    for name, step in steps.items():
        try:
            gpu[name] = gpu_time_us(step)
        except (RuntimeError, AttributeError) as exc:  # the host number stands without it
            print(f"  (GPU time per step not measured: {type(exc).__name__}: {str(exc)[:80]})")
            gpu[name] = float("nan")
    rows = []
    for rname in recipes():
        row = {"module": "Linear", "shape": "x".join(map(str, HOST_SHAPE)), "mode": rname,
               "te_host_us": host[rname], "torch_host_us": host["torch"],
               "te_over_torch": paired[rname],
               "te_over_torch_round_medians": medians[rname] / medians["torch"],
               "te_gpu_us": gpu[rname], "torch_gpu_us": gpu["torch"],
               "best_chunks_te_us": best[rname], "best_chunks_torch_us": best["torch"],
               "rounds_te_us": rounds[rname], "rounds_torch_us": rounds["torch"]}
        row["meets_bar"] = "yes" if row["te_over_torch"] <= BARS["host"] else "NO"
        print(f"host time {rname:>12}: te {host[rname]:.1f} us  torch.nn {host['torch']:.1f} us  "
              f"ratio {row['te_over_torch']:.2f}  (best chunks, paired over {HOST_ROUNDS} rounds; "
              f"whole-round medians: {row['te_over_torch_round_medians']:.2f}; gpu per step: te "
              f"{gpu[rname]:.1f} us, torch {gpu['torch']:.1f} us)", flush=True)
        rows.append(row)
    return rows


# ----- 4. graphed step ---------------------------------------------------------------------------

def bench_graphed(iters):
    tokens, fin, fout = HOST_SHAPE
    x = torch.randn(tokens, fin, device=DEVICE, dtype=DTYPE).requires_grad_()
    dy = torch.randn(tokens, fout, device=DEVICE, dtype=DTYPE)
    nn_lin = torch.nn.Linear(fin, fout, device=DEVICE, dtype=DTYPE)
    steps = {"torch_eager": step_fn(nn_lin, x, dy, None)}
    for name, r in (("bf16", None), ("fp8_delayed", recipe.DelayedScaling())):
        eager = te.Linear(fin, fout, params_dtype=DTYPE, device=DEVICE)
        graphed = te.make_graphed_callables(copy.deepcopy(eager), (x,), enabled=r is not None,
                                            recipe=r)
        steps[f"te_eager_{name}"] = step_fn(eager, x, dy, r)
        steps[f"te_graphed_{name}"] = step_fn(graphed, x, dy, None)  # the autocast is captured
    for step in steps.values():
        for _ in range(20):
            step()
    best = {name: [] for name in steps}
    names = list(steps)
    for r in range(HOST_ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            best[name].append(host_round_us(steps[name], iters)[0])
    rows = []
    for name in ("bf16", "fp8_delayed"):
        g, e = f"te_graphed_{name}", f"te_eager_{name}"
        row = {"module": "Linear", "shape": "x".join(map(str, HOST_SHAPE)), "mode": name,
               "te_graphed_host_us": statistics.median(best[g]),
               "te_eager_host_us": statistics.median(best[e]),
               "torch_eager_host_us": statistics.median(best["torch_eager"]),
               "graphed_over_torch_eager": statistics.median(
                   a / b for a, b in zip(best[g], best["torch_eager"])),
               "graphed_over_te_eager": statistics.median(a / b for a, b in zip(best[g], best[e]))}
        print(f"graphed step {name:>12}: te graphed {row['te_graphed_host_us']:.1f} us  te eager "
              f"{row['te_eager_host_us']:.1f} us  torch.nn eager {row['torch_eager_host_us']:.1f} us  "
              f"graphed/torch {row['graphed_over_torch_eager']:.2f}", flush=True)
        rows.append(row)
    return rows


# ----- 3. memory ---------------------------------------------------------------------------------

def bench_memory():
    rows = []
    r = recipe.Float8CurrentScaling()
    for label, fp8_init in (("bf16 weights", False), ("fp8_model_init", True)):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with te.fp8_model_init(enabled=fp8_init, recipe=r):
            m = te.LayerNormMLP(HIDDEN, FFN, params_dtype=DTYPE, device=DEVICE)
        params_bytes = torch.cuda.memory_allocated() - before
        x = torch.randn(TOKENS, HIDDEN, device=DEVICE, dtype=DTYPE).requires_grad_()
        dy = torch.randn(TOKENS, HIDDEN, device=DEVICE, dtype=DTYPE)
        torch.cuda.reset_peak_memory_stats()
        step_fn(m, x, dy, r)()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        rows.append({"module": "LayerNormMLP", "weights": label, "param_mib": params_bytes / 2**20,
                     "step_peak_mib": peak / 2**20})
        print(f"memory {label:>15}: parameters {params_bytes / 2**20:.1f} MiB, fwd+bwd peak {peak / 2**20:.1f} MiB",
              flush=True)
        del m, x, dy
    if rows[0]["param_mib"] > 0:
        rows[1]["param_ratio"] = rows[1]["param_mib"] / rows[0]["param_mib"]
    return rows


def main():
    args = common.parse_args(__doc__)
    reps = 10 if args.quick else 25
    # --filter selects sections by label: "steps:<Module>", "host", "memory"
    step_rows = [bench_steps(name, reps, with_compile=True) for name in ("Linear", "LayerNormLinear", "LayerNormMLP")
                 if common.selected(f"steps:{name}", args.filter)]
    host_rows = bench_host(100 if args.quick else 300) if common.selected("host", args.filter) else []
    mem_rows = bench_memory() if common.selected("memory", args.filter) else []
    graph_rows = bench_graphed(100 if args.quick else 300) if common.selected("graphed", args.filter) else []

    checks = []
    by_name = {r["module"]: r for r in step_rows}
    for module, bar in (("LayerNormMLP", BARS["LayerNormMLP_fp8"]), ("Linear", BARS["Linear_fp8"])):
        if module not in by_name:
            continue
        for scaling in ("current", "delayed"):
            checks.append((f"{module} fp8 ({scaling}) vs torch eager",
                           by_name[module][f"te_fp8_{scaling}_speedup_vs_eager"], bar))
    for r in step_rows:
        if "te_bf16_speedup_vs_compile" in r:
            checks.append((f"{r['module']} te bf16 vs torch.compile", r["te_bf16_speedup_vs_compile"],
                           BARS["bf16_vs_compile"]))
            checks.append((f"{r['module']} te bf16 vs torch.compile (paired rounds)",
                           r["paired_te_bf16_vs_compile"], BARS["bf16_vs_compile"]))
    for r in host_rows:
        checks.append((f"host te.Linear {r['mode']} / torch.nn.Linear (<=)", r["te_over_torch"], BARS["host"]))

    tables = ((step_rows, ["module", "te_bf16_ms", "te_fp8_delayed_ms", "te_fp8_current_ms", "torch_eager_ms",
                           "torch_compile_ms", "te_fp8_current_speedup_vs_eager", "te_bf16_speedup_vs_compile"]),
              (host_rows, ["mode", "te_host_us", "torch_host_us", "te_over_torch", "te_gpu_us", "torch_gpu_us",
                           "meets_bar"]),
              (mem_rows, ["weights", "param_mib", "step_peak_mib"]),
              (graph_rows, ["mode", "te_graphed_host_us", "te_eager_host_us", "torch_eager_host_us",
                            "graphed_over_torch_eager"]))
    for rows, columns in tables:
        if rows:  # a section left out by --filter has none
            print()
            common.print_table(rows, columns)
    print()
    for what, value, bar in checks:
        ok = value <= bar if "(<=)" in what else value >= bar
        print(f"{'MEETS' if ok else 'MISSES':>6}  {what}: {value:.2f} (bar {bar})")
    common.write_json(args.json, {**common.device_record(), "bars": BARS, "steps": step_rows, "host": host_rows,
                                  "memory": mem_rows, "graphed": graph_rows,
                                  "checks": [{"what": w, "value": v, "bar": b} for w, v, b in checks]})


if __name__ == "__main__":
    main()
