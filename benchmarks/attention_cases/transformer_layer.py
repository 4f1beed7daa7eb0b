"""GPT block step: te.TransformerLayer against a plain-PyTorch block on the same weights.

Shape: hidden 4096, 32 heads (d = 128), ffn 16384, seq 2048, batch 2, causal, sbhd, GELU, biases,
no dropout. A step = forward + backward (input and parameter gradients). Contenders, in one run:
  te_bf16       te.TransformerLayer, BF16
  te_fp8        te.TransformerLayer inside te.autocast(DelayedScaling()) (FP8 GEMMs)
  te_fp8_cs     the same with Float8CurrentScaling()
  torch_eager   plain block: nn.LayerNorm, nn.Linear, F.scaled_dot_product_attention(is_causal),
                tanh-GELU, BF16
  torch_compile torch.compile of the plain block
Timed like bench_modules.py: events around STEP_CALLS eager steps issued back to back (the
steady state of a training loop), the contenders taking turns over five rounds
(common.time_interleaved_ms, graph=False), each keeping its median round; grads
set to None before each step for every contender. The attention backend the dispatcher chose for
te is printed and recorded.
te_bf16 and torch_compile are then timed once more as a pair alone, alternated, the ratio taken
within each round (common.paired_ratio: paired_te_bf16_vs_compile, its median over 12 rounds).
Bars: te_bf16 <= torch_compile; te_fp8 >= 1.45x faster than torch_eager (BF16).

Run on its own: python benchmarks/attention_cases/transformer_layer.py [--json out.json] [--quick]
bench_attention.py imports run_gpt_block(quick) -> dict of rows.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

HIDDEN, HEADS, FFN, SEQ, BATCH = 4096, 32, 16384, 2048, 2
DTYPE = torch.bfloat16
DEVICE = "cuda"
STEP_CALLS = 4  # steps between the timing events, as in bench_modules.py
BARS = {"te_bf16_vs_compile": 1.0, "te_fp8_vs_eager": 1.45}


class PlainBlock(torch.nn.Module):
    """The pre-LN GPT block in plain PyTorch, [s, b, h] in and out.

    qkv_per_head: the fused QKV projection's output columns grouped by head (q, k, v of head 0,
    then of head 1, ...) instead of by kind (every head's q, then k, then v), so that a column
    split over ranks hands each rank whole heads (tensor parallelism: bench_distributed.py).
    The heads are then counted from the projection's output, and the sequence from it too (a
    sequence-parallel input holds a rank's rows, the projection's output every row)."""

    def __init__(self, qkv_per_head: bool = False):
        super().__init__()
        self.qkv_per_head = qkv_per_head
        kw = dict(dtype=DTYPE, device=DEVICE)
        self.ln1 = torch.nn.LayerNorm(HIDDEN, **kw)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, **kw)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, **kw)
        self.ln2 = torch.nn.LayerNorm(HIDDEN, **kw)
        self.fc1 = torch.nn.Linear(HIDDEN, FFN, **kw)
        self.fc2 = torch.nn.Linear(FFN, HIDDEN, **kw)

    def forward(self, x):
        qkv = self.qkv(self.ln1(x))
        s, b, width = qkv.shape
        d = HIDDEN // HEADS
        if self.qkv_per_head:
            q, k, v = qkv.view(s, b, width // (3 * d), 3, d).permute(3, 1, 2, 0, 4)
        else:
            q, k, v = qkv.view(s, b, 3, HEADS, d).permute(2, 1, 3, 0, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)       # [b, h, s, d]
        x = x + self.proj(ctx.permute(2, 0, 1, 3).reshape(s, b, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def te_block():
    return te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                               self_attn_mask_type="causal", fuse_qkv_params=True,
                               params_dtype=DTYPE, device=DEVICE)


def _step_fn(module, x, grad, ctx_factory=None):
    params = list(module.parameters())

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        if ctx_factory is None:
            out = module(x)
        else:
            with ctx_factory():
                out = module(x)
        out.backward(grad)
    return step


def run_gpt_block(quick: bool = False) -> dict:
    reps = 10 if quick else 30
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(SEQ, BATCH, HIDDEN, device="cuda", dtype=DTYPE, generator=g).requires_grad_()
    grad = torch.randn(SEQ, BATCH, HIDDEN, device="cuda", dtype=DTYPE, generator=g)
    layer, plain = te_block(), PlainBlock()
    compiled = torch.compile(plain)
    delayed, current = recipe.DelayedScaling(), recipe.Float8CurrentScaling()  # one per run: the
    contenders = {                                          # modules keep state per recipe object
        "te_bf16": _step_fn(layer, x, grad),
        # one layer per recipe, so that taking turns never switches a layer's recipe state
        "te_fp8": _step_fn(te_block(), x, grad, lambda: te.autocast(recipe=delayed)),
        "te_fp8_cs": _step_fn(te_block(), x, grad, lambda: te.autocast(recipe=current)),
        "torch_eager": _step_fn(plain, x, grad),
        "torch_compile": _step_fn(compiled, x, grad),
    }
    row = {"case": "gpt_block", "shape": f"h{HIDDEN} heads{HEADS} ffn{FFN} s{SEQ} b{BATCH}"}
    runnable = {}
    for name, fn in contenders.items():
        try:
            fn()
            runnable[name] = fn
        except Exception as exc:  # report a contender that cannot run (e.g. no FP8 on the device)
            row[f"{name}_ms"] = None
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    # the contenders take turns over rounds, each keeping its median round (clock drift hits all)
    times = common.time_interleaved_ms(runnable, rounds=5, warmup=3, reps=max(2, reps // 5), graph=False,
                                       eager_calls=STEP_CALLS)
    for name in contenders:
        if name in times:
            row[f"{name}_ms"] = times[name]
        print(f"  {name:<14} {row[f'{name}_ms'] if row[f'{name}_ms'] is not None else row[f'{name}_error']}",
              flush=True)
    report = layer.self_attention.core_attention.last_backend_report
    row["te_attention_backend"] = report.chosen if report else None
    row["te_attention_report"] = str(report) if report else None

    def ratio(a, b):
        return row[f"{b}_ms"] / row[f"{a}_ms"] if row.get(f"{a}_ms") and row.get(f"{b}_ms") else None
    row["te_bf16_vs_compile"] = ratio("te_bf16", "torch_compile")
    row["te_bf16_vs_eager"] = ratio("te_bf16", "torch_eager")
    row["te_fp8_vs_eager"] = ratio("te_fp8", "torch_eager")
    row["te_fp8_cs_vs_eager"] = ratio("te_fp8_cs", "torch_eager")
    bf16_ratio = row["te_bf16_vs_compile"]
    if "te_bf16" in runnable and "torch_compile" in runnable:
        # the BF16 bar is a comparison within the GPU's clock drift: the pair alone, alternated,
        # is the fairer measurement; the bar must hold on both
        p = common.paired_ratio(runnable["te_bf16"], runnable["torch_compile"], rounds=12,
                                reps=max(2, reps // 5), eager_calls=STEP_CALLS)
        row["paired_te_bf16_vs_compile"], row["paired_ratio_iqr"] = p["median"], p["quartiles"]
        print(f"  te_bf16 vs torch_compile, {p['rounds']} paired rounds: median {p['median']:.4f} "
              f"(quartiles {p['quartiles'][0]:.4f}-{p['quartiles'][1]:.4f})", flush=True)
        bf16_ratio = min(bf16_ratio, p["median"])
    checked = dict(row, te_bf16_vs_compile=bf16_ratio)
    row["meets_bars"] = "yes" if all(checked.get(k) is not None and checked[k] >= v
                                     for k, v in BARS.items()) else "NO"
    return row


def main():
    args = common.parse_args(__doc__)
    row = run_gpt_block(args.quick)
    common.print_table([row], ["case", "te_bf16_ms", "te_fp8_ms", "te_fp8_cs_ms", "torch_eager_ms",
                               "torch_compile_ms", "te_bf16_vs_compile", "te_fp8_vs_eager",
                               "te_attention_backend", "meets_bars"])
    print(row["te_attention_report"])
    common.write_json(args.json, {**common.device_record(), "bars": BARS, "results": [row]})


if __name__ == "__main__":
    main()
