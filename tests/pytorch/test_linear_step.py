"""The fused FP8 Linear step (LinearFp8Plan, csrc/bindings/linear_step.cpp) against the checked
ops, bit for bit: the forward's casts of x and W (data, transposes, scale_invs, the amaxes it
records) and its GEMM with the bias; the backward's cast of dy with the bias gradient, dgrad and
wgrad; once with the operands in the plan's kept buffer, once given as tensors (a forward that
did not run the plan); the backward of an output gradient already in FP8. Then LayerNormLinear and
LayerNormMLP, whose FP8 backward GEMMs run through the plan, against their checked path. Runs where
the native library serves the tensors: a GPU, or the emulated AMD build's CPU tensors; the
reference backend has no plan."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import kernels, native, quantization
from transformer_engine.pytorch.kernels import eager, linear_step
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("delayed", [True, False], ids=["delayed", "current"])
@pytest.mark.parametrize("accumulate", [True, False], ids=["main_grad", "new_dw"])
def test_linear_fp8_plan_backward_of_fp8_grad_matches_checked_ops(device, delayed, accumulate):
    """backward_fp8_grad: an output gradient already in FP8 (cast by the caller) and the forward's
    operands as tensors; dgrad and wgrad are the checked GEMMs' bits, dW written or added into an
    fp32 buffer, and the plan's scaling untouched (no cast here)."""
    mod = _native_or_skip(device)
    fwd, bwd = native.fp8_dtype("e4m3", device), native.fp8_dtype("e5m2", device)
    tokens, fin, fout = 32, 48, 64
    (hist_f, scale_f, _keep_f), sf = _scaling(2, fwd, device, 91)
    (hist_b, scale_b, _keep_b), sb = _scaling(2, bwd, device, 92)
    scales = [s.clone() for s in (scale_f, scale_b)]
    xq, xq_t, x_sinv = kernels.cast_transpose(randn((tokens, fin), BF16, device, seed=93, scale=2.0),
                                              scale_f[0:1].clone(), fwd)
    wq, wq_t, w_sinv = kernels.cast_transpose(randn((fout, fin), BF16, device, seed=94),
                                              scale_f[1:2].clone(), fwd)
    dyq, dyq_t, dy_sinv = kernels.cast_transpose(randn((tokens, fout), BF16, device, seed=95),
                                                 scale_b[1:2].clone(), bwd)
    plan = mod.LinearFp8Plan(tokens, fin, fout, C[BF16], C[fwd], C[fwd], C[fwd], C[bwd], False,
                             True, True, -1, delayed, sf, sb)
    ws = _buffer(1 << 22, device)
    env = (ws.data_ptr(), ws.numel(), native.stream_handle(None) if device == "cuda" else 0)
    dx = torch.full((tokens, fin), float("nan"), dtype=BF16, device=device)
    if accumulate:
        dw = randn((fout, fin), torch.float32, device, seed=96)
        want_dw = dw.clone()
    else:
        dw = torch.full((fout, fin), float("nan"), dtype=BF16, device=device)
        want_dw = None
    plan.backward_fp8_grad(dyq.data_ptr(), dyq_t.data_ptr(), dy_sinv.data_ptr(), xq_t.data_ptr(),
                           x_sinv.data_ptr(), wq_t.data_ptr(), w_sinv.data_ptr(), dx.data_ptr(),
                           dw.data_ptr(), C[dw.dtype], 1.0 if accumulate else 0.0, env, None)
    want_dx = kernels.general_gemm(wq_t, dyq, BF16, layout="TN", A_scale_inv=w_sinv,
                                   B_scale_inv=dy_sinv).out
    want_dw = kernels.general_gemm(xq_t, dyq_t, dw.dtype, layout="TN", A_scale_inv=x_sinv,
                                   B_scale_inv=dy_sinv, out=want_dw, accumulate=accumulate,
                                   use_split_accumulator=True).out
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw)
    assert torch.equal(scale_f, scales[0]) and torch.equal(scale_b, scales[1])
    assert not hist_f.any() and not hist_b.any()
    with_db = mod.LinearFp8Plan(tokens, fin, fout, C[BF16], C[fwd], C[fwd], C[fwd], C[bwd], False,
                                True, True, C[BF16], delayed, sf, sb)
    with pytest.raises(ValueError, match="LinearFp8Plan: backward_fp8_grad needs a plan made "
                                         "without dbias_dtype"):
        with_db.backward_fp8_grad(dyq.data_ptr(), dyq_t.data_ptr(), dy_sinv.data_ptr(),
                                  xq_t.data_ptr(), x_sinv.data_ptr(), wq_t.data_ptr(),
                                  w_sinv.data_ptr(), dx.data_ptr(), dw.data_ptr(), C[dw.dtype],
                                  0.0, env, None)
    with pytest.raises(ValueError, match="LinearFp8Plan: backward_fp8_grad: dw needs dyq_t"):
        plan.backward_fp8_grad(dyq.data_ptr(), 0, dy_sinv.data_ptr(), xq_t.data_ptr(),
                               x_sinv.data_ptr(), wq_t.data_ptr(), w_sinv.data_ptr(), 0,
                               dw.data_ptr(), C[dw.dtype], 0.0, env, None)


# ----- the norm modules' FP8 steps: the eager native path against the checked ops -----------------

