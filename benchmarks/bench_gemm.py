"""GEMM throughput: general_gemm (nvte_gemm on cuBLASLt / hipBLASLt / rocBLAS) against the peers
in the same run, on the same inputs:

  bf16   general_gemm(W, X, layout="TN")              vs  torch.matmul(X, W.T)
  fp8    general_gemm(W8, X8, bf16 out, scale_invs)   vs  torch._scaled_mm(X8, W8.T, ...)
         once with FP8 fast accumulation (forward GEMMs) and once without (use_split_accumulator)
  fused  general_gemm(W, X, bias=b, gelu=True)        vs  matmul, + bias, tanh-GELU (3 kernels)
         (the fused call also writes the GELU input, which training needs and the peer does not)

Shapes are (M tokens, N output features, K reduction); TFLOP/s counts 2*M*N*K. Times are the
kernels' alone (common.time_ms replays CUDA graphs), inputs rotate over three sets. The first
general_gemm call of a shape (the accuracy check, before any timing) is the one where cuBLASLt's
plan times its heuristic candidates and keeps the fastest. `--filter REGEX` runs the rows whose
"kind MxNxK" label matches. The bar
is te/peer >= 0.97 at every shape (> 1 for the fused epilogue); meets_bar says whether
a row meets it.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from transformer_engine.pytorch import kernels, native  # noqa: E402

SHAPES = [(8192, 8192, 8192), (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
          (4096, 4096, 4096), (128, 4096, 4096)]
FUSED_SHAPES = [(16384, 14336, 4096), (4096, 4096, 4096), (128, 4096, 4096)]
BAR = 0.97


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def rel_err(got, want):
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def bf16_case(M, N, K):
    def make(i):
        g = torch.Generator(device="cuda").manual_seed(i)
        W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g)
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        return W, X
    return (make, lambda W, X: kernels.general_gemm(W, X, layout="TN").out,
            lambda W, X: torch.matmul(X, W.t()))


def fp8_case(M, N, K, fast):
    e4m3 = native.fp8_dtype("e4m3")

    def make(i):
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        W = (torch.randn(N, K, device="cuda", generator=g) * 16).to(e4m3)
        X = (torch.randn(M, K, device="cuda", generator=g) * 16).to(e4m3)
        sw = torch.full((), 1 / 16, device="cuda")
        sx = torch.full((), 1 / 16, device="cuda")
        return W, X, sw, sx

    def te(W, X, sw, sx):
        return kernels.general_gemm(W, X, torch.bfloat16, layout="TN", A_scale_inv=sw.reshape(1),
                                B_scale_inv=sx.reshape(1), use_split_accumulator=not fast).out

    def peer(W, X, sw, sx):
        return torch._scaled_mm(X, W.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                use_fast_accum=fast)
    return make, te, peer


def fused_case(M, N, K):
    def make(i):
        g = torch.Generator(device="cuda").manual_seed(200 + i)
        W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) / 64
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g)
        return W, X, b

    def te(W, X, b):
        return kernels.general_gemm(W, X, layout="TN", bias=b, gelu=True).out

    def peer(W, X, b):
        return torch.nn.functional.gelu(torch.matmul(X, W.t()) + b, approximate="tanh")
    return make, te, peer


def measure(kind, shape, case, reps, bar=BAR):
    make, te, peer = case
    M, N, K = shape
    print(f"{kind:>26} {M}x{N}x{K}", end="", flush=True)
    pick = common.rotating(make)
    err = rel_err(te(*make(0)), peer(*make(0)))
    te_ms = common.time_ms(lambda: te(*pick()), reps=reps)
    peer_ms = common.time_ms(lambda: peer(*pick()), reps=reps)
    row = {"kind": kind, "shape": f"{M}x{N}x{K}", "te_ms": te_ms, "peer_ms": peer_ms,
           "te_tflops": tflops(M, N, K, te_ms), "peer_tflops": tflops(M, N, K, peer_ms),
           "te_vs_peer": peer_ms / te_ms, "rel_err": err}
    row["meets_bar"] = "yes" if row["te_vs_peer"] >= bar else "NO"
    print(f"  te {row['te_tflops']:7.1f}  peer {row['peer_tflops']:7.1f} TFLOP/s  ratio "
          f"{row['te_vs_peer']:.3f}  {row['meets_bar']}", flush=True)
    torch.cuda.empty_cache()
    return row


def main():
    args = common.parse_args(__doc__)
    reps = 10 if args.quick else 30
    rows = []
    want = lambda kind, s: common.selected(f"{kind} {'x'.join(map(str, s))}", args.filter)  # noqa: E731
    for shape in SHAPES:
        for kind, case in (("bf16 vs matmul", lambda: bf16_case(*shape)),
                           ("fp8 fast vs _scaled_mm", lambda: fp8_case(*shape, True)),
                           ("fp8 split vs _scaled_mm", lambda: fp8_case(*shape, False))):
            if want(kind, shape):
                rows.append(measure(kind, shape, case(), reps))
    for shape in FUSED_SHAPES:
        # the fused epilogue must beat the unfused sequence outright
        if want("bias+gelu fused vs unfused", shape):
            rows.append(measure("bias+gelu fused vs unfused", shape, fused_case(*shape), reps,
                                bar=1.0))
    print()
    common.print_table(rows, ["kind", "shape", "te_tflops", "peer_tflops", "te_vs_peer",
                              "meets_bar", "rel_err", "te_ms", "peer_ms"])
    misses = [f"{r['kind']} {r['shape']}" for r in rows if r["meets_bar"] != "yes"]
    print(f"\nbar te/peer >= {BAR}: {len(rows) - len(misses)}/{len(rows)} rows meet it"
          + (f"; below: {', '.join(misses)}" if misses else ""))
    common.write_json(args.json, {**common.device_record(), "bar": BAR, "results": rows})


if __name__ == "__main__":
    main()
