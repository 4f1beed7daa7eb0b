"""FP8 scaling survives a step with non-finite values: the NaN/inf amax never enters the history,
the scale stays the last finite one, the skip is counted and warned about once, and the steps
after it are as accurate as the steps before (both recipes, on every backend)."""
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.kernels.cast import fp8_max_of

from utils import DEVICES, randn

IN, OUT, TOKENS = 48, 80, 32


def _rel_err(m, x):
    ref = x @ m.weight.detach().t() + m.bias.detach()
    return ((m(x) - ref).norm() / ref.norm()).item()


def _step(m, x, fp8_recipe, dy_seed):
    x = x.clone().requires_grad_()
    with te.fp8_autocast(fp8_recipe=fp8_recipe):
        y = m(x)
    y.backward(randn(y.shape, torch.float32, x.device, seed=dy_seed))


def _error_under(m, x, fp8_recipe):
    with torch.no_grad(), te.fp8_autocast(fp8_recipe=fp8_recipe):
        return _rel_err(m, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_delayed_scaling_skips_a_bad_step(device, bad):
    torch.manual_seed(7)
    m = te.Linear(IN, OUT, device=device)
    r = recipe.DelayedScaling(amax_history_len=16)
    for k in range(3):
        _step(m, randn((TOKENS, IN), torch.float32, device, seed=k, scale=0.5), r, 100 + k)
    baseline = _error_under(m, randn((TOKENS, IN), torch.float32, device, seed=50, scale=0.5), r)
    rs = m._fp8_state
    before = (rs.scale_fwd.clone(), rs.scale_inv_fwd.clone(), rs.amax_history_fwd.clone())

    x_bad = randn((TOKENS, IN), torch.float32, device, seed=3, scale=0.5)
    x_bad[5, 7] = bad
    with pytest.warns(RuntimeWarning, match="Linear: 1 FP8 scale update.*DelayedScaling.*NaN or infinite") \
            if device == "cpu" else warnings.catch_warnings():
        _step(m, x_bad, r, 103)
    # the input's amax was not finite: its history and scale are untouched; the weight's moved on
    assert torch.equal(rs.scale_fwd[0], before[0][0]) and torch.equal(rs.scale_inv_fwd[0], before[1][0])
    assert torch.equal(rs.amax_history_fwd[1:, 0], before[2][1:, 0])
    assert torch.isfinite(rs.amax_history_fwd).all() and torch.isfinite(rs.amax_history_bwd).all()
    assert torch.equal(rs.amax_history_fwd[-1, 1], m.weight.detach().abs().max())

    # inputs 16x larger from now on: after one step at the new level the error is back to normal
    for k in range(2):
        _step(m, randn((TOKENS, IN), torch.float32, device, seed=10 + k, scale=8.0), r, 110 + k)
    after = _error_under(m, randn((TOKENS, IN), torch.float32, device, seed=51, scale=8.0), r)
    assert after < 2 * baseline + 1e-3, (baseline, after)
    expect = torch.tensor(fp8_max_of(rs.fwd_dtype), device=device) / rs.amax_history_fwd[:, 0].max()
    assert torch.equal(rs.scale_fwd[0], expect)

    if device != "cpu":  # on a GPU the count is read (and warned about) only when asked for
        with pytest.warns(RuntimeWarning, match="Linear: 1 FP8 scale update.*DelayedScaling"):
            assert m.fp8_skipped_updates() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # counted again, warned only once
        assert m.fp8_skipped_updates() == 1
        _step(m, x_bad, r, 104)
        assert m.fp8_skipped_updates() == 2
    state = m.state_dict()
    assert state["_extra_state"]["skipped_updates_fwd"].tolist() == [2, 0]
    fresh = te.Linear(IN, OUT, device=device)
    fresh.load_state_dict(state)
    with pytest.warns(RuntimeWarning, match="2 FP8 scale update"):  # the loaded count
        with te.fp8_autocast(fp8_recipe=r):
            fresh(randn((TOKENS, IN), torch.float32, device, seed=60))
        assert fresh.fp8_skipped_updates() == 2


@pytest.mark.parametrize("device", DEVICES)
def test_bad_output_gradient_keeps_the_backward_scale(device):
    torch.manual_seed(8)
    m = te.Linear(IN, OUT, device=device)
    r = recipe.DelayedScaling(amax_history_len=4)
    _step(m, randn((TOKENS, IN), torch.float32, device, seed=1), r, 2)
    rs = m._fp8_state
    scale_bwd = rs.scale_bwd.clone()
    x = randn((TOKENS, IN), torch.float32, device, seed=3).requires_grad_()
    with te.fp8_autocast(fp8_recipe=r):
        y = m(x)
    dy = randn(y.shape, torch.float32, device, seed=4)
    dy[0, 0] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y.backward(dy)
        assert m.fp8_skipped_updates() == 1
    assert torch.equal(rs.scale_bwd, scale_bwd)
    assert torch.isfinite(rs.amax_history_bwd).all()


@pytest.mark.parametrize("device", DEVICES)
def test_current_scaling_keeps_the_last_finite_scale(device):
    torch.manual_seed(9)
    m = te.Linear(IN, OUT, device=device)
    r = recipe.Float8CurrentScaling()
    x = randn((TOKENS, IN), torch.float32, device, seed=1, scale=2.0)
    _step(m, x, r, 2)
    rs = m._fp8_state
    good = rs.scale_fwd[0].clone()
    assert torch.equal(good, torch.tensor(fp8_max_of(rs.fwd_dtype), device=device) / x.abs().max())
    x_bad = x.clone()
    x_bad[3, 3] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad(), te.fp8_autocast(fp8_recipe=r):
            m(x_bad)
        assert m.fp8_skipped_updates() == 1
    assert torch.equal(rs.scale_fwd[0], good)
    baseline = _error_under(m, x, r)
    assert _error_under(m, randn((TOKENS, IN), torch.float32, device, seed=5, scale=2.0), r) < 2 * baseline + 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_current_scaling_counts_each_skip_in_its_direction_and_slot(device):
    """Training steps (a cast with its transpose, the gradient's cast with the bias gradient):
    a NaN input is counted in forward slot 0 only, an infinite output gradient in backward slot 0
    only, and each keeps the last finite scale of its tensor."""
    torch.manual_seed(10)
    m = te.Linear(IN, OUT, device=device)
    r = recipe.Float8CurrentScaling()
    _step(m, randn((TOKENS, IN), torch.float32, device, seed=1, scale=3.0), r, 2)
    rs = m._fp8_state
    scale_fwd = rs.scale_fwd.clone()
    x_bad = randn((TOKENS, IN), torch.float32, device, seed=3, scale=0.5)
    x_bad[TOKENS - 1, IN // 2 + 1] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _step(m, x_bad, r, 4)
        assert m.fp8_skipped_updates() == 1
    assert rs._skipped_fwd.tolist() == [1, 0] and int(rs.skipped_bwd.sum()) == 0
    assert torch.equal(rs.scale_fwd[0], scale_fwd[0])

    scale_bwd = rs.scale_bwd.clone()  # from the last step's finite gradient
    x = randn((TOKENS, IN), torch.float32, device, seed=5).requires_grad_()
    with te.fp8_autocast(fp8_recipe=r):
        y = m(x)
    dy = randn(y.shape, torch.float32, device, seed=6)
    dy[2, OUT - 3] = float("-inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y.backward(dy)
        assert m.fp8_skipped_updates() == 2
    assert rs._skipped_fwd.tolist() == [1, 0]
    assert rs.skipped_bwd[0].item() == 1 and int(rs.skipped_bwd.sum()) == 1
    assert torch.equal(rs.scale_bwd[0], scale_bwd[0])
