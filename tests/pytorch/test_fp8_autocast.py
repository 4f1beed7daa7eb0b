"""The FP8 machinery of the modules: autocast state, delayed-scaling update (forward at context
exit, backward after the last backward, outside the context), calibration, current scaling,
weight caching per microbatch, fused wgrad accumulation, FP8 metadata in state_dict, errors."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import quantization
from transformer_engine.pytorch.kernels.cast import fp8_max_of

from utils import DEVICES, randn, requires_native_gpu


def _linear(device, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    return te.Linear(64, 48, params_dtype=dtype, device=device, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_delayed_scaling_update_matches_model(device):
    """After one step: forward scales = fp8_max / amax of the input and weight; backward scale =
    fp8_max / amax of the output gradient; the history is rolled (row 0 cleared)."""
    m = _linear(device)
    x = randn((32, 64), torch.float32, device, seed=1, scale=3.0).requires_grad_()
    dy = randn((32, 48), torch.float32, device, seed=2, scale=0.5)
    r = recipe.DelayedScaling(amax_history_len=4)
    with te.fp8_autocast(fp8_recipe=r):
        y = m(x)
    rs = m._fp8_state
    fwd_max = torch.tensor([fp8_max_of(rs.fwd_dtype)], device=device)
    amax_x, amax_w = x.detach().abs().max().reshape(1), m.weight.detach().abs().max().reshape(1)
    assert torch.equal(rs.scale_fwd, torch.cat([fwd_max / amax_x, fwd_max / amax_w]))
    assert torch.equal(rs.scale_inv_fwd, 1.0 / rs.scale_fwd)
    assert torch.equal(rs.amax_history_fwd[0], torch.zeros(2, device=device))
    assert torch.equal(rs.amax_history_fwd[-1], torch.cat([amax_x, amax_w]))
    assert torch.equal(rs.scale_bwd, torch.ones(1, device=device))  # not before backward
    y.backward(dy)  # outside the context: uses the forward's recipe
    bwd_max = torch.tensor([fp8_max_of(rs.bwd_dtype)], device=device)
    assert torch.equal(rs.scale_bwd, bwd_max / dy.abs().max().reshape(1))
    assert rs.fwd_dtype == te.fp8_dtype("e4m3", device) and rs.bwd_dtype == te.fp8_dtype("e5m2", device)


@pytest.mark.parametrize("device", DEVICES)
def test_amax_history_max_over_steps(device):
    """amax_compute_algo='max' takes the largest amax of the history window."""
    m = _linear(device)
    r = recipe.DelayedScaling(amax_history_len=3)
    big = randn((32, 64), torch.float32, device, seed=3, scale=8.0)
    with te.autocast(recipe=r):
        m(big)
    for seed in (4, 5):
        with te.autocast(recipe=r):
            m(randn((32, 64), torch.float32, device, seed=seed, scale=0.1))
    rs = m._fp8_state
    expect = torch.tensor([fp8_max_of(rs.fwd_dtype)], device=device) / big.abs().max().reshape(1)
    assert torch.equal(rs.scale_fwd[:1], expect)
    with te.autocast(recipe=r):  # `big` leaves the 3-step window
        m(randn((32, 64), torch.float32, device, seed=6, scale=0.1))
    assert rs.scale_fwd[0] > expect[0] * 10


@pytest.mark.parametrize("device", DEVICES)
def test_calibrating_records_amax_without_fp8(device):
    m = _linear(device)
    x = randn((32, 64), torch.float32, device, seed=7)
    plain = m(x)
    with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=recipe.DelayedScaling()):
        calib = m(x)
    assert torch.equal(plain, calib)
    rs = m._fp8_state
    assert torch.equal(rs.scale_fwd[:1], torch.tensor([fp8_max_of(rs.fwd_dtype)], device=device)
                       / x.abs().max().reshape(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("power_2", [False, True])
def test_current_scaling_matches_manual_casts(device, power_2):
    """Float8CurrentScaling: each cast's scale is fp8_max/amax of that tensor, now."""
    m = _linear(device)
    x = randn((32, 64), torch.float32, device, seed=8, scale=5.0)
    r = recipe.Float8CurrentScaling(use_power_2_scales=power_2)
    with te.autocast(recipe=r):
        y = m(x)
    rs = m._fp8_state
    fmax = torch.tensor([fp8_max_of(rs.fwd_dtype)], device=device)

    def q(t):
        s = fmax / t.abs().max().reshape(1)
        if power_2:
            s = torch.exp2(torch.floor(torch.log2(s)))
        return te.kernels.quantize(t.contiguous(), s, rs.fwd_dtype)

    xq, xs = q(x)
    wq, ws = q(m.weight.detach())
    ref = te.kernels.general_gemm(wq, xq, torch.float32, layout="TN", A_scale_inv=ws, B_scale_inv=xs,
                              bias=m.bias.detach()).out
    assert torch.equal(y, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_needs_multiples_of_16(device):
    m = te.Linear(40, 48, device=device)
    with pytest.raises(ValueError, match="Linear: FP8 needs .*multiples of 16"):
        with te.fp8_autocast():
            m(randn((32, 40), torch.float32, device, seed=9))
    with pytest.raises(ValueError, match="LayerNormMLP: FP8 needs"):
        with te.fp8_autocast():
            te.LayerNormMLP(64, 128, device=device)(randn((3, 37, 64), torch.float32, device))


def test_fp8_on_gpu_without_fp8_raises(monkeypatch):
    dev = torch.device("cuda", 7)
    from transformer_engine.pytorch import fp8_support
    monkeypatch.setitem(fp8_support._SUPPORT_CACHE, 7, (False, "NVIDIA A100 (sm_80) lacks FP8 GEMM support"))
    with pytest.raises(NotImplementedError, match="Linear: FP8 autocast is enabled but NVIDIA A100 .*lacks FP8"):
        quantization.require_fp8_support(dev, "Linear")


def test_is_fp8_available_and_recipe_checks():
    ok, why = te.is_fp8_available(return_reason=True)
    assert isinstance(ok, bool) and isinstance(why, str) and (ok or why)
    assert te.is_fp8_available() is ok  # a plain bool without return_reason
    assert te.is_fp8_available(device="cpu") is True
    with pytest.raises(NotImplementedError, match="scaling_factor_compute_algo"):
        with te.autocast(recipe=recipe.DelayedScaling(scaling_factor_compute_algo=lambda *a: a[1])):
            pass
    assert isinstance(te.get_default_recipe(), recipe.DelayedScaling)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_cache_per_microbatch(device):
    """is_first_microbatch=False reuses the FP8 weight cast by the first microbatch."""
    m = _linear(device)
    x = randn((32, 64), torch.float32, device, seed=10)
    r = recipe.Float8CurrentScaling()
    with te.autocast(recipe=r):
        first = m(x, is_first_microbatch=True)
        with torch.no_grad():
            m.weight.mul_(2.0)
        cached = m(x, is_first_microbatch=False)
        fresh = m(x, is_first_microbatch=None)
    assert torch.equal(first, cached)
    assert not torch.allclose(first, fresh)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
def test_fused_wgrad_accumulation(device, fp8):
    m = _linear(device, fuse_wgrad_accumulation=True)
    plain = _linear(device)
    m.weight.main_grad = torch.zeros_like(m.weight, dtype=torch.float32)
    r = recipe.Float8CurrentScaling()
    for seed in (11, 12):
        x = randn((32, 64), torch.float32, device, seed=seed)
        for mod in (m, plain):
            with te.autocast(enabled=fp8, recipe=r):
                out = mod(x)
            out.sum().backward()
    assert m.weight.grad is None
    torch.testing.assert_close(m.weight.main_grad, plain.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip_and_legacy_load(device):
    m = te.LayerNormMLP(64, 128, device=device)
    r = recipe.DelayedScaling(amax_history_len=5)
    for seed in (13, 14):
        with te.autocast(recipe=r):
            y = m(randn((32, 64), torch.float32, device, seed=seed))
        y.sum().backward()
    sd = m.state_dict()
    assert "_extra_state" in sd and sd["_extra_state"]["amax_history_fwd"].shape == (5, 4)
    fresh = te.LayerNormMLP(64, 128, device=device)
    fresh.load_state_dict(sd)
    x = randn((32, 64), torch.float32, device, seed=15)
    with te.autocast(recipe=r):
        a, b = m(x), fresh(x)
    assert torch.equal(a, b)
    for key in ("scale_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(getattr(m._fp8_state, key), getattr(fresh._fp8_state, key))
    legacy = {k: v for k, v in sd.items() if not k.endswith("_extra_state")}
    other = te.LayerNormMLP(64, 128, device=device)
    other.load_state_dict(legacy, strict=True)  # saved without FP8 metadata: still loads
    assert torch.equal(other.fc1_weight, m.fc1_weight)


@requires_native_gpu
@pytest.mark.parametrize("rname", ["delayed", "current"])
@pytest.mark.parametrize("bias", [True, False])
def test_direct_path_matches_checked_ops(monkeypatch, rname, bias):
    """te.Linear's direct native path (one call per direction: x and W cast in one launch,
    current scales in one launch, the step's delayed update riding the last backward, the
    forward update deferred to it) gives the bits of the checked ops, step after step: outputs,
    gradients, scales and histories."""
    from transformer_engine.pytorch.kernels import eager
    r = recipe.DelayedScaling(amax_history_len=3) if rname == "delayed" else recipe.Float8CurrentScaling()
    mods = [_linear("cuda", torch.bfloat16, seed=4, bias=bias) for _ in range(2)]
    for step in range(3):
        x = randn((32, 64), torch.bfloat16, "cuda", seed=10 + step, scale=2.0 + step)
        dy = randn((32, 48), torch.bfloat16, "cuda", seed=20 + step)
        results = []
        for k, m in enumerate(mods):
            with monkeypatch.context() as mp:
                if k == 1:
                    mp.setattr(eager, "native_call", lambda _x: None)
                xi = x.clone().requires_grad_()
                with te.fp8_autocast(fp8_recipe=r):
                    y = m(xi)
                y.backward(dy)  # outside the context: the deferred forward update rides it
            rs = m._fp8_state
            results.append([y, xi.grad, m.weight.grad, rs.scale_fwd, rs.scale_bwd,
                            rs.scale_inv_fwd, rs.amax_history_fwd, rs.amax_history_bwd,
                            m.bias.grad if bias else None])
            m.zero_grad(set_to_none=True)
        for a, b in zip(results[0][:-1], results[1][:-1]):
            assert torch.equal(a, b), (step, a, b)
        if bias:  # fp32 column sums in another order (see kernels/eager.py): last bit may differ
            torch.testing.assert_close(results[0][-1], results[1][-1])
    assert not quantization._DEFERRED


@requires_native_gpu
@pytest.mark.parametrize("variant", ["microbatch", "no_dgrad", "main_grad", "checkpoint"])
@pytest.mark.parametrize("rname", ["delayed", "current"])
def test_direct_path_variants_match_checked_ops(monkeypatch, variant, rname):
    """te.Linear's direct FP8 step in its other forms gives the checked ops' bits too: the
    weight's FP8 copy cast on the first micro-batch and reused (the plan takes it as an
    operand), an input without a gradient (no dgrad), the weight gradient accumulated into an
    fp32 main_grad, and a checkpointed call (the recompute's forward on the checked ops, then
    the direct backward on the tensors it saved)."""
    from transformer_engine.pytorch.kernels import eager
    r = recipe.DelayedScaling(amax_history_len=3) if rname == "delayed" else recipe.Float8CurrentScaling()
    kw = dict(fuse_wgrad_accumulation=True) if variant == "main_grad" else {}
    mods = [_linear("cuda", torch.bfloat16, seed=6, bias=True, **kw) for _ in range(2)]
    if variant == "main_grad":
        for m in mods:
            m.weight.main_grad = randn((48, 64), torch.float32, "cuda", seed=7)
    for step in range(3):
        x = randn((48, 64), torch.bfloat16, "cuda", seed=40 + step, scale=1.5 + step)
        dy = randn((48, 48), torch.bfloat16, "cuda", seed=50 + step)
        results = []
        for k, m in enumerate(mods):
            with monkeypatch.context() as mp:
                if k == 1:
                    mp.setattr(eager, "native_call", lambda _x: None)
                xi = x.clone().requires_grad_(variant != "no_dgrad")
                with te.fp8_autocast(fp8_recipe=r):
                    if variant == "microbatch":
                        y = m(xi, is_first_microbatch=step == 0)
                    elif variant == "checkpoint":
                        y = te.checkpoint(m, xi)
                    else:
                        y = m(xi)
                y.backward(dy)
            rs = m._fp8_state
            grad = m.weight.main_grad.clone() if variant == "main_grad" else m.weight.grad
            results.append([y, xi.grad if variant != "no_dgrad" else None, grad, rs.scale_fwd,
                            rs.scale_bwd, rs.amax_history_fwd, rs.amax_history_bwd, m.bias.grad])
            m.zero_grad(set_to_none=True)
        assert (results[0][1] is None) == (variant == "no_dgrad")
        for a, b in zip(results[0][:-1], results[1][:-1]):
            assert (a is None and b is None) or torch.equal(a, b), (variant, step, a, b)
        # fp32 column sums in another order (see kernels/eager.py): last bit may differ
        torch.testing.assert_close(results[0][-1], results[1][-1])
    assert not quantization._DEFERRED


@requires_native_gpu
def test_deferred_forward_update_is_flushed_before_reads_and_next_step():
    """A step whose backward has not run yet: its forward update is visible to a read of the
    scales and runs before the next step; the next step's own deferred update rides the
    backward."""
    m = _linear("cuda", torch.bfloat16, seed=5)
    r = recipe.DelayedScaling(amax_history_len=3)
    x1 = randn((32, 64), torch.bfloat16, "cuda", seed=30, scale=4.0).requires_grad_()
    x2 = (x1.detach() * 2).requires_grad_()
    a1, a2 = (x.detach().abs().max().float().reshape(1) for x in (x1, x2))
    with te.fp8_autocast(fp8_recipe=r):
        y1 = m(x1)
    assert quantization._DEFERRED  # waiting for y1's backward
    rs = m._fp8_state
    fwd_max = torch.tensor([fp8_max_of(rs.fwd_dtype)], device="cuda")
    assert torch.equal(rs.scale_fwd[:1], fwd_max / a1)
    assert not quantization._DEFERRED  # the read ran it
    with te.fp8_autocast(fp8_recipe=r):  # a second forward before the first backward
        y2 = m(x2)
    assert quantization._DEFERRED
    (y1.float().sum() + y2.float().sum()).backward()
    assert not quantization._DEFERRED
    # row 0 (the recording row) cleared, then the two steps' input amaxes, oldest first: both
    # forward updates ran, in order
    assert torch.equal(rs.amax_history_fwd[:, 0], torch.cat([torch.zeros_like(a1), a1, a2]))
    assert torch.equal(rs.scale_fwd[:1], fwd_max / torch.maximum(a1, a2))
