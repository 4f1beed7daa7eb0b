"""The fused FP8 Linear step (LinearFp8Plan, csrc/bindings/linear_step.cpp) against the checked
ops, bit for bit: the forward's casts of x and W (data, transposes, scale_invs, the amaxes it
records) and its GEMM with the bias; the backward's cast of dy with the bias gradient, dgrad and
wgrad; once with the operands in the plan's kept buffer, once given as tensors (a forward that
did not run the plan). Runs where the native library serves the tensors: a GPU, or the emulated
AMD build's CPU tensors; the reference backend has no plan."""
import pytest
import torch

from transformer_engine.pytorch import kernels, native
from transformer_engine.pytorch.kernels.cast import fp8_max_of
from utils import DEVICES, randn

C = native.DTYPE_CODE
BF16 = torch.bfloat16


def _native_or_skip(device):
    if not native.use_native(torch.empty(1, device=device)):
        pytest.skip(f"the native library does not serve {device} tensors here (reference backend)")
    if native.capability(torch.device(device)).fp8_flavor is None:
        pytest.skip(f"no FP8 on {device}")
    return native.native_for_torch()


def _buffer(nbytes, device):
    """A zeroed uint8 buffer whose start is 256-byte aligned (as the caching allocator's are)."""
    raw = torch.zeros(nbytes + 512, dtype=torch.uint8, device=device)
    off = (-raw.data_ptr()) % 256
    return raw[off:off + nbytes]


def _scaling(n, fp8, device, seed):
    """A scaling state of n slots with scales in [0.5, 1.5): ((history, scale, every tensor the
    pointers address, kept alive by the caller), pointer tuple)."""
    g = torch.Generator().manual_seed(seed)
    hist = torch.zeros(1, n, device=device)
    scale = (torch.rand(n, generator=g) + 0.5).to(device)
    sinv = torch.ones(n, device=device)
    counter = torch.zeros(2, dtype=torch.int32, device=device)
    skipped = torch.zeros(n, dtype=torch.int32, device=device)
    return (hist, scale, (sinv, counter, skipped)), (
        hist.data_ptr(), scale.data_ptr(), sinv.data_ptr(), float(fp8_max_of(fp8)),
        counter.data_ptr(), skipped.data_ptr())


def _view(buf, region, fp8):
    _, offset, shape, code = region
    dtype = torch.float32 if code == C[torch.float32] else fp8
    n = torch.Size(shape).numel() * dtype.itemsize
    return buf[offset:offset + n].view(dtype).view(shape)


def _bits(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("delayed", [True, False], ids=["delayed", "current"])
@pytest.mark.parametrize("kept_operands", [True, False], ids=["kept", "given"])
def test_linear_fp8_plan_matches_checked_ops(device, delayed, kept_operands):
    """Delayed scaling: the state's scales, amaxes recorded. Current scaling: the plan computes
    each scale (fp8_max / amax of the tensor) before its cast; the checked ops then cast with
    those scales."""
    mod = _native_or_skip(device)
    fwd, bwd = native.fp8_dtype("e4m3", device), native.fp8_dtype("e5m2", device)
    tokens, fin, fout = 48, 80, 32
    x = randn((tokens, fin), BF16, device, seed=81, scale=2.0)
    w = randn((fout, fin), BF16, device, seed=82)
    b = randn((fout,), BF16, device, seed=83)
    dy = randn((tokens, fout), BF16, device, seed=84)
    (hist_f, scale_f, _keep_f), sf = _scaling(2, fwd, device, 85)
    (hist_b, scale_b, _keep_b), sb = _scaling(1, bwd, device, 86)
    plan = mod.LinearFp8Plan(tokens, fin, fout, C[BF16], C[BF16], C[fwd], C[fwd], C[bwd], True,
                             True, True, C[BF16], delayed, sf, sb)
    ws = _buffer(1 << 22, device)
    env = (ws.data_ptr(), ws.numel(), native.stream_handle(None) if device == "cuda" else 0)
    kept = _buffer(plan.kept_bytes, device)
    fs = _buffer(plan.forward_scratch_bytes, device)
    bs = _buffer(plan.backward_scratch_bytes, device)
    y = torch.full((tokens, fout), float("nan"), dtype=BF16, device=device)
    plan.forward(x.data_ptr(), w.data_ptr(), 0, kept.data_ptr(), fs.data_ptr(), y.data_ptr(),
                 b.data_ptr(), 0, env)
    if not delayed:
        fmax = torch.tensor(float(fp8_max_of(fwd)), device=device)
        want_scale = torch.stack([fmax / x.float().abs().max(), fmax / w.float().abs().max()])
        assert torch.equal(scale_f, want_scale)
    # the checked ops with the same scales
    amax = torch.zeros(2, device=device)
    xq, xq_t, x_sinv = kernels.cast_transpose(x, scale_f[0:1].clone(), fwd, amax[0:1])
    wq, wq_t, w_sinv = kernels.cast_transpose(w, scale_f[1:2].clone(), fwd, amax[1:2])
    want_y = kernels.general_gemm(wq, xq, BF16, layout="TN", A_scale_inv=w_sinv,
                                  B_scale_inv=x_sinv, bias=b).out
    r = plan.regions
    for name, buf, want in (("xq", fs, xq), ("wq", fs, wq), ("x_t", kept, xq_t),
                            ("w_t", kept, wq_t), ("x_sinv", kept, x_sinv),
                            ("w_sinv", kept, w_sinv)):
        assert torch.equal(_bits(_view(buf, r[name], fwd)), _bits(want)), name
    assert torch.equal(y, want_y)
    if delayed:
        assert torch.equal(hist_f[0], amax)  # delayed scaling records both amaxes
    dx = torch.full((tokens, fin), float("nan"), dtype=BF16, device=device)
    dw = torch.full((fout, fin), float("nan"), dtype=BF16, device=device)
    db = torch.full((fout,), float("nan"), dtype=BF16, device=device)
    if kept_operands:
        operands = (kept.data_ptr(), 0, 0, 0, 0)
    else:  # the same operands as separate tensors
        operands = (0, xq_t.data_ptr(), x_sinv.data_ptr(), wq_t.data_ptr(), w_sinv.data_ptr())
    plan.backward(dy.data_ptr(), *operands, bs.data_ptr(), dx.data_ptr(), dw.data_ptr(), C[BF16],
                  0.0, db.data_ptr(), env, None)
    if not delayed:
        fmax = torch.tensor(float(fp8_max_of(bwd)), device=device)
        assert torch.equal(scale_b, (fmax / dy.float().abs().max()).reshape(1))
    amax_b = torch.zeros(1, device=device)
    dyq, dyq_t, want_db, dy_sinv = kernels.cast_transpose_dbias(dy, scale_b.clone(), bwd, amax_b,
                                                                dbias_dtype=BF16)
    want_dx = kernels.general_gemm(wq_t, dyq, BF16, layout="TN", A_scale_inv=w_sinv,
                                   B_scale_inv=dy_sinv).out
    want_dw = kernels.general_gemm(xq_t, dyq_t, BF16, layout="TN", A_scale_inv=x_sinv,
                                   B_scale_inv=dy_sinv, use_split_accumulator=True).out
    assert torch.equal(_bits(_view(bs, r["dyq"], bwd)), _bits(dyq))
    assert torch.equal(_bits(_view(bs, r["dyq_t"], bwd)), _bits(dyq_t))
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw) and torch.equal(db, want_db)
    if delayed:
        assert torch.equal(hist_b[0], amax_b)