H, FFN, TOKENS = 64, 96, 48


def _eager_native(monkeypatch, device, mod):
    """Makes the modules take their eager native path on `device`: a GPU takes it by itself; the
    emulated AMD build's CPU tensors get a NativeCall (the modules ask for one only for CUDA
    tensors, which the emulation has none of)."""
    if device == "cpu":
        call = eager.NativeCall(mod, torch.device("cpu"))
        monkeypatch.setattr(eager, "native_call", lambda x: call if native.use_native(x) else None)


def _norm_module(kind, device, variant, seed):
    torch.manual_seed(seed)
    kw = dict(device=device, params_dtype=torch.float32 if variant == "fp32_params" else BF16,
              fuse_wgrad_accumulation=variant == "main_grad")
    if kind == "LayerNormLinear":
        m = te.LayerNormLinear(H, FFN, return_layernorm_output=variant == "ln_out", **kw)
    else:
        m = te.LayerNormMLP(H, FFN, activation=kind.split("_")[1], **kw)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(m.named_parameters())):
            p.copy_(randn(tuple(p.shape), p.dtype, device, seed=seed * 100 + i, scale=0.5)
                    + (1.0 if name == "layer_norm_weight" else 0.0))
            if variant == "main_grad" and name.endswith("weight") and "norm" not in name:
                p.main_grad = randn(tuple(p.shape), torch.float32, device, seed=seed * 100 + 50 + i)
            if variant == "frozen" and name.endswith("weight") and "norm" not in name:
                p.requires_grad_(False)
    return m


def _norm_step_results(m, x, dy, r, variant):
    """Runs a step of m (forward under r, backward outside the context as training loops do);
    returns what must match, bias gradients last."""
    xi = x.clone().requires_grad_()
    with te.fp8_autocast(fp8_recipe=r):
        out = m(xi)
    if isinstance(out, tuple):  # return_layernorm_output: its gradient joins the norm's backward
        y, ln_out = out
        torch.autograd.backward([y, ln_out], [dy, x.clone() * 0.25])
    else:
        y = out
        y.backward(dy)
    rs = m._fp8_state
    got = [y, xi.grad, rs.scale_fwd, rs.scale_bwd, rs.amax_history_fwd, rs.amax_history_bwd]
    biases = []
    for name, p in sorted(m.named_parameters()):
        if name.endswith("bias") and "norm" not in name:
            biases.append(p.grad)
        elif variant == "main_grad" and name.endswith("weight") and "norm" not in name:
            got.append(p.main_grad.clone())
        else:
            got.append(p.grad)
    m.zero_grad(set_to_none=True)
    return got, biases


NORM_CASES = [(kind, variant) for kind in ("LayerNormLinear", "LayerNormMLP_gelu",
                                           "LayerNormMLP_swiglu")
              for variant in ("plain", "main_grad", "frozen", "fp32_params")]
NORM_CASES.append(("LayerNormLinear", "ln_out"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("delayed", [True, False], ids=["delayed", "current"])
@pytest.mark.parametrize("kind,variant", NORM_CASES, ids=[f"{k}-{v}" for k, v in NORM_CASES])
def test_norm_module_fp8_steps_match_checked_ops(monkeypatch, device, delayed, kind, variant):
    """LayerNormLinear and LayerNormMLP on the eager native path (each GEMM's FP8 backward one call
    of the Linear step's plan; LayerNormMLP's FC1 on the gradient the activation's backward cast)
    give the checked ops' bits, step after step: outputs, input, weight (or main_grad) and norm
    gradients, scales and histories (the step's delayed update riding the last call). fp32
    parameters under bf16 inputs: biases and their gradients of another dtype than the compute
    dtype. Gated activations under delayed scaling too: the checked path casts dh with the fused
    kernel's checked op. Bias gradients: fp32 column sums in another order, the last bit may
    differ."""
    mod = _native_or_skip(device)
    r = (recipe.DelayedScaling(amax_history_len=3) if delayed else recipe.Float8CurrentScaling())
    mods = [_norm_module(kind, device, variant, seed=7) for _ in range(2)]
    width = FFN if kind == "LayerNormLinear" else H
    calls = []
    real_plan = linear_step.fp8_plan

    def counting_plan(*args):
        calls.append(args[2])
        return real_plan(*args)

    for step in range(3):
        x = randn((TOKENS, H), BF16, device, seed=10 + step, scale=1.5 + step)
        dy = randn((TOKENS, width), BF16, device, seed=20 + step)
        results = []
        for k, m in enumerate(mods):
            with monkeypatch.context() as mp:
                if k == 0:
                    _eager_native(mp, device, mod)
                    mp.setattr(linear_step, "fp8_plan", counting_plan)
                else:
                    mp.setattr(eager, "native_call", lambda _x: None)
                results.append(_norm_step_results(m, x, dy, r, variant))
        (got, biases), (want, want_biases) = results
        for i, (a, b) in enumerate(zip(got, want)):
            assert (a is None) == (b is None), (step, i)
            assert a is None or torch.equal(a, b), (step, i, a, b)
        for a, b in zip(biases, want_biases):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == b.dtype
                torch.testing.assert_close(a, b)
    # the native runs took the plan: one per GEMM and step
    assert len(calls) == 3 * (1 if kind == "LayerNormLinear" else 2)
    assert not quantization._DEFERRED
