"""save_original_input on Linear and GroupedLinear: the forward saves the high-precision input and
the backward casts it again for the weight-gradient GEMM. Under current scaling and block scaling
that cast is the forward's, so outputs and every gradient equal those of the same module with
save_original_input=False bit for bit; without FP8 and under a backward_override the option
changes nothing. Under DelayedScaling a call that makes a weight gradient is refused."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe
from utils import DEVICES, randn, stable_seed

RECIPES = {
    "none": lambda: None,
    "current": te_recipe.Float8CurrentScaling,
    "block": te_recipe.Float8BlockScaling,
    "current_hp_backward": lambda: te_recipe.Float8CurrentScaling(backward_override="high_precision"),
    "current_dq_backward": lambda: te_recipe.Float8CurrentScaling(backward_override="dequantized"),
}


def _autocast(name):
    r = RECIPES[name]()
    return te.autocast(enabled=r is not None, recipe=r)


def _pair(build, device):
    """Two modules with the same parameters, save_original_input False and True."""
    torch.manual_seed(stable_seed("save_original_input"))
    ref = build(device=device, save_original_input=False)
    mod = build(device=device, save_original_input=True)
    with torch.no_grad():
        for p, q in zip(mod.parameters(), ref.parameters()):
            p.copy_(q)
    return ref, mod


def _run(module, x, dy, recipe_name, *args):
    x = x.clone().requires_grad_(True)
    with _autocast(recipe_name):
        y = module(x, *args)
    y.backward(dy)
    return [y, x.grad] + [p.grad for p in module.parameters()]


def _assert_same_bits(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None and w is not None, f"{what}: tensor {i} missing"
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"{what}: tensor {i} differs")


def _shape_for(recipe_name):
    # FP8 GEMMs need multiples of 16 (block scaling: its 128-wide blocks, partly filled);
    # high precision takes odd sizes
    return (3, 37, 23, 41) if recipe_name == "none" else (2, 48, 160, 96)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_matches_quantized_input_saved(device, recipe_name, dtype):
    b, s, k, n = _shape_for(recipe_name)
    ref, mod = _pair(lambda **kw: te.Linear(k, n, params_dtype=dtype, **kw), device)
    x = randn((b, s, k), dtype, device, seed=stable_seed(recipe_name, 1))
    dy = randn((b, s, n), dtype, device, seed=stable_seed(recipe_name, 2))
    for step in range(2):  # the second step sees the state the first left behind
        want = _run(ref, x, dy, recipe_name)
        got = _run(mod, x, dy, recipe_name)
        _assert_same_bits(got, want, f"Linear {recipe_name} step {step}")
        ref.zero_grad(set_to_none=True)
        mod.zero_grad(set_to_none=True)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_fuse_wgrad_accumulation_into_main_grad(device):
    """NVIDIA TE's own check of the option: a weight accumulating into main_grad."""
    dtype = torch.bfloat16
    ref, mod = _pair(lambda **kw: te.Linear(64, 128, bias=False, params_dtype=dtype,
                                            fuse_wgrad_accumulation=True, **kw), device)
    start = randn((128, 64), torch.float32, device, seed=3)
    ref.weight.main_grad, mod.weight.main_grad = start.clone(), start.clone()
    x = randn((32, 64), dtype, device, seed=4)
    dy = randn((32, 128), dtype, device, seed=5)
    want = _run(ref, x, dy, "current")[:2]
    got = _run(mod, x, dy, "current")[:2]
    _assert_same_bits(got, want, "Linear main_grad")
    assert not torch.equal(mod.weight.main_grad, start)
    torch.testing.assert_close(mod.weight.main_grad, ref.weight.main_grad, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", ["none", "current", "block"])
def test_grouped_linear_matches_quantized_input_saved(device, recipe_name):
    dtype = torch.bfloat16
    fp8 = recipe_name != "none"
    splits = [32, 0, 48, 16] if fp8 else [5, 0, 11, 3]
    k, n = (64, 80) if fp8 else (37, 23)
    ref, mod = _pair(lambda **kw: te.GroupedLinear(4, k, n, params_dtype=dtype, **kw), device)
    x = randn((sum(splits), k), dtype, device, seed=stable_seed(recipe_name, 3))
    dy = randn((sum(splits), n), dtype, device, seed=stable_seed(recipe_name, 4))
    want = _run(ref, x, dy, recipe_name, splits)
    got = _run(mod, x, dy, recipe_name, splits)
    _assert_same_bits(got, want, f"GroupedLinear {recipe_name}")


def _saved_during_forward(module, x, recipe_name, *args):
    """The tensors autograd keeps from a forward of `module`, as packed by saved_tensors_hooks."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(recipe_name):
        y = module(x, *args)
    return y, saved


@pytest.mark.parametrize("device", DEVICES)
def test_linear_saves_the_input_not_an_fp8_copy(device):
    """Under current scaling the saved input is the caller's tensor (no new storage), and what
    else is saved is smaller by at least the FP8 copy of the input (one byte per element) that
    the module without the option keeps."""
    dtype = torch.bfloat16
    tokens, k = 48, 64
    ref, mod = _pair(lambda **kw: te.Linear(k, 96, params_dtype=dtype, **kw), device)
    x = randn((tokens, k), dtype, device, seed=6).requires_grad_(True)

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    y, saved = _saved_during_forward(mod, x, "current")
    assert any(t.data_ptr() == x.data_ptr() for t in saved), "the input itself is not saved"
    others = [t for t in saved if t.data_ptr() != x.data_ptr()]
    y.sum().backward()  # the backward runs on what was saved

    _, saved_ref = _saved_during_forward(ref, x, "current")
    assert not any(t.data_ptr() == x.data_ptr() for t in saved_ref)
    assert nbytes(saved_ref) - nbytes(others) >= tokens * k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "GroupedLinear"])
def test_delayed_scaling_is_refused_when_a_weight_gradient_is_made(device, name):
    if name == "Linear":
        mod = te.Linear(32, 48, device=device, save_original_input=True)
        args = ()
    else:
        mod = te.GroupedLinear(2, 32, 48, device=device, save_original_input=True)
        args = ([16, 16],)
    x = randn((32, 32), torch.float32, device, seed=7)
    with pytest.raises(ValueError, match=f"{name}: save_original_input=True is not supported "
                                         "under DelayedScaling"):
        with te.autocast(recipe=te_recipe.DelayedScaling()):
            mod(x, *args)
    # no weight gradient to make: the input is not needed by the backward, and the call runs
    with torch.no_grad(), te.autocast(recipe=te_recipe.DelayedScaling()):
        y = mod(x, *args)
    assert y.shape == (32, 48) and torch.isfinite(y).all()
    for p in mod.parameters():
        p.requires_grad_(False)
    with te.autocast(recipe=te_recipe.DelayedScaling()):
        mod(x.clone().requires_grad_(True), *args).sum().backward()


def test_option_is_stored():
    assert te.Linear(16, 16, device="cpu", save_original_input=True).save_original_input is True
    assert te.Linear(16, 16, device="cpu").save_original_input is False
    assert te.GroupedLinear(2, 16, 16, device="cpu", save_original_input=True).save_original_input


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "GroupedLinear"])
def test_option_set_after_construction_takes_effect(device, name):
    """Clients turn the option on after building the module (Megatron-Core sets the attribute on
    its TE Linear / GroupedLinear subclasses): the next forward reads it. Linear then saves the
    caller's input itself; both refuse DelayedScaling as with the constructor argument."""
    dtype = torch.bfloat16
    if name == "Linear":
        mod, args = te.Linear(64, 96, params_dtype=dtype, device=device), ()
    else:
        mod, args = te.GroupedLinear(2, 64, 96, params_dtype=dtype, device=device), ([16, 32],)
    x = randn((48, 64), dtype, device, seed=8).requires_grad_(True)
    with te.autocast(recipe=te_recipe.DelayedScaling()):
        mod(x, *args)  # accepted while the option is off
    mod.save_original_input = True
    with pytest.raises(ValueError, match=f"{name}: save_original_input=True is not supported"):
        with te.autocast(recipe=te_recipe.DelayedScaling()):
            mod(x, *args)
    if name == "Linear":  # (GroupedLinear keeps its tensors on the context, out of the hooks' view)
        y, saved = _saved_during_forward(mod, x, "current", *args)
        assert any(t.data_ptr() == x.data_ptr() for t in saved), "the input itself is not saved"
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
