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
import math

import pytest
import torch

from transformer_engine.pytorch import kernels, native
from transformer_engine.pytorch.kernels import gemm as gemm_mod
from utils import DEVICES, randn, requires_native_gpu, stable_seed, tols

HP = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["TN", "NN", "NT"]
EPILOGUES = ["none", "bias", "gelu", "bias_gelu", "dgelu", "dgelu_bgrad"]
# (m, n, k): odd sizes (and m % 8 != 0, which cuBLASLt cannot fuse with a GELU aux buffer, so
# the portable epilogue runs) and multiples of 16 (the fused library epilogues).
HP_SHAPES = [(37, 29, 23), (64, 48, 80)]


def acc_eps(fp8=False):
    # Hopper's FP8 tensor cores accumulate in fewer bits than fp32 (promoted to fp32 only every
    # few k-blocks without fast accumulation, never with it).
    return 2.0 ** -10 if fp8 else 2.0 ** -21


def assert_gemm_close(got, ref, absprod, dtype, fp8=False, what="out", extra=None):
    """|got - ref| <= atol + rtol |ref| + 8 eps_acc (|B| @ |A|) (+ extra), elementwise."""
    t = tols(dtype)
    got = got.detach().cpu().double().reshape(ref.shape)
    bound = t["atol"] + t["rtol"] * ref.abs() + 8 * acc_eps(fp8) * absprod
    if extra is not None:
        bound = bound + extra
    err = (got - ref).abs()
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())}/{bad.numel()} elements off; worst "
                           f"err {float((err - bound).max()):.3g} over the bound, "
                           f"e.g. got {float(got[bad][0]):.6g} want {float(ref[bad][0]):.6g}")


def operands(layout, m, n, k, dtype, device, seed):
    """Row-major A and B for a layout: A is [m, k] when transposed else [k, m]; B [k, n] or [n, k]."""
    a_shape = (m, k) if layout[0] == "T" else (k, m)
    b_shape = (k, n) if layout[1] == "T" else (n, k)
    return (randn(a_shape, dtype, device, seed=seed), randn(b_shape, dtype, device, seed=seed + 1))


def model(A, B, layout, *, A_si=None, B_si=None, alpha=1.0, acc=None, bias=None, gelu=False,
          gelu_input=None):
    """float64 reference: (result, pre-GELU value, |B| @ |A| and the summands' magnitude for the
    error bound)."""
    a = A.cpu().double() * (float(A_si) if A_si is not None else 1.0)
    b = B.cpu().double() * (float(B_si) if B_si is not None else 1.0)
    a = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
    b = b.reshape(math.prod(b.shape[:-1]), b.shape[-1])
    op_a = a.t() if layout[0] == "T" else a
    op_b = b.t() if layout[1] == "T" else b
    r = alpha * (op_b @ op_a)
    absprod = op_b.abs() @ op_a.abs() * abs(alpha)
    summands = r.abs()
    if acc is not None:
        r = r + acc.cpu().double().reshape(r.shape)
        summands = summands + acc.cpu().double().reshape(r.shape).abs()
    if bias is not None:
        r = r + bias.cpu().double().reshape(1, -1)
        summands = summands + bias.cpu().double().reshape(1, -1).abs()
    pre = r
    if gelu:
        r = gemm_mod.gelu_tanh(r)
    if gelu_input is not None:
        r = r * gemm_mod.dgelu_tanh(gelu_input.cpu().double().reshape(r.shape))
    return r, pre, absprod, summands


