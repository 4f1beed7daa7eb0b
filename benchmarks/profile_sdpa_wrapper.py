"""What DotProductAttention forced to the sdpa backend does per call beyond calling
torch.nn.functional.scaled_dot_product_attention directly on [b, h, s, d] views of the same tensors
(bench_attention.py --filter "sdpa_backend wrapper_cost" measures the total on the GPU; this
attributes it):

  host  microseconds per forward and per forward+backward of each path at a tiny shape, where
        the kernels cost next to nothing (interleaved blocks, the fastest block of each);
  ops   the aten ops each path dispatches in one forward+backward, and the ops only the wrapper
        dispatches (views cost host time only; anything else is device work too);
  cuda  (on a GPU) the kernels each path runs at --shape with their device time, from
        torch.profiler, so that a copy or a different SDPA kernel shows up by name.

  python benchmarks/profile_sdpa_wrapper.py [--device cpu|cuda] [--mask causal|no_mask]
                                            [--format bshd|sbhd] [--shape 4,32,4096,128]
"""
import argparse
import collections
import os
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_engine.pytorch.attention import DotProductAttention

_FORCE_SDPA = {"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0",
               "NVTE_SDPA_ATTN": "1"}


def make_paths(shape, fmt, mask, device, dtype):
    """(wrapper, direct): each runs one forward, and the backward when asked, on fresh leaves."""
    b, h, s, d = shape
    layout = (b, s, h, d) if fmt == "bshd" else (s, b, h, d)
    to_bhsd = (0, 2, 1, 3) if fmt == "bshd" else (1, 2, 0, 3)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(*layout, device=device, dtype=dtype, generator=g) for _ in range(4))
    dpa = DotProductAttention(h, d, qkv_format=fmt, attn_mask_type=mask)

    def wrapper(backward):
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = dpa(qq, kk, vv)
        if backward:
            out.backward(do.reshape(out.shape))

    def direct(backward):
        qq, kk, vv = (t.permute(*to_bhsd).detach().requires_grad_(True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=mask == "causal", scale=d ** -0.5)
        if backward:
            out.backward(do.permute(*to_bhsd))
    wrapper(True)
    if dpa.last_backend_report.chosen != "sdpa":
        raise SystemExit(f"sdpa declined: {dpa.last_backend_report}")
    return wrapper, direct


def host_us(fn, backward, device, blocks=200, calls=40):
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(backward)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn):
    with _OpLog() as log:
        fn(True)
    return log.ops


def cuda_kernels(fn):
    fn(True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(True)
        torch.cuda.synchronize()
    rows = [(e.key, e.count, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mask", default="causal", choices=["causal", "no_mask"])
    ap.add_argument("--format", default="bshd", choices=["bshd", "sbhd"])
    ap.add_argument("--shape", default="4,32,4096,128", help="b,h,s,d of the kernel listing (GPU)")
    args = ap.parse_args()
    os.environ.update(_FORCE_SDPA)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    if args.device == "cpu":
        torch.set_num_threads(1)
    tiny = make_paths((1, 2, 16, 8), args.format, args.mask, args.device, dtype)
    for backward in (False, True):
        wrap, direct = (host_us(fn, backward, args.device) for fn in tiny)
        print(f"host {'fwd+bwd' if backward else 'fwd'}: wrapper {wrap:.1f} us, direct {direct:.1f} us, "
              f"wrapper's own {wrap - direct:.1f} us per call")
    ops = [aten_ops(fn) for fn in tiny]
    print(f"aten ops per fwd+bwd: wrapper {sum(ops[0].values())}, direct {sum(ops[1].values())}; "
          f"only in the wrapper: {dict(ops[0] - ops[1]) or 'none'}; only direct: {dict(ops[1] - ops[0]) or 'none'}")
    if args.device == "cuda":
        shape = tuple(int(x) for x in args.shape.split(","))
        for name, fn in zip(("wrapper", "direct"), make_paths(shape, args.format, args.mask, "cuda", dtype)):
            rows = cuda_kernels(fn)
            print(f"{name} kernels at {shape} (total {sum(r[2] for r in rows):.0f} us):")
            for key, count, us in rows:
                print(f"  {us:9.1f} us  x{count}  {key[:110]}")


if __name__ == "__main__":
    main()
