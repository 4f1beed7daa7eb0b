"""Host time of the GPT block's TP=2 + SP step on ONE GPU, with NCCL's host path: where the split
eager step's time goes (bench_distributed.py measures it on two GPUs; this attributes it).

The default process group is torch's fake two-rank group, so the modules split as on two GPUs
(half the sequence, half the heads and features per rank). Every collective the step makes on
that group is handed to a real one-rank NCCL process group instead (a local copy on the device),
so each pays NCCL's own host path: work objects, events, stream waits. What is not represented:
the peer's timing (a rank never waits for another) and the transfers' time on the links.

Per contender, one GPU then the split step: the host time to issue one step (median of steps,
each after a synchronisation) and the time per step with the queue kept full (steps issued back
to back between two events: the larger of host and device time). A split step whose two
figures are close is host-bound. Then a cProfile of the split step of --profile (autograd on
this thread, where the profiler sees the backward); --sync-check lists the CUDA runtime calls of
one split step and warns at any synchronising op (torch.cuda.set_sync_debug_mode).

The layer, step and shape are bench_distributed.py's: hidden 4096, 32 heads, ffn 16384,
sequence 2048, batch 2.
NVTE_TP_OVERLAP is 0 unless set (eager calls run whole GEMMs under the default too; its copy
engines need a real peer).

    python benchmarks/profile_split_host.py [--names bf16,fp8,fp8_cs] [--profile fp8|none]
                                            [--steps 30] [--top 40] [--sync-check]
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
import traceback
import warnings

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import bench_distributed as bd  # benchmarks/ is on sys.path when this script runs: its layer and step
RECIPES = ("bf16", "fp8", "fp8_cs")
_SYNC_KEYS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cudaMemset", "cudaStreamWaitEvent", "cudaLaunch", "cuLaunch",
              "aten::item", "aten::_local_scalar_dense")


def _redirect_collectives(group, real):
    """torch.distributed's collectives on `group` (the fake one) run on `real` (a one-rank
    NCCL group) with this rank's share of the buffers; get_backend(group) answers "nccl", so
    the modules take NCCL's code paths."""
    group_ = group  # the wrappers' own `group` argument is the one a call names
    orig = {n: getattr(dist, n) for n in ("all_gather_into_tensor", "reduce_scatter_tensor",
                                          "all_reduce", "get_backend")}
    # torch 2.13's names of the first two, which the library calls where torch has them
    orig["all_gather_single"] = getattr(dist, "all_gather_single", orig["all_gather_into_tensor"])
    orig["reduce_scatter_single"] = getattr(dist, "reduce_scatter_single",
                                            orig["reduce_scatter_tensor"])

    def finish(work, async_op):
        if async_op:
            return work
        work.wait()
        return None

    def all_gather_into_tensor(out, inp, group=None, async_op=False):
        if group is not group_:
            return orig["all_gather_single"](out, inp, group=group, async_op=async_op)
        return finish(real._allgather_base(out.narrow(0, 0, inp.shape[0]), inp), async_op)

    def reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if group is not group_:
            return orig["reduce_scatter_single"](out, inp, op=op, group=group, async_op=async_op)
        return finish(real._reduce_scatter_base(out, inp.narrow(0, 0, out.shape[0])), async_op)

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if group is not group_:
            return orig["all_reduce"](tensor, op=op, group=group, async_op=async_op)
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        return finish(real.allreduce([tensor], opts), async_op)

    dist.all_gather_into_tensor = dist.all_gather_single = all_gather_into_tensor
    dist.reduce_scatter_tensor = dist.reduce_scatter_single = reduce_scatter_tensor
    dist.all_reduce = all_reduce
    dist.get_backend = lambda g=None: "nccl" if g is group_ else orig["get_backend"](g)


def _split_step(layer, x, dy, name, group, one_thread=False):
    """bench_distributed's step; one_thread: its backward on this thread, where cProfile sees it."""
    step = bd._step(layer, x, dy, bd._recipe(name), group)
    if not one_thread:
        return step

    def on_this_thread():
        with torch.autograd.set_multithreading_enabled(False):
            step()
    return on_this_thread


def _measure(step, steps):
    for _ in range(3):
        step()
    host = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return statistics.median(host), start.elapsed_time(end) / steps


def _sync_check(step, name):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    calls = {ev.key: ev.count for ev in prof.key_averages() if ev.key.startswith(_SYNC_KEYS)}
    print(f"  {name}: runtime calls in one step {calls}", flush=True)
    seen = set()

    def show(message, *rest, **kw):
        stack = "".join(traceback.format_stack(limit=14)[:-2])
        if "prototype" not in str(message) and stack not in seen:
            seen.add(stack)
            print(f"  {name}: synchronising op: {message}\n{stack}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    if not seen:
        print(f"  {name}: no synchronising op", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", default="bf16,fp8,fp8_cs")
    ap.add_argument("--profile", default="fp8", help="the split contender to cProfile, or none")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--sync-check", action="store_true")
    args = ap.parse_args()
    names = args.names.split(",")
    if any(n not in RECIPES for n in names):
        ap.error(f"--names: each of {', '.join(RECIPES)}")
    os.environ.setdefault("NVTE_TP_OVERLAP", "0")
    torch.cuda.set_device(0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    group = dist.new_group([0, 1])
    _redirect_collectives(group, dist.ProcessGroupNCCL(dist.HashStore(), 0, 1))
    for split in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(1)
        shape = (bd.SEQ // 2 if split else bd.SEQ, bd.BATCH, bd.HIDDEN)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        torch.manual_seed(0)
        layer = bd._layer(**(dict(set_parallel_mode=True, sequence_parallel=True, tp_group=group,
                                  tp_size=2) if split else {}))
        for name in names:
            host, full = _measure(_split_step(layer, x, dy, name, group), args.steps)
            tag = ("tp2_sp_" if split else "single_") + name
            print(f"{tag}: host {host:.3f} ms per step, queue kept full {full:.3f} ms", flush=True)
            if split and args.sync_check:
                _sync_check(_split_step(layer, x, dy, name, group), tag)
            if split and name == args.profile:
                step = _split_step(layer, x, dy, name, group, one_thread=True)
                step()
                torch.cuda.synchronize()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.steps):
                    step()
                prof.disable()
                torch.cuda.synchronize()
                for sort in ("tottime", "cumulative"):
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(args.top)
                    print(f"--- {tag}: cProfile by {sort} ({args.steps} steps) ---")
                    print("\n".join(line[:160] for line in buf.getvalue().splitlines()[6:]))
        del layer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