def run_case(device, layout, m, n, k, in_dtype, out_dtype, epilogue, accumulate, seed=0,
             A=None, B=None, A_si=None, B_si=None, fast_accum=False, addend=False):
    """One general_gemm call against the model. addend=True: a random tensor of out's shape and
    dtype added through general_gemm(addend=...) (the same r as accumulate=True, but out is a new
    tensor and the addend is only read)."""
    if A is None:
        A, B = operands(layout, m, n, k, in_dtype, device, seed)
    side = out_dtype
    kwargs = dict(layout=layout, A_scale_inv=A_si, B_scale_inv=B_si,
                  use_split_accumulator=not fast_accum)
    bias = gelu_input = acc0 = None
    if epilogue in ("bias", "bias_gelu"):
        bias = randn((m,), side, device, seed=seed + 2)
        kwargs["bias"] = bias
    if epilogue in ("gelu", "bias_gelu"):
        kwargs["gelu"] = True
    if epilogue in ("dgelu", "dgelu_bgrad"):
        gelu_input = randn((n, m), side, device, seed=seed + 3, scale=2.0)
        kwargs["gelu_input"] = gelu_input
        kwargs["bias_grad"] = epilogue == "dgelu_bgrad"
    if epilogue == "bgradb":
        kwargs["bias_grad"] = True
    if accumulate:
        acc0 = randn((n, m), out_dtype, device, seed=seed + 4)
        kwargs["out"] = acc0.clone()
        kwargs["accumulate"] = True
    if addend:
        acc0 = randn((n, m), out_dtype, device, seed=seed + 5, scale=2.0)
        kwargs["addend"] = acc0.clone()
    res = kernels.general_gemm(A, B, out_dtype, **kwargs)
    if addend:
        assert torch.equal(kwargs["addend"], acc0), "the addend was written"
        assert res.out.data_ptr() != kwargs["addend"].data_ptr() or res.out.numel() == 0
    ref, pre, absprod, summands = model(A, B, layout, A_si=A_si, B_si=B_si, acc=acc0, bias=bias,
                                        gelu=epilogue in ("gelu", "bias_gelu"),
                                        gelu_input=gelu_input)
    fp8 = A_si is not None
    rounding = 1.13 * tols(out_dtype)["rtol"] * summands  # |gelu'| <= 1.13
    extra = rounding + (5e-3 * pre.abs() if epilogue != "none" and "gelu" in epilogue else 0.0)
    assert res.out.shape == (n, m) and res.out.dtype == out_dtype and res.out.device.type == device
    if accumulate:
        assert res.out.data_ptr() == kwargs["out"].data_ptr()
    assert_gemm_close(res.out, ref, absprod, out_dtype, fp8, extra=extra)
    if epilogue in ("gelu", "bias_gelu"):
        assert res.gelu_input is not None and res.gelu_input.shape == (n, m)
        assert_gemm_close(res.gelu_input, pre, absprod, res.gelu_input.dtype, fp8, "gelu_input",
                          extra=rounding)
    else:
        assert res.gelu_input is None
    if epilogue == "dgelu_bgrad":
        # The library may sum D before or after rounding it to out_dtype: allow both.
        d_rounding = 0.5 * tols(out_dtype)["rtol"] * ref.abs().sum(0)
        assert_gemm_close(res.bias_grad, ref.sum(0), absprod.sum(0), res.bias_grad.dtype,
                          fp8, "bias_grad", extra=d_rounding + extra.sum(0))
    elif epilogue == "bgradb":  # op_b(B) = B.T ([k, n] row-major) summed over k: B's column sums
        b = B.cpu().double().reshape(k, n)
        assert res.bias_grad.shape == (n,) and res.bias_grad.dtype == out_dtype
        assert_gemm_close(res.bias_grad, b.sum(0), b.abs().sum(0), out_dtype, fp8, "bias_grad")
    else:
        assert res.bias_grad is None
    return res


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


# ----- native only: the addend through the binding, a tuned plan and the modules' direct path -----

