"""FP8 cast and fused cast+transpose bandwidth against plain PyTorch (eager and torch.compile of
the same reference) and the device's measured copy bandwidth, in one run.

Bytes counted: input read once + every output written once (cast: 2+1 bytes per bf16 element;
cast+transpose: 2+1+1)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from transformer_engine.pytorch import kernels  # noqa: E402

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
            "cast": (3 * n, lambda x, s, a: kernels.quantize(x, s, FP8, amax=a),
                     lambda x, s, a: torch_cast(x, s), lambda x, s, a: compiled_cast(x, s)),
            "cast_transpose": (4 * n, lambda x, s, a: kernels.cast_transpose(x, s, FP8, amax=a),
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
    fused = fused_rows(args, reps, copy)
    common.print_table(fused, ["kernel", "shape", "fused_ms", "unfused_ms", "fused_gbs",
                               "fused_pct_copy", "fused_vs_unfused"])
    common.write_json(args.json, {**common.device_record(), "copy_gbs": copy, "results": rows,
                                  "fused_results": fused})


# The fused cast+transpose ops against the sequences of TE ops they replace in the modules' FP8
# backward/forward (output gradient dy -> e5m2, the dtype of gradients), each pair timed
# interleaved in the same run. Bytes: inputs read once + FP8 outputs written once (+ dbias).
FUSED_SHAPE = (16384, 16384)
E5M2 = torch.float8_e5m2


def _fused_cases():
    """name -> (make(i) -> args, bytes per element, fused fn, unfused fn)."""
    def one(i):
        x = torch.randn(FUSED_SHAPE, device="cuda", dtype=torch.bfloat16)
        return x, torch.tensor([1.5], device="cuda"), torch.zeros(1, device="cuda")

    def two(i):
        x, s, a = one(i)
        return torch.randn_like(x), x, s, a

    return {
        # dy: cast+transpose for dgrad/wgrad, column sums for the bias gradient
        "cast_transpose_dbias": (
            one, 2 + 1 + 1,
            lambda x, s, a: kernels.cast_transpose_dbias(x, s, E5M2, amax=a),
            lambda x, s, a: (kernels.cast_transpose(x, s, E5M2, amax=a), x.sum(0))),
        # LayerNormMLP forward: gelu(fc1 out) in FP8 and its transpose for fc2's wgrad
        "gelu_cast_transpose": (
            one, 2 + 1 + 1,
            lambda x, s, a: kernels.act_cast_transpose(x, "gelu", s, E5M2, amax=a),
            lambda x, s, a: kernels.transpose(kernels.activation_forward(x, "gelu", E5M2, s, a)[0])),
        # LayerNormMLP backward: dgelu + dbias in FP8 and its transpose for fc1's wgrad
        "dgelu_dbias_cast_transpose": (
            two, 2 + 2 + 1 + 1,
            lambda g, x, s, a: kernels.dact_dbias_cast_transpose(g, x, "gelu", s, E5M2, amax=a),
            lambda g, x, s, a: kernels.transpose(kernels.dbias_dactivation(
                g, x, "gelu", fp8_dtype=E5M2, scale=s, amax=a)[0])),
    }


def fused_rows(args, reps, copy):
    rows = []
    n = FUSED_SHAPE[0] * FUSED_SHAPE[1]
    for name, (make, per_elem, fused_fn, unfused_fn) in _fused_cases().items():
        if not common.selected(name, args.filter):
            continue
        pick = common.rotating(make, count=2)
        ms = common.time_interleaved_ms({"fused": lambda: fused_fn(*pick()),
                                         "unfused": lambda: unfused_fn(*pick())},
                                        reps=max(reps // 4, 5))
        gbs = per_elem * n / (ms["fused"] * 1e-3) / 1e9
        rows.append({"kernel": name, "shape": f"{FUSED_SHAPE[0]}x{FUSED_SHAPE[1]}",
                     "in_dtype": "bfloat16", "fp8_dtype": "float8_e5m2",
                     "fused_ms": ms["fused"], "unfused_ms": ms["unfused"], "fused_gbs": gbs,
                     "fused_pct_copy": 100 * gbs / copy,
                     "fused_vs_unfused": ms["unfused"] / ms["fused"]})
        del pick
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
