"""general_gemm (nvte_gemm): every dtype x layout x epilogue x accumulate against a float64 model
of the maths, FP8 operands and outputs with their scales, the refused requests, empty problems,
misaligned pointers and CUDA-graph capture.

On "cpu" the op runs its plain-torch reference, so the reference is checked against the model;
on "cuda" the native library is. Tolerances: the shared table (tests/tolerances.py) for the
output rounding, plus what the libraries are allowed on top of it:
  - accumulation error bounded by eps_acc * |op_b(B)| @ |op_a(A)| (fp32, or the FP8 tensor cores'
    shorter accumulators, also with fast accumulation off),
  - rounding of the summands (product, accumulated D, bias) to out's dtype before they are added
    (cuBLASLt with beta != 0 and the unfused epilogue do this), i.e. rtol_out * their magnitudes,
  - the GELU epilogues' hardware tanh approximation, up to ~2e-3 absolute on gelu' near |x| = 2-3,
    i.e. 5e-3 |pre|.
"""

import threading

import pytest
import torch

from transformer_engine.pytorch import kernels, native
from transformer_engine.pytorch.kernels import gemm as gemm_mod
from utils import DEVICES, randn, requires_native_gpu, stable_seed, tols
from gemm_model import (EPILOGUES, HP, HP_SHAPES, LAYOUTS, assert_gemm_close, model, operands,
                        run_case)