@requires_native_gpu
def test_native_gemm_with_c_errors_name_op():
    """The C API's own checks (the binding's c argument): shape, dtype, overlap with D."""
    mod = native.native_for_torch()
    A = randn((32, 64), torch.bfloat16, "cuda", seed=1)
    B = randn((16, 64), torch.bfloat16, "cuda", seed=2)
    out = torch.empty((16, 32), dtype=torch.bfloat16, device="cuda")
    ws = gemm_mod.gemm_workspace(torch.device("cuda"))
    stream = native.stream_of(A)

    def call(c, d=out):
        mod.gemm(native.describe(A), True, native.describe(B), False, native.describe(d), None,
                 None, 0, 1.0, 1.0, False, ws.data_ptr(), ws.numel(), stream, native.describe(c))
    with pytest.raises(ValueError, match=r"nvte_gemm_with_c: C has shape \[16, 31\]; expected "
                                         r"D's shape \[16, 32\]"):
        call(torch.empty((16, 31), dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="nvte_gemm_with_c: C has dtype float16; expected bfloat16"):
        call(torch.empty((16, 32), dtype=torch.float16, device="cuda"))
    big = torch.empty((17, 32), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="nvte_gemm_with_c: C overlaps D"):
        call(big[1:], big[:16])


@requires_native_gpu
def test_gemm_addend_tuned_plan():
    """A plan large enough to be tuned (2mnk > 3e10): with a distinct C the candidates are timed
    (repeated runs overwrite D and only read C), and the result is still product + addend, the
    addend untouched; later calls repeat the tuned algorithm bit for bit. The shape is used by no
    other test."""
    m, n, k = 2560, 2576, 2560
    A, B = operands("TN", m, n, k, torch.bfloat16, "cuda", 41)
    R = randn((n, m), torch.bfloat16, "cuda", seed=43, scale=4.0)
    R0 = R.clone()
    first = kernels.general_gemm(A, B, layout="TN", addend=R).out
    torch.cuda.synchronize()
    assert torch.equal(R, R0)
    plain = kernels.general_gemm(A, B, layout="TN", out_dtype=torch.float32).out
    want = plain + R.float()
    t = tols(torch.bfloat16)
    torch.testing.assert_close(first.float(), want, rtol=2 * t["rtol"],
                               atol=2 * t["rtol"] * float(want.abs().max()))
    for _ in range(2):
        assert torch.equal(kernels.general_gemm(A, B, layout="TN", addend=R).out, first)


@requires_native_gpu
@pytest.mark.parametrize("bias", [False, True])
def test_fast_gemm_addend(bias):
    """gemm_unchecked(addend=...): the modules' eager native call, same result as general_gemm."""
    from transformer_engine.pytorch.kernels.eager import native_call
    m, n, k = 64, 48, 80
    W = randn((m, k), torch.bfloat16, "cuda", seed=51)
    X = randn((n, k), torch.bfloat16, "cuda", seed=52)
    R = randn((n, m), torch.bfloat16, "cuda", seed=53)
    b = randn((m,), torch.bfloat16, "cuda", seed=54) if bias else None
    nc = native_call(X)
    out = torch.full((n, m), float("nan"), dtype=torch.bfloat16, device="cuda")
    kernels.gemm.gemm_unchecked(nc, W, True, X, False, out, bias=b, addend=R)
    want = kernels.general_gemm(W, X, layout="TN", bias=b, addend=R).out
    assert torch.equal(out, want)
    ref, _, absprod, summands = model(W, X, "TN", acc=R, bias=b)
    assert_gemm_close(out, ref, absprod, torch.bfloat16,
                      extra=1.13 * tols(torch.bfloat16)["rtol"] * summands)
    with pytest.raises(ValueError, match="gemm_unchecked: addend and beta=1.0"):
        kernels.gemm.gemm_unchecked(nc, W, True, X, False, out, beta=1.0, addend=R)


@requires_native_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("bias", [False, True])
def test_linear_hp_forward_residual(dtype, bias):
    """linear_hp_forward(..., residual, env): y = x W^T (+ b) + residual in the one GEMM, equal to
    the call without a residual plus the residual (to the output's rounding)."""
    from transformer_engine.pytorch.kernels.eager import native_call
    tokens, fin, fout = 48, 64, 96
    x = randn((tokens, fin), dtype, "cuda", seed=61)
    w = randn((fout, fin), dtype, "cuda", seed=62)
    r = randn((tokens, fout), dtype, "cuda", seed=63, scale=4.0)
    b = randn((fout,), dtype, "cuda", seed=64) if bias else None
    r0 = r.clone()
    nc = native_call(x)
    code = native.DTYPE_CODE[dtype]
    ys = []
    for res in (0, r.data_ptr()):
        y = torch.full((tokens, fout), float("nan"), dtype=dtype, device="cuda")
        nc.mod.linear_hp_forward(x.data_ptr(), tokens, fin, w.data_ptr(), fout, code, y.data_ptr(),
                                 b.data_ptr() if b is not None else 0, code, res, nc.env)
        ys.append(y)
    torch.cuda.synchronize()
    y_plain, y_res = ys
    assert torch.equal(r, r0)
    ref, _, absprod, summands = model(w, x, "TN", acc=r, bias=b)
    assert_gemm_close(y_res, ref, absprod, dtype, extra=1.13 * tols(dtype)["rtol"] * summands)
    t = tols(dtype)
    want = y_plain.double() + r.double()
    torch.testing.assert_close(y_res.double(), want, rtol=2 * t["rtol"],
                               atol=t["atol"] + 2 * t["rtol"] * float(want.abs().max()))


def _fp8_plan(nc, tokens, fin, fout, fp8, scaling, **flags):
    """A LinearFp8Plan of a bf16 step whose forward casts W (delayed scaling, both directions on
    the same scaling tensors)."""
    code = native.DTYPE_CODE
    kw = dict(fresh_w=True, need_dgrad=False, need_wgrad=False, dbias_dtype=-1)
    kw.update(flags)
    return nc.mod.LinearFp8Plan(tokens, fin, fout, code[torch.bfloat16], code[torch.bfloat16],
                                code[fp8], code[fp8], code[fp8], kw["fresh_w"], kw["need_dgrad"],
                                kw["need_wgrad"], kw["dbias_dtype"], True, scaling, scaling)


def _region(buf, region, fp8):
    _, offset, shape, code = region
    dtype = torch.float32 if code == native.DTYPE_CODE[torch.float32] else fp8
    n = math.prod(shape) * dtype.itemsize
    return buf[offset:offset + n].view(dtype).view(shape)


def _unit_scaling(dev, fp8):
    """Delayed-scaling state of two slots with scale 1: (tensors kept alive, scaling tuple)."""
    hist = torch.zeros((1, 2), device=dev)
    scale = torch.ones(2, device=dev)
    scale_inv = torch.ones(2, device=dev)
    counter = torch.zeros(2, dtype=torch.int32, device=dev)
    return (hist, scale, scale_inv, counter), (hist.data_ptr(), scale.data_ptr(),
                                               scale_inv.data_ptr(),
                                               float(gemm_mod.fp8_max_of(fp8)), counter.data_ptr())


@requires_native_gpu
@pytest.mark.parametrize("bias", [False, True])
def test_linear_fp8_forward_residual(bias):
    """LinearFp8Plan.forward(..., residual, env): x and W cast to E4M3 (delayed scaling, scale 1),
    y = xq wq^T (+ b) + residual in the one FP8 GEMM, equal to the call without a residual plus
    the residual (to bf16 rounding)."""
    from transformer_engine.pytorch.kernels.eager import native_call
    tokens, fin, fout = 32, 64, 48
    dev = "cuda"
    if native.capability(torch.device(dev)).fp8_flavor is None:
        pytest.skip("no FP8 on this device")
    fp8 = native.fp8_dtype("e4m3", dev)
    x = randn((tokens, fin), torch.bfloat16, dev, seed=71)
    w = randn((fout, fin), torch.bfloat16, dev, seed=72)
    r = randn((tokens, fout), torch.bfloat16, dev, seed=73, scale=4.0)
    b = randn((fout,), torch.bfloat16, dev, seed=74) if bias else None
    r0 = r.clone()
    _state, scaling = _unit_scaling(dev, fp8)
    nc = native_call(x)
    plan = _fp8_plan(nc, tokens, fin, fout, fp8, scaling)
    ys = []
    for res in (0, r.data_ptr()):
        kept = torch.empty(plan.kept_bytes, dtype=torch.uint8, device=dev)
        scratch = torch.empty(plan.forward_scratch_bytes, dtype=torch.uint8, device=dev)
        y = torch.full((tokens, fout), float("nan"), dtype=torch.bfloat16, device=dev)
        plan.forward(x.data_ptr(), w.data_ptr(), 0, kept.data_ptr(), scratch.data_ptr(),
                     y.data_ptr(), b.data_ptr() if b is not None else 0, res, nc.env)
        ys.append((y, _region(scratch, plan.regions["xq"], fp8).clone(),
                   _region(scratch, plan.regions["wq"], fp8).clone()))
        torch.cuda.synchronize()
    (y_plain, xq, wq), (y_res, _, _) = ys
    assert torch.equal(r, r0)
    assert torch.equal(xq, x.to(fp8)) and torch.equal(wq, w.to(fp8))  # scale 1: plain casts
    ref, _, absprod, summands = model(wq.float(), xq.float(), "TN", acc=r, bias=b)
    assert_gemm_close(y_res, ref, absprod, torch.bfloat16, fp8=True,
                      extra=1.13 * tols(torch.bfloat16)["rtol"] * summands)
    t = tols(torch.bfloat16)
    want = y_plain.double() + r.double()
    torch.testing.assert_close(y_res.double(), want, rtol=2 * t["rtol"],
                               atol=t["atol"] + 2 * t["rtol"] * float(want.abs().max()))


@requires_native_gpu
@pytest.mark.parametrize("need_dgrad,need_wgrad,dbias", [(True, True, True), (True, False, False),
                                                         (False, True, False)])
def test_linear_fp8_plan_layout(need_dgrad, need_wgrad, dbias):
    """The plan's arenas: every region on a 256-byte boundary, inside its arena, apart from the
    others, and present exactly when the step needs it; arguments it cannot serve raise
    ValueError naming LinearFp8Plan."""
    from transformer_engine.pytorch.kernels.eager import native_call
    dev = "cuda"
    if native.capability(torch.device(dev)).fp8_flavor is None:
        pytest.skip("no FP8 on this device")
    fp8 = native.fp8_dtype("e4m3", dev)
    _state, scaling = _unit_scaling(dev, fp8)
    nc = native_call(torch.empty(1, device=dev))
    tokens, fin, fout = 48, 80, 112
    plan = _fp8_plan(nc, tokens, fin, fout, fp8, scaling, need_dgrad=need_dgrad,
                     need_wgrad=need_wgrad,
                     dbias_dtype=native.DTYPE_CODE[torch.bfloat16] if dbias else -1)
    regions = plan.regions
    want = {"x_sinv", "w_sinv", "xq", "wq", "dyq", "dy_sinv"}
    want |= {"x_t", "dyq_t"} if need_wgrad else set()
    want |= {"w_t"} if need_dgrad else set()
    want |= {"dbias_ws"} if dbias else set()
    assert set(regions) == want
    sizes = {"kept": plan.kept_bytes, "forward_scratch": plan.forward_scratch_bytes,
             "backward_scratch": plan.backward_scratch_bytes}
    spans = {}
    for name, (arena, offset, shape, code) in regions.items():
        nbytes = math.prod(shape) * (4 if code == native.DTYPE_CODE[torch.float32] else 1)
        assert offset % 256 == 0 and offset + nbytes <= sizes[arena], name
        spans.setdefault(arena, []).append((offset, offset + nbytes))
    for arena, s in spans.items():
        s.sort()
        assert all(a[1] <= b[0] for a, b in zip(s, s[1:])), (arena, s)
    if need_wgrad:
        assert regions["x_t"][2] == (fin, tokens) and regions["dyq_t"][2] == (fout, tokens)
    if need_dgrad:
        assert regions["w_t"][2] == (fin, fout)
    with pytest.raises(ValueError, match="LinearFp8Plan: tokens, in_features and out_features"):
        _fp8_plan(nc, 0, fin, fout, fp8, scaling)
    with pytest.raises(ValueError, match="LinearFp8Plan: dbias_dtype .* needs need_wgrad"):
        _fp8_plan(nc, tokens, fin, fout, fp8, scaling,
                  dbias_dtype=native.DTYPE_CODE[torch.bfloat16])
    with pytest.raises(ValueError, match="LinearFp8Plan: dx needs a plan made with need_dgrad"):
        p = _fp8_plan(nc, tokens, fin, fout, fp8, scaling)
        p.backward(256, 0, 0, 256, 0, 0, 256, 256, 0, 0, 0.0, 0, nc.env, None)
