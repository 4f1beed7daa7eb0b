"""The Python share of a te.Linear step's host time, on any machine (no GPU needed).

The native calls of the direct path are replaced by no-ops and CPU tensors stand in for device
ones, so what is timed is the Python around those calls (module, autograd.Function, recipe
bookkeeping, allocations' Python side), next to two references: a tiny torch.nn.Linear step and
a bare autograd.Function that makes the same allocations ("floor"). Not a measurement of the GPU
path (no launches, CPU allocator): use it to compare host-time changes (A/B), then confirm with
bench_modules.py --filter host on the GPU.

  python benchmarks/profile_host_python.py [--rounds N] [--profile]
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import quantization as q
from transformer_engine.pytorch.kernels import eager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modules import step_fn  # noqa: E402  (the same step as the GPU host benchmark)

T, FIN, FOUT = 64, 1024, 1024
DT = torch.bfloat16


class _NoOpPlan:
    """Stands in for the native LinearFp8Plan: its sizes, no regions, no-op calls."""

    def __init__(self, tokens, in_features, out_features, dtype, w_dtype, wq_dtype, fp8_fwd,
                 fp8_bwd, fresh_w, need_dgrad, need_wgrad, dbias_dtype, *scaling):
        self.tokens, self.in_features, self.out_features = tokens, in_features, out_features
        self.fresh_w, self.need_dgrad, self.need_wgrad = fresh_w, need_dgrad, need_wgrad
        self.dbias_in_cast = dbias_dtype >= 0
        self.kept_bytes = 512 + tokens * in_features + out_features * in_features
        self.forward_scratch_bytes = tokens * in_features + out_features * in_features
        self.backward_scratch_bytes = 2 * tokens * out_features + 512
        self.regions = {}

    def forward(self, *args):
        pass

    def backward(self, *args):
        pass


class _NoOpModule:
    """Stands in for the native module: every call returns nothing (workspace queries: 16)."""
    LinearFp8Plan = _NoOpPlan

    def __getattr__(self, name):
        if name.endswith("_workspace"):
            return lambda *a: (16,)
        return lambda *a, **k: None


class _NoOpCall:
    __slots__ = ("mod", "stream", "ws", "ws_ptr", "ws_size", "device", "env")

    def __init__(self):
        self.mod, self.stream, self.ws = _NoOpModule(), 0, None
        self.ws_ptr, self.ws_size, self.device = 256, 1 << 20, torch.device("cpu")
        self.env = (self.ws_ptr, self.ws_size, self.stream)


def _patch_native():
    call = _NoOpCall()
    eager.native_call = lambda x: call
    eager.native_call_again = lambda nc, x: nc if nc is not None else call
    q.RecipeState.on_native = lambda self: True
    q.require_fp8_support = lambda *a: None


class _Floor(torch.autograd.Function):
    """Three allocations, one no-op call per direction, saved tensors: the least a Python
    autograd.Function path can do."""

    @staticmethod
    def forward(ctx, a, w, b, call):
        kept = torch.empty(1 << 16, dtype=torch.uint8)
        y = torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype)
        call(a.data_ptr(), w.data_ptr(), b.data_ptr(), kept.data_ptr(), y.data_ptr())
        ctx.save_for_backward(kept)
        ctx.call = call
        return y

    @staticmethod
    def backward(ctx, gy):
        kept, = ctx.saved_tensors
        n, k = gy.shape[1], kept.numel()
        # one buffer for the three gradients, as te's step (kernels/eager.step_grads)
        nx = gy.shape[0] * FIN
        buf = torch.empty(nx + n * FIN + n, dtype=gy.dtype)
        dx = buf.as_strided((gy.shape[0], FIN), (FIN, 1), 0)
        dw = buf.as_strided((n, FIN), (FIN, 1), nx)
        db = buf.as_strided((n,), (1,), nx + n * FIN)
        ctx.call(gy.data_ptr(), kept.data_ptr(), dx.data_ptr(), dw.data_ptr(), db.data_ptr(), k)
        return dx, dw, db, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--profile", action="store_true", help="cProfile the delayed-scaling step")
    args = ap.parse_args()
    _patch_native()
    x = torch.randn(T, FIN, dtype=DT, requires_grad=True)
    dy = torch.randn(T, FOUT, dtype=DT)
    recipes = {"bf16": None, "fp8 delayed": recipe.DelayedScaling(),
               "fp8 current": recipe.Float8CurrentScaling()}
    steps = {n: step_fn(te.Linear(FIN, FOUT, params_dtype=DT), x, dy, r) for n, r in recipes.items()}
    lin = te.Linear(FIN, FOUT, params_dtype=DT)
    floor_apply = super(torch.autograd.Function, _Floor).apply
    noop = lambda *a: None  # noqa: E731

    def floor_step():
        lin.weight.grad = lin.bias.grad = None
        with te.fp8_autocast(enabled=True, fp8_recipe=recipes["fp8 delayed"]):
            out = floor_apply(x, lin.weight, lin.bias, noop)
        out.backward(dy)
    steps["floor"] = floor_step
    small = torch.nn.Linear(8, 8)
    xs, dys = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8)

    def torch_step():
        small.weight.grad = small.bias.grad = None
        small(xs).backward(dys)
    steps["torch.nn.Linear 8x8"] = torch_step
    for s in steps.values():
        for _ in range(50):
            s()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            steps["fp8 delayed"]()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    best = {n: [] for n in steps}
    names = list(steps)
    for r in range(args.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            b = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(40):
                    steps[n]()
                b = min(b, (time.perf_counter() - t0) / 40)
            best[n].append(1e6 * b)
    ref = statistics.median(best["torch.nn.Linear 8x8"])
    for n, v in best.items():
        med = statistics.median(v)
        print(f"{n:<22} {med:7.1f} us per step  ({med / ref:.2f}x the torch.nn.Linear step)")


if __name__ == "__main__":
    main()
