"""Float8BlockScaling benchmark (sm_90): block-wise FP8 against per-tensor FP8 and BF16.

1. te.Linear forward + backward (input and weight gradients) at GPT shapes (tokens 16384, hidden
   4096, ffn 16384: the FC1 and FC2 GEMMs of bench_modules.py) under
       Float8BlockScaling (1x128 activations/gradients, 128x128 weights)
       DelayedScaling (per-tensor FP8)       and       BF16 (no autocast)
   timed eagerly, the contenders taking turns (common.time_interleaved_ms).
2. The GEMM alone, D = X @ W.T at the same shapes: nvte_gemm_block_scaled (1x128 x 128x128
   scales) against torch._scaled_mm with per-tensor scales (fast accumulation off, as the block
   path always is), and torch.matmul in BF16; CUDA-graphed, so only the kernels are timed.
3. The block quantiser alone (1x128 with its transposed copy; 128x128) against a BF16 copy of the
   same tensor, whose time is the memory-bandwidth floor for a pass over it.
Ratios are printed against BF16 and against per-tensor FP8; --json writes every number.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402
from transformer_engine.pytorch.kernels import blockwise as B  # noqa: E402

DTYPE = torch.bfloat16
TOKENS = 16384
# (in_features, out_features): FC1 and FC2 of a 4096-hidden, 16384-ffn layer
SHAPES = [(4096, 16384), (16384, 4096)]
ROUNDS = 5


def linear_cases(in_f, out_f, reps):
    torch.manual_seed(0)
    lin = te.Linear(in_f, out_f, params_dtype=DTYPE, device="cuda")
    x = torch.randn(TOKENS, in_f, dtype=DTYPE, device="cuda", requires_grad=True)
    dy = torch.randn(TOKENS, out_f, dtype=DTYPE, device="cuda")
    recipes = {"fp8_block": recipe.Float8BlockScaling(),
               "fp8_tensor": recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)}

    def step(r):
        def run():
            with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
                y = lin(x)
            y.backward(dy)
        return run

    fns = {"bf16": step(None), **{k: step(r) for k, r in recipes.items()}}
    return common.time_interleaved_ms(fns, rounds=ROUNDS, warmup=3, reps=reps, graph=False)


def gemm_cases(in_f, out_f, reps):
    torch.manual_seed(0)
    x = torch.randn(TOKENS, in_f, dtype=DTYPE, device="cuda")
    w = torch.randn(out_f, in_f, dtype=DTYPE, device="cuda") * 0.02
    xq, _ = B.quantize_blockwise(x, torch.float8_e4m3fn, 1)
    wq, _ = B.quantize_blockwise(w, torch.float8_e4m3fn, 2)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    fns = {
        "bf16_matmul": lambda: torch.matmul(x, w.t()),
        "fp8_block": lambda: B.gemm_blockwise(wq, xq, DTYPE),
        "fp8_tensor_scaled_mm": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                         out_dtype=DTYPE, use_fast_accum=False),
    }
    return common.time_interleaved_ms(fns, rounds=ROUNDS, warmup=3, reps=reps)


def quantize_cases(in_f, out_f, reps):
    x = torch.randn(TOKENS, in_f, dtype=DTYPE, device="cuda")
    fns = {
        "bf16_copy": lambda: x.clone(),
        "block_1x128_with_transpose": lambda: B.quantize_blockwise(x, torch.float8_e4m3fn, 1, True, True),
        "block_128x128_with_transpose": lambda: B.quantize_blockwise(x, torch.float8_e4m3fn, 2, True, True),
    }
    return common.time_interleaved_ms(fns, rounds=ROUNDS, warmup=3, reps=reps)


def main():
    args = common.parse_args(__doc__)
    reps = 5 if args.quick else 15
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        print(f"Float8BlockScaling's GEMM runs on sm_90; this GPU is sm_{cap[0]}{cap[1]}")
        return
    out = {**common.device_record(), "tokens": TOKENS, "linear": [], "gemm": [], "quantize": []}
    for in_f, out_f in SHAPES:
        shape = f"{TOKENS}x{in_f}x{out_f}"
        if common.selected(f"linear {shape}", args.filter):
            ms = linear_cases(in_f, out_f, reps)
            row = {"shape": shape, **{f"{k}_ms": v for k, v in ms.items()},
                   "block_vs_bf16": ms["bf16"] / ms["fp8_block"],
                   "block_vs_tensor_fp8": ms["fp8_tensor"] / ms["fp8_block"]}
            out["linear"].append(row)
        if common.selected(f"gemm {shape}", args.filter):
            ms = gemm_cases(in_f, out_f, reps)
            flops = 2.0 * TOKENS * in_f * out_f
            row = {"shape": shape, **{f"{k}_ms": v for k, v in ms.items()},
                   "fp8_block_tflops": flops / ms["fp8_block"] / 1e9,
                   "block_vs_bf16": ms["bf16_matmul"] / ms["fp8_block"],
                   "block_vs_scaled_mm": ms["fp8_tensor_scaled_mm"] / ms["fp8_block"]}
            out["gemm"].append(row)
        if common.selected(f"quantize {shape}", args.filter):
            ms = quantize_cases(in_f, out_f, reps)
            row = {"shape": f"{TOKENS}x{in_f}", **{f"{k}_ms": v for k, v in ms.items()},
                   "1x128_vs_copy": ms["bf16_copy"] / ms["block_1x128_with_transpose"]}
            out["quantize"].append(row)
    for part in ("linear", "gemm", "quantize"):
        if out[part]:
            print(f"\n{part} (ratios > 1: block-wise FP8 faster)")
            common.print_table(out[part], list(out[part][0]))
    common.write_json(args.json, out)


if __name__ == "__main__":
    main()
