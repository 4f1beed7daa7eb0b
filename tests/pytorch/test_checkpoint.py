"""te.checkpoint: bit-exact against no checkpointing (outputs, input and weight gradients, the
FP8 scales after several steps) with dropout, the RNG tracker and every recipe."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

from utils import DEVICES, randn

RECIPES = {"none": None, "delayed": recipe.DelayedScaling(amax_history_len=3),
           "current": recipe.Float8CurrentScaling()}
MODULES = {
    "Linear": lambda d: te.Linear(64, 96, device=d),
    "LayerNormLinear": lambda d: te.LayerNormLinear(64, 96, device=d),
    "LayerNormMLP": lambda d: te.LayerNormMLP(64, 128, activation="swiglu", device=d),
}


def _run(device, make, r, use_checkpoint, tracker, use_reentrant=True, input_grad=True):
    torch.manual_seed(1)
    mod = make(device)
    drop = torch.nn.Dropout(0.25)

    def block(x):
        h = mod(x)
        with tracker.fork():
            return drop(h) * 2.0

    results = []
    for step in range(3):
        x = randn((2, 16, 64), torch.float32, device, seed=step).requires_grad_(input_grad)
        torch.manual_seed(100 + step)
        with te.autocast(enabled=r is not None, recipe=r):
            y = (te.checkpoint(block, x, get_rng_state_tracker=lambda: tracker,
                               use_reentrant=use_reentrant) if use_checkpoint else block(x))
        y.backward(randn(y.shape, torch.float32, device, seed=50 + step))
        grads = [p.grad.clone() for p in mod.parameters()]
        mod.zero_grad()
        scales = [mod._fp8_state.scale_fwd.clone(), mod._fp8_state.scale_bwd.clone()] if r else []
        results.append([y.detach()] + ([x.grad] if input_grad else []) + grads + scales)
    return results


def _tracker(device):
    tracker = te.CudaRNGStatesTracker(device="cuda" if device == "cuda" else "cpu")
    tracker.add("model-parallel-rng", 1234)
    return tracker


def _reproducible(plain, again) -> bool:
    return all(torch.equal(a, b) for sa, sb in zip(plain, again) for a, b in zip(sa, sb))


def _assert_matches(plain, got, reproducible):
    """Bit for bit where the plain run reproduces itself, else fp32 closeness (see below)."""
    for step_a, step_b in zip(plain, got):
        assert len(step_a) == len(step_b)
        for a, b in zip(step_a, step_b):
            if reproducible:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_checkpoint_bit_exact(device, recipe_name, module):
    """Bit-exact against the plain run, provided the plain run reproduces itself: a GEMM library
    may pick split-K algorithms that reduce with atomics (seen on an H100 with fp32 operands),
    and then no two runs agree; the test then checks fp32 closeness instead and says so."""
    r = RECIPES[recipe_name]
    plain, again, ckpt = (_run(device, MODULES[module], r, use, _tracker(device))
                          for use in (False, False, True))
    reproducible = _reproducible(plain, again)
    if device == "cpu":
        assert reproducible
    _assert_matches(plain, ckpt, reproducible)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("input_grad", [True, False])
def test_non_reentrant_checkpoint_of_a_closure(device, recipe_name, input_grad):
    """use_reentrant=False (torch's non-reentrant machinery with this module's RNG and FP8
    phases) over a closure: the parameters get their gradients even when the input does not
    require grad, bit-exact against the plain run where that run reproduces itself."""
    r = RECIPES[recipe_name]
    plain, again, ckpt = (_run(device, MODULES["LayerNormMLP"], r, use, _tracker(device),
                               use_reentrant=False, input_grad=input_grad)
                          for use in (False, False, True))
    _assert_matches(plain, ckpt, _reproducible(plain, again))


def test_checkpoint_rejects_non_callable():
    with pytest.raises(TypeError, match="checkpoint: function must be callable"):
        te.checkpoint(3, torch.ones(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_fp8_meta_marks_only_stashed_delayed_forwards(device, use_reentrant):
    """fp8_meta's recompute position appears on a module whose checkpointed forward ran under
    delayed scaling (it stashed its scales), not on a module of the same region that ran in
    high precision, nor under current scaling (nothing to stash: scales come from the data)."""
    plain = te.Linear(16, 16, bias=False, params_dtype=torch.float32, device=device)
    fp8 = te.Linear(16, 16, bias=False, params_dtype=torch.float32, device=device)
    current = te.Linear(16, 16, bias=False, params_dtype=torch.float32, device=device)

    def body(v):
        v = plain(v)
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling()):
            v = fp8(v)
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8CurrentScaling()):
            return current(v)

    x = randn((16, 16), torch.float32, device, seed=1).requires_grad_()
    te.checkpoint(body, x, use_reentrant=use_reentrant).sum().backward()
    key = "global_fp8_buffer_pos_fwd_recompute"
    assert key in fp8.fp8_meta and fp8.fp8_meta[key] == 0
    assert key not in plain.fp8_meta and key not in current.fp8_meta
    assert all(torch.isfinite(m.weight.grad).all() for m in (plain, fp8, current))


@pytest.mark.parametrize("device", DEVICES)
def test_recompute_goes_through_the_state_manager(device, monkeypatch):
    """Each checkpointed delayed-scaling forward stashes its scales through
    FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute and each recompute takes
    them back through get_old_fp8_meta_tensors_for_recompute, on the module's own fp8_meta
    (the same dict object both times), one restore per stash; wrapping them changes no bit."""
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager as M
    r = recipe.DelayedScaling(amax_history_len=3)
    ref = _run(device, MODULES["LayerNormMLP"], r, False, _tracker(device))
    again = _run(device, MODULES["LayerNormMLP"], r, False, _tracker(device))
    reproducible = _reproducible(ref, again)
    stashes, restores = {}, {}
    stash, restore = M.copy_forward_fp8_meta_tensors_for_recompute, M.get_old_fp8_meta_tensors_for_recompute

    def counted_stash(meta):
        stash(meta)
        assert "global_fp8_buffer_pos_fwd_recompute" in meta
        stashes[id(meta)] = stashes.get(id(meta), 0) + 1

    def counted_restore(meta):
        assert id(meta) in stashes, "a restore without a stash"
        restores[id(meta)] = restores.get(id(meta), 0) + 1
        restore(meta)

    monkeypatch.setattr(M, "copy_forward_fp8_meta_tensors_for_recompute", staticmethod(counted_stash))
    monkeypatch.setattr(M, "get_old_fp8_meta_tensors_for_recompute", staticmethod(counted_restore))
    got = _run(device, MODULES["LayerNormMLP"], r, True, _tracker(device))
    assert stashes and restores == stashes and sum(stashes.values()) == 3  # one per step
    _assert_matches(ref, got, reproducible)


def test_state_manager_recompute_methods_refuse_other_dicts():
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager as M
    for fn in (M.copy_forward_fp8_meta_tensors_for_recompute,
               M.get_old_fp8_meta_tensors_for_recompute, M.restore_fp8_meta_tensors):
        with pytest.raises(TypeError, match="fp8_meta of a transformer_engine.pytorch module"):
            fn({"recipe": recipe.DelayedScaling()})
