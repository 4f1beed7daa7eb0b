"""The float64 model of general_gemm's maths and the tolerance it is held to (see test_gemm.py's
docstring), shared by the GEMM test files."""
import math

import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels import gemm as gemm_mod
from utils import randn, tols

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