# ----- high precision ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", HP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
# (input dtype, output dtype): each input dtype with its own output and, for 16-bit inputs, fp32
@pytest.mark.parametrize("dtype,fp32_out", [(d, f) for d in HP for f in (False, True)
                                            if not (f and d == torch.float32)],
                         ids=lambda v: str(v).replace("torch.", "") if not isinstance(v, bool)
                         else ("fp32_out" if v else "same_out"))
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
def test_gemm_high_precision(device, shape, layout, dtype, fp32_out, epilogue, accumulate):
    m, n, k = shape
    out_dtype = torch.float32 if fp32_out else dtype
    run_case(device, layout, m, n, k, dtype, out_dtype, epilogue, accumulate,
             seed=stable_seed(shape, layout, dtype, epilogue, modulo=997))


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_alpha_batched_b_and_repeat(device):
    """alpha scales the product; B with leading batch dims keeps them; repeated calls (cached
    plans) give the same bits."""
    W = randn((48, 32), torch.bfloat16, device, seed=5)
    X = randn((2, 3, 32), torch.bfloat16, device, seed=6)
    first = kernels.general_gemm(W, X, layout="TN", alpha=0.5).out
    assert first.shape == (2, 3, 48)
    ref, _, absprod, _ = model(W, X, "TN", alpha=0.5)
    assert_gemm_close(first, ref, absprod, torch.bfloat16)
    for _ in range(3):
        assert torch.equal(kernels.general_gemm(W, X, layout="TN", alpha=0.5).out, first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemm_misaligned_pointers(device, dtype):
    """Operands at 2-byte (bf16) / 4-byte (fp32) offsets: the library must pick kernels for that
    alignment (plans are cached per alignment), not reuse an aligned one."""
    m, n, k = 40, 24, 56
    for offset in (0, 1, 0):
        a_buf = randn((m * k + 1,), dtype, device, seed=offset + 10)
        b_buf = randn((n * k + 1,), dtype, device, seed=offset + 11)
        A = a_buf[offset:offset + m * k].view(m, k)
        B = b_buf[offset:offset + n * k].view(n, k)
        run_case(device, "TN", m, n, k, dtype, dtype, "bias", False, A=A, B=B, seed=offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", HP_SHAPES + [(64, 48, 0), (0, 48, 80), (64, 0, 80)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype,fp32_out", [(d, f) for d in HP for f in (False, True)
                                            if not (d == torch.float32 and f)],
                         ids=lambda v: str(v).replace("torch.", "") if not isinstance(v, bool)
                         else ("fp32out" if v else "sameout"))
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
def test_gemm_wgrad_bias_grad(device, shape, dtype, fp32_out, accumulate):
    """The wgrad epilogue BGradB (layout NT, B = dY): dW and dY's column sums from one GEMM,
    also with k = 0 (zero sums, out = beta * out), m = 0 (no dW, the sums still made) and n = 0."""
    m, n, k = shape
    run_case(device, "NT", m, n, k, dtype, torch.float32 if fp32_out else dtype, "bgradb",
             accumulate, seed=7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_gemm_empty_batch(device, epilogue):
    """M = 0 tokens: an empty output, empty aux, and a zero bias gradient."""
    m, n, k = 32, 0, 48
    res = run_case(device, "TN", m, n, k, torch.bfloat16, torch.bfloat16, epilogue, False)
    assert res.out.numel() == 0
    if epilogue == "dgelu_bgrad":
        assert torch.equal(res.bias_grad.cpu(), torch.zeros(m, dtype=torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_empty_reduction(device, accumulate):
    """k = 0: the product is zero, so out = bias (+ out when accumulating)."""
    run_case(device, "TN", 24, 8, 0, torch.float32, torch.float32, "bias", accumulate)


# ----- addend: out = product + addend (+ bias, GELU) in the GEMM (nvte_gemm_with_c) -------------

ADDEND_EPILOGUES = ["none", "bias", "gelu", "bias_gelu"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", HP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", HP, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("epilogue", ADDEND_EPILOGUES)
def test_gemm_addend(device, shape, layout, dtype, epilogue):
    """The addend is added with the product, before the bias and GELU (gelu_input includes it)."""
    m, n, k = shape
    run_case(device, layout, m, n, k, dtype, dtype, epilogue, False, addend=True,
             seed=stable_seed(shape, layout, dtype, epilogue, "addend", modulo=997))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(64, 48, 0), (0, 48, 80), (64, 0, 80)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemm_addend_empty(device, shape):
    """k = 0: out = addend + bias (the portable epilogue reads the addend); empty outputs."""
    m, n, k = shape
    run_case(device, "TN", m, n, k, torch.bfloat16, torch.bfloat16, "bias_gelu", False,
             addend=True, seed=13)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp32_out", [False, True], ids=["bf16_out", "fp32_out"])
def test_gemm_addend_into_given_out(device, fp32_out):
    """out= is written, never read (it starts as NaN); a 3-D addend of out's shape; fp32 out of
    bf16 operands with an fp32 addend."""
    m, n, k = 48, 24, 32
    out_dtype = torch.float32 if fp32_out else torch.bfloat16
    W = randn((m, k), torch.bfloat16, device, seed=21)
    X = randn((2, n // 2, k), torch.bfloat16, device, seed=22)
    R = randn((2, n // 2, m), out_dtype, device, seed=23)
    bias = randn((m,), out_dtype, device, seed=24)
    out = torch.full((2, n // 2, m), float("nan"), dtype=out_dtype, device=device)
    res = kernels.general_gemm(W, X, layout="TN", bias=bias, out=out, addend=R)
    assert res.out is out and out.shape == (2, n // 2, m)
    ref, _, absprod, summands = model(W, X, "TN", acc=R, bias=bias)
    assert_gemm_close(out, ref, absprod, out_dtype,
                      extra=1.13 * tols(out_dtype)["rtol"] * summands)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("epilogue", ["none", "bias"])
@pytest.mark.parametrize("fast_accum", [True, False], ids=["fast", "split"])
def test_gemm_fp8_addend(device, epilogue, fast_accum):
    """FP8 operands (TN) with a bfloat16 out and addend: y = x W^T (+ b) + residual in FP8."""
    m, n, k = 64, 32, 96
    A, A_si, B, B_si = fp8_case(device, "TN", m, n, k, ("e4m3", "e4m3"), seed=31)
    run_case(device, "TN", m, n, k, None, torch.bfloat16, epilogue, False, seed=32, A=A, B=B,
             A_si=A_si, B_si=B_si, fast_accum=fast_accum, addend=True)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_addend_errors(device):
    A = randn((16, 32), torch.bfloat16, device)
    B = randn((8, 32), torch.bfloat16, device)
    R = randn((8, 16), torch.bfloat16, device, seed=1)
    with pytest.raises(ValueError, match="general_gemm: addend and accumulate=True are exclusive"):
        kernels.general_gemm(A, B, out=torch.zeros_like(R), accumulate=True, addend=R)
    with pytest.raises(ValueError, match=r"general_gemm: addend has shape \(8, 15\); expected "
                                         r"out's shape \(8, 16\)"):
        kernels.general_gemm(A, B, addend=R[:, :15].contiguous())
    with pytest.raises(ValueError, match=r"general_gemm: addend has shape \(16, 8\)"):
        kernels.general_gemm(A, B, addend=R.t().contiguous())
    with pytest.raises(ValueError, match="general_gemm: addend has dtype float32; expected one of "
                                         "bfloat16"):
        kernels.general_gemm(A, B, addend=R.float())
    with pytest.raises(ValueError, match="general_gemm: addend .* is not contiguous"):
        kernels.general_gemm(A, B, addend=randn((16, 8), torch.bfloat16, device).t())
    A8, A_si = fp8_operand((16, 32), "e4m3", device, 1)
    B8, B_si = fp8_operand((16, 32), "e4m3", device, 2)
    fp8 = native.fp8_dtype("e4m3", device)
    with pytest.raises(ValueError, match="general_gemm: addend needs a high-precision out"):
        kernels.general_gemm(A8, B8, fp8, A_scale_inv=A_si, B_scale_inv=B_si,
                         out_scale=torch.ones(1, device=device),
                         addend=randn((16, 16), torch.bfloat16, device))


# ----- FP8 ---------------------------------------------------------------------------------------

FP8_PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]


def fp8_operand(shape, fmt, device, seed, scale=4.0):
    dtype = native.fp8_dtype(fmt, device)
    x = randn(shape, torch.float32, "cpu", seed=seed)
    q = (x * scale).to(dtype).to(device)
    return q, torch.tensor([1.0 / scale], device=device)


def fp8_case(device, layout, m, n, k, pair, seed=0):
    a_shape = (m, k) if layout[0] == "T" else (k, m)
    b_shape = (k, n) if layout[1] == "T" else (n, k)
    A, A_si = fp8_operand(a_shape, pair[0], device, seed, scale=8.0)
    B, B_si = fp8_operand(b_shape, pair[1], device, seed + 1, scale=2.0)
    return A, A_si, B, B_si


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", FP8_PAIRS, ids=lambda p: "x".join(p))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
@pytest.mark.parametrize("fast_accum", [True, False], ids=["fast", "split"])
def test_gemm_fp8_high_precision_out(device, pair, out_dtype, epilogue, accumulate, fast_accum):
    m, n, k = 64, 32, 96
    A, A_si, B, B_si = fp8_case(device, "TN", m, n, k, pair, seed=len(epilogue))
    run_case(device, "TN", m, n, k, None, out_dtype, epilogue, accumulate, seed=3, A=A, B=B,
             A_si=A_si, B_si=B_si, fast_accum=fast_accum)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", FP8_PAIRS, ids=lambda p: "x".join(p))
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_fp8_out(device, pair, bias):
    """FP8 output: saturate(result * scale), amax = max(amax, max|result|), scale_inv = 1/scale."""
    m, n, k = 48, 32, 64
    A, A_si, B, B_si = fp8_case(device, "TN", m, n, k, pair, seed=9)
    out_dtype = native.fp8_dtype("e4m3", device)
    out_scale = torch.tensor([2.0], device=device)
    out_amax = torch.tensor([0.25], device=device)  # smaller than the result's: must be raised
    out_scale_inv = torch.zeros(1, device=device)
    b = randn((m,), torch.bfloat16, device, seed=4) if bias else None
    res = kernels.general_gemm(A, B, out_dtype, layout="TN", A_scale_inv=A_si, B_scale_inv=B_si,
                           bias=b, out_scale=out_scale, out_amax=out_amax,
                           out_scale_inv=out_scale_inv)
    ref, _, absprod, _ = model(A, B, "TN", A_si=A_si, B_si=B_si, bias=b)
    assert res.out.dtype == out_dtype
    deq = res.out.float() * 0.5
    assert_gemm_close(deq, ref.clamp(-224, 224), absprod, out_dtype, fp8=True)
    want_amax = float(ref.abs().max())
    assert abs(float(out_amax) - want_amax) <= 5e-3 * want_amax  # fast accumulation
    assert float(out_scale_inv) == 0.5


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_fp8_out_keeps_larger_amax(device):
    m, n, k = 16, 16, 16
    A, A_si, B, B_si = fp8_case(device, "TN", m, n, k, ("e4m3", "e4m3"), seed=2)
    out_amax = torch.tensor([1e6], device=device)
    kernels.general_gemm(A, B, native.fp8_dtype("e4m3", device), layout="TN", A_scale_inv=A_si,
                     B_scale_inv=B_si, out_scale=torch.ones(1, device=device), out_amax=out_amax)
    assert float(out_amax) == 1e6


def _fp8_any_layout():
    """True when the device's library multiplies FP8 in every layout (CPU reference; sm_100+)."""
    if not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability()[0] >= 10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NN", "NT"])
def test_gemm_fp8_non_tn(device, layout):
    """Non-TN FP8: computed by the reference (and Blackwell); a clear NotImplementedError from
    cuBLASLt on Hopper/Ada instead of garbage."""
    m, n, k = 32, 16, 48
    A, A_si, B, B_si = fp8_case(device, layout, m, n, k, ("e4m3", "e4m3"), seed=12)
    if device == "cuda" and not _fp8_any_layout():
        with pytest.raises(NotImplementedError, match="TN layout"):
            kernels.general_gemm(A, B, layout=layout, A_scale_inv=A_si, B_scale_inv=B_si)
        return
    run_case(device, layout, m, n, k, None, torch.bfloat16, "none", False, A=A, B=B, A_si=A_si,
             B_si=B_si, fast_accum=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(40, 32, 64), (32, 24, 64), (32, 32, 72)],
                         ids=["m40", "n24", "k72"])
def test_gemm_fp8_dims_not_multiple_of_16(device, shape):
    m, n, k = shape
    A, A_si = fp8_operand((m, k), "e4m3", device, 1)
    B, B_si = fp8_operand((n, k), "e4m3", device, 2)
    with pytest.raises(ValueError, match="multiples of 16"):
        kernels.general_gemm(A, B, layout="TN", A_scale_inv=A_si, B_scale_inv=B_si)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_fp8_empty_batch(device):
    A, A_si = fp8_operand((32, 48), "e4m3", device, 1)
    B, B_si = fp8_operand((0, 48), "e4m3", device, 2)
    out = kernels.general_gemm(A, B, layout="TN", A_scale_inv=A_si, B_scale_inv=B_si).out
    assert out.shape == (0, 32)


# ----- refused requests --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_gemm_errors_name_op_and_argument(device):
    A = randn((16, 32), torch.bfloat16, device)
    B = randn((8, 32), torch.bfloat16, device)
    with pytest.raises(ValueError, match="general_gemm: A .* and B .* must have the same dtype"):
        kernels.general_gemm(A, B.float())
    with pytest.raises(ValueError, match="reduction dimension"):
        kernels.general_gemm(A, randn((8, 31), torch.bfloat16, device))
    with pytest.raises(ValueError, match="layout"):
        kernels.general_gemm(A, B, layout="XT")
    with pytest.raises(ValueError, match="out_dtype"):
        kernels.general_gemm(A, B, torch.float16)
    with pytest.raises(ValueError, match="accumulate=True needs `out`"):
        kernels.general_gemm(A, B, accumulate=True)
    with pytest.raises(ValueError, match="bias_grad=True without gelu_input .* layout 'TN'"):
        kernels.general_gemm(A, B, bias_grad=True)
    with pytest.raises(ValueError, match="bias .* and bias_grad=True .* are exclusive"):
        kernels.general_gemm(randn((32, 16), torch.bfloat16, device), randn((32, 8), torch.bfloat16, device),
                         layout="NT", bias=randn((16,), torch.bfloat16, device), bias_grad=True)
    with pytest.raises(ValueError, match="bias has shape"):
        kernels.general_gemm(A, B, bias=randn((15,), torch.bfloat16, device))
    A8, A_si = fp8_operand((16, 32), "e4m3", device, 1)
    B8, _ = fp8_operand((16, 32), "e4m3", device, 2)
    with pytest.raises(ValueError, match="B_scale_inv is required"):
        kernels.general_gemm(A8, B8, A_scale_inv=A_si)
    E5, E5_si = fp8_operand((16, 32), "e5m2", device, 3)
    with pytest.raises(NotImplementedError, match="e5m2 x float8_e5m2"):
        kernels.general_gemm(E5, E5, A_scale_inv=E5_si, B_scale_inv=E5_si)
    with pytest.raises(ValueError, match="out_scale is required"):
        kernels.general_gemm(A8, B8, native.fp8_dtype("e4m3", device), A_scale_inv=A_si, B_scale_inv=A_si)
    with pytest.raises(ValueError, match="bias_grad=True without gelu_input .*float8"):
        kernels.general_gemm(A8, B8, layout="NT", A_scale_inv=A_si, B_scale_inv=A_si, bias_grad=True)


# ----- native only: C API errors through the binding, graph capture ---------------------------

@requires_native_gpu
def test_native_refuses_fp8_odd_dims_and_accumulate_into_fp8():
    mod = native.native_for_torch()
    A8, A_si = fp8_operand((24, 32), "e4m3", "cuda", 1)
    B8, B_si = fp8_operand((16, 32), "e4m3", "cuda", 2)
    out = torch.empty((16, 24), dtype=torch.bfloat16, device="cuda")
    ws = gemm_mod.gemm_workspace(torch.device("cuda"))
    stream = native.stream_of(A8)
    with pytest.raises(ValueError, match="nvte_gemm: FP8 GEMM needs m, n and k to be multiples of 16"):
        mod.gemm(native.describe(A8, scale_inv=A_si), True, native.describe(B8, scale_inv=B_si),
                 False, native.describe(out), None, None, 0, 1.0, 0.0, True, ws.data_ptr(),
                 ws.numel(), stream)
    A8, A_si = fp8_operand((32, 32), "e4m3", "cuda", 1)
    out8 = torch.empty((16, 32), dtype=torch.float8_e4m3fn, device="cuda")
    one = torch.ones(1, device="cuda")
    with pytest.raises(ValueError, match="accumulates into D"):
        mod.gemm(native.describe(A8, scale_inv=A_si), True, native.describe(B8, scale_inv=B_si),
                 False, native.describe(out8, scale=one), None, None, 0, 1.0, 1.0, True,
                 ws.data_ptr(), ws.numel(), stream)


@requires_native_gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gemm_cuda_graph_capture(fp8):
    """Captured GEMMs (with an epilogue) replay to the eager result: no host sync, no allocation
    by the library, descriptors reused."""
    m, n, k = 256, 128, 192
    if fp8:
        A, A_si, B, B_si = fp8_case("cuda", "TN", m, n, k, ("e4m3", "e4m3"), seed=4)
    else:
        A, B = operands("TN", m, n, k, torch.bfloat16, "cuda", 4)
        A_si = B_si = None
    bias = randn((m,), torch.bfloat16, "cuda", seed=5)

    def call():
        return kernels.general_gemm(A, B, torch.bfloat16, layout="TN", A_scale_inv=A_si,
                                B_scale_inv=B_si, bias=bias, gelu=True)
    eager = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        call()  # warm the plan cache outside capture, as frameworks do
        with torch.cuda.graph(graph):
            captured = call()
    torch.cuda.current_stream().wait_stream(stream)
    captured.out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.out, eager.out)
    assert torch.equal(captured.gelu_input, eager.gelu_input)


@requires_native_gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gemm_first_call_under_capture(fp8):
    """A plan first met inside graph capture is not tuned there (tuning times candidates and
    waits on events, which capture forbids): the capture succeeds and replays to the product.
    The next uncaptured call tunes the plan and may pick another algorithm, so the two results
    agree to the output's rounding, not bit for bit. The shape is used by no other test, so the
    plan is new, and large enough (2mnk > 3e10) to be tuned."""
    m, n, k = 2576, 2560, 2576
    if fp8:
        A, A_si, B, B_si = fp8_case("cuda", "TN", m, n, k, ("e4m3", "e4m3"), seed=6)
    else:
        A, B = operands("TN", m, n, k, torch.bfloat16, "cuda", 6)
        A_si = B_si = None

    def call():
        return kernels.general_gemm(A, B, torch.bfloat16, layout="TN", A_scale_inv=A_si,
                                B_scale_inv=B_si).out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        gemm_mod.gemm_workspace(A.device)  # made outside capture, as in use
        with torch.cuda.graph(graph):
            captured = call()
    torch.cuda.current_stream().wait_stream(stream)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    eager = call()  # tunes the plan, then runs the chosen algorithm
    t = tols(torch.bfloat16)
    torch.testing.assert_close(captured.float(), eager.float(), rtol=2 * t["rtol"],
                               atol=2 * t["rtol"] * float(eager.float().abs().max()))
    assert torch.equal(call(), eager)  # tuned once: later calls repeat the same algorithm


@requires_native_gpu
def test_gemm_first_call_of_a_thread_under_capture():
    """A thread whose first GEMM ever is captured makes its cuBLASLt handle inside a capture of
    torch's default (global) mode: the capture succeeds and replays to the eager product, bit
    for bit (a small shape keeps the heuristic's first choice on both threads)."""
    m, n, k = 256, 128, 192
    A, B = operands("TN", m, n, k, torch.bfloat16, "cuda", 7)
    eager = kernels.general_gemm(A, B, torch.bfloat16, layout="TN").out
    got = {}

    def on_new_thread():
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                gemm_mod.gemm_workspace(A.device)  # made outside capture, as in use
                with torch.cuda.graph(graph, stream=stream):
                    out = kernels.general_gemm(A, B, torch.bfloat16, layout="TN").out
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            got["out"] = out.clone()
        except BaseException as e:  # reported on the test's thread
            got["error"] = e
    worker = threading.Thread(target=on_new_thread)
    worker.start()
    worker.join()
    assert "error" not in got, repr(got.get("error"))
    assert torch.equal(got["out"], eager)


@requires_native_gpu
def test_gemm_workspace_per_stream():
    """GEMMs on two streams may run at the same time, so each (device, stream) has its own
    workspace (one shared buffer let them overwrite each other's scratch); the cache keeps at
    most _MAX_WORKSPACES of them, and GEMMs issued concurrently on side streams equal the
    current stream's."""
    dev = torch.device("cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    main_ws = gemm_mod.gemm_workspace(dev)
    with torch.cuda.stream(s1):
        ws1 = gemm_mod.gemm_workspace(dev)
    with torch.cuda.stream(s2):
        ws2 = gemm_mod.gemm_workspace(dev)
    assert len({main_ws.data_ptr(), ws1.data_ptr(), ws2.data_ptr()}) == 3
    with torch.cuda.stream(s1):
        assert gemm_mod.gemm_workspace(dev).data_ptr() == ws1.data_ptr()  # made once per stream
    # a small output and a long reduction: the libraries' split-K kernels use the workspace
    A, B = operands("TN", 256, 128, 16384, torch.bfloat16, "cuda", 8)
    want = kernels.general_gemm(A, B, layout="TN").out
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(8):
        for s in (s1, s2):
            with torch.cuda.stream(s):
                outs.append(kernels.general_gemm(A, B, layout="TN").out)
    torch.cuda.synchronize()
    for got in outs:
        assert torch.equal(got, want)
    extra = [torch.cuda.Stream() for _ in range(gemm_mod._MAX_WORKSPACES + 2)]
    for s in extra:
        with torch.cuda.stream(s):
            gemm_mod.gemm_workspace(dev)
    assert len(gemm_mod._WORKSPACES) <= gemm_mod._MAX_WORKSPACES
