"""The GEMM's addend (nvte_gemm_with_c) through the binding, a tuned plan, and the modules' direct
path: the fused Linear step's residual in high precision and FP8, and the layout of its FP8
plan's shared buffers. Native GPU only (the reference backend has no binding or plan); the maths
is checked against the float64 model of test_gemm.py."""
import math

import pytest
import torch

from transformer_engine.pytorch import kernels, native
from transformer_engine.pytorch.kernels import gemm as gemm_mod
from utils import randn, requires_native_gpu, tols
from gemm_model import assert_gemm_close, model, operands

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
