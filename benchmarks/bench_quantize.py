"""FP8 cast and fused cast+transpose bandwidth against plain PyTorch (eager and torch.compile of
the same reference) and the device's measured copy bandwidth, in one run.

Bytes counted: input read once + every output written once (cast: 2+1 bytes per bf16 element;
cast+transpose: 2+1+1)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from transformer_engine.pytorch import ops  # noqa: E402

SHAPES = [(16384, 4096), (32768, 8192), (4096, 4096), (8192, 14336)]
FP8 = torch.float8_e4m3fn


def torch_cast(x, scale):
    return (x.float() * scale).clamp(-448, 448).to(FP8)


def torch_cast_transpose(x, scale):
    q = (x.float() * scale).clamp(-448, 448).to(FP8)
    return q, q.t().contiguous()


def main():
    args = common.parse_args(__doc__)
    reps = 10 if args.quick else 40
    copy = common.copy_bandwidth_gbs()
    print(f"copy bandwidth: {copy:.0f} GB/s (read + write)")
    compiled_cast = torch.compile(torch_cast)
    compiled_ct = torch.compile(torch_cast_transpose)
    rows = []
    for shape in SHAPES:
        def make(i, shape=shape):
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            return x, torch.tensor([1.5], device="cuda"), torch.zeros(1, device="cuda")
        pick = common.rotating(make)
        n = shape[0] * shape[1]
        kernels = {
            "cast": (3 * n, lambda x, s, a: ops.quantize(x, s, FP8, amax=a),
                     lambda x, s, a: torch_cast(x, s), lambda x, s, a: compiled_cast(x, s)),
            "cast_transpose": (4 * n, lambda x, s, a: ops.cast_transpose(x, s, FP8, amax=a),
                               lambda x, s, a: torch_cast_transpose(x, s),
                               lambda x, s, a: compiled_ct(x, s)),
        }
        for name, (nbytes, te_fn, eager_fn, comp_fn) in kernels.items():
            row = {"kernel": name, "shape": f"{shape[0]}x{shape[1]}"}
            for label, fn in (("te", te_fn), ("eager", eager_fn), ("compiled", comp_fn)):
                ms = common.time_ms(lambda: fn(*pick()), reps=reps)
                row[f"{label}_ms"] = ms
                row[f"{label}_gbs"] = nbytes / (ms * 1e-3) / 1e9
                row[f"{label}_pct_copy"] = 100 * row[f"{label}_gbs"] / copy
            row["te_vs_eager"] = row["eager_ms"] / row["te_ms"]
            row["te_vs_compiled"] = row["compiled_ms"] / row["te_ms"]
            rows.append(row)
        torch.cuda.empty_cache()
    common.print_table(rows, ["kernel", "shape", "te_gbs", "te_pct_copy", "eager_pct_copy",
                              "compiled_pct_copy", "te_vs_eager", "te_vs_compiled"])
    common.write_json(args.json, {**common.device_record(), "copy_gbs": copy, "results": rows})


if __name__ == "__main__":
    main()
