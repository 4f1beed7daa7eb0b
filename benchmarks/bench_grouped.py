"""GroupedLinear benchmark: the experts of a mixture-of-experts layer (num_gemms GEMMs over the row
blocks of one input, sized by m_splits) as

    te.GroupedLinear       BF16, FP8 DelayedScaling, FP8 Float8CurrentScaling
    a loop of te.Linear    one module per expert, BF16 and FP8 DelayedScaling
    torch._grouped_mm      BF16 (where this torch has it): one grouped launch, weights stacked

on the same weights and inputs, forward + backward (all parameter and input gradients) and forward
alone. Uneven expert loads (multiples of 16 rows, as FP8 needs; one expert gets none), at two MoE
shapes. Timed eagerly (steps issued back to back, STEP_CALLS per event pair; the host's work per
step is part of what a loop of GEMMs costs), the contenders taking turns over ROUNDS rounds, each
keeping its median round. Ratios: every contender against the te.Linear loop of its precision and
against torch._grouped_mm BF16. --json writes every number.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

DTYPE = torch.bfloat16
DEVICE = "cuda"
ROUNDS = 5
STEP_CALLS = 4
# (experts, tokens, in_features, out_features): an FC1-like and an FC2-like expert GEMM
SHAPES = [(8, 16384, 4096, 2048), (8, 16384, 2048, 4096), (32, 16384, 2048, 1024)]


def uneven_splits(experts, tokens, seed=0):
    """Multiples of 16 adding up to tokens, skewed (a few hot experts), the last one empty."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(experts - 1, generator=g) ** 3 + 0.05
    units = tokens // 16
    split = (weights / weights.sum() * units).floor().long()
    split[0] += units - int(split.sum())
    return [int(s) * 16 for s in split] + [0]


def has_grouped_mm():
    return hasattr(torch, "_grouped_mm")


def make_contenders(experts, tokens, fin, fout, splits):
    x = torch.randn(tokens, fin, device=DEVICE, dtype=DTYPE)
    dy = torch.randn(tokens, fout, device=DEVICE, dtype=DTYPE)
    grouped = te.GroupedLinear(experts, fin, fout, bias=False, params_dtype=DTYPE, device=DEVICE)
    weights = [getattr(grouped, f"weight{i}") for i in range(experts)]
    linears = []
    for w in weights:
        lin = te.Linear(fin, fout, bias=False, params_dtype=DTYPE, device=DEVICE)
        with torch.no_grad():
            lin.weight.copy_(w)
        linears.append(lin)
    rs = {"bf16": None, "fp8_delayed": recipe.DelayedScaling(),
          "fp8_current": recipe.Float8CurrentScaling()}

    def grouped_step(r, backward):
        xi = x.detach().requires_grad_(backward)

        def step():
            with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
                y = grouped(xi, splits)
            if backward:
                y.backward(dy)
        return step

    def loop_step(r, backward):
        xi = x.detach().requires_grad_(backward)

        def step():
            with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
                ys = [lin(part) for lin, part in zip(linears, xi.split(splits)) if part.shape[0]]
            y = torch.cat(ys)
            if backward:
                y.backward(dy)
        return step

    out = {}
    for backward in (True, False):
        tag = "fwd_bwd" if backward else "fwd"
        for name in ("bf16", "fp8_delayed", "fp8_current"):
            out[(tag, f"grouped_{name}")] = grouped_step(rs[name], backward)
        for name in ("bf16", "fp8_delayed"):
            out[(tag, f"te_linear_loop_{name}")] = loop_step(rs[name], backward)
        if has_grouped_mm():
            stacked = torch.stack([w.detach().t() for w in weights]).contiguous().requires_grad_(True)
            offs = torch.tensor(splits, device=DEVICE).cumsum(0).to(torch.int32)
            xi = x.detach().requires_grad_(backward)

            def gmm_step(backward=backward, xi=xi):
                y = torch._grouped_mm(xi, stacked, offs=offs)
                if backward:
                    y.backward(dy)
            out[(tag, "torch_grouped_mm_bf16")] = gmm_step
    return out


def check_grouped_mm(contenders):
    """Drop torch._grouped_mm where this torch or GPU refuses it (say why)."""
    for key in [k for k in contenders if k[1] == "torch_grouped_mm_bf16"]:
        try:
            contenders[key]()
            torch.cuda.synchronize()
        except (RuntimeError, NotImplementedError) as exc:
            print(f"  torch._grouped_mm ({key[0]}) unavailable here: {str(exc)[:100]}")
            del contenders[key]


def main():
    args = common.parse_args(__doc__)
    reps = 5 if args.quick else 15
    rows = []
    for experts, tokens, fin, fout in SHAPES:
        label = f"{experts}x{tokens}x{fin}x{fout}"
        if not common.selected(label, args.filter):
            continue
        splits = uneven_splits(experts, tokens)
        contenders = make_contenders(experts, tokens, fin, fout, splits)
        check_grouped_mm(contenders)
        for tag in ("fwd_bwd", "fwd"):
            fns = {name: fn for (t, name), fn in contenders.items() if t == tag}
            ms = common.time_interleaved_ms(fns, rounds=ROUNDS, warmup=3, reps=reps, graph=False,
                                            eager_calls=STEP_CALLS)
            flops = 2 * tokens * fin * fout * (3 if tag == "fwd_bwd" else 1)
            row = {"shape": label, "pass": tag, "m_splits": splits,
                   **{f"{k}_ms": v for k, v in ms.items()},
                   **{f"{k}_tflops": flops / v / 1e9 for k, v in ms.items()}}
            for prec in ("bf16", "fp8_delayed"):
                row[f"grouped_{prec}_speedup_vs_te_linear_loop"] = (
                    ms[f"te_linear_loop_{prec}"] / ms[f"grouped_{prec}"])
            if "torch_grouped_mm_bf16" in ms:
                for name in ("grouped_bf16", "grouped_fp8_delayed", "grouped_fp8_current"):
                    row[f"{name}_speedup_vs_torch_grouped_mm"] = ms["torch_grouped_mm_bf16"] / ms[name]
            print(f"{label} {tag}: " + "  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
            print("   ratios: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if "speedup" in k),
                  flush=True)
            rows.append(row)
    print()
    common.print_table(rows, ["shape", "pass", "grouped_bf16_ms", "te_linear_loop_bf16_ms",
                              "torch_grouped_mm_bf16_ms", "grouped_fp8_delayed_ms",
                              "te_linear_loop_fp8_delayed_ms", "grouped_fp8_current_ms"])
    common.write_json(args.json, {**common.device_record(), "has_torch_grouped_mm": has_grouped_mm(),
                                  "rows": rows})


if __name__ == "__main__":
    main()
