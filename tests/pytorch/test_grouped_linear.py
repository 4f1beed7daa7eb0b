"""GroupedLinear and Fp8Padding/Fp8Unpadding against a loop of torch.nn.functional.linear (high
precision) and a loop of te.Linear with the same weights (FP8: same kernels, same bits), on the
reference backend and the native one."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from module_cases import autocast
from utils import DEVICES, randn, stable_seed, tols

SPLITS = {"odd": [5, 0, 11, 3], "zeros_first": [0, 0, 19, 1], "one": [7, 0, 0, 0]}
FP8_SPLITS = {"aligned": [16, 0, 48, 32], "one": [32, 0, 0, 0]}


def _grouped(n, k, m, dtype, device, bias=True, **kw):
    torch.manual_seed(stable_seed(n, k, m, bias))
    return te.GroupedLinear(n, k, m, bias=bias, params_dtype=dtype, device=device, **kw)


def _reference(module, x, splits, bias):
    parts = x.split(splits)
    return torch.cat([F.linear(p, getattr(module, f"weight{i}"),
                               getattr(module, f"bias{i}") if bias else None)
                      for i, p in enumerate(parts)])


def test_parameter_names_and_order():
    m = te.GroupedLinear(3, 8, 4, device="cpu")
    assert [n for n, _ in m.named_parameters()] == ["weight0", "bias0", "weight1", "bias1",
                                                    "weight2", "bias2"]
    assert [n for n, _ in te.GroupedLinear(2, 8, 4, bias=False, device="cpu").named_parameters()] \
        == ["weight0", "weight1"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", list(SPLITS), ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_linear_loop(device, dtype, splits, bias):
    sizes = SPLITS[splits]
    m = _grouped(4, 37, 23, dtype, device, bias)
    x = randn((sum(sizes), 37), dtype, device, seed=stable_seed(splits)).requires_grad_(True)
    y = m(x, sizes)
    ref_params = [p.detach().clone().requires_grad_(True) for p in m.parameters()]
    ref_mod = _grouped(4, 37, 23, dtype, device, bias)
    with torch.no_grad():
        for p, q in zip(ref_mod.parameters(), ref_params):
            p.copy_(q)
    xr = x.detach().clone().requires_grad_(True)
    ref = _reference(ref_mod, xr, sizes, bias)
    torch.testing.assert_close(y, ref, **tols(dtype))
    g = randn(y.shape, dtype, device, seed=7)
    y.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, **tols(dtype))
    for (name, p), q in zip(m.named_parameters(), ref_mod.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **tols(dtype), msg=name)
    # an empty group's gradients are zeros, not missing
    for i, s in enumerate(sizes):
        if s == 0:
            assert torch.count_nonzero(getattr(m, f"weight{i}").grad) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("splits", list(FP8_SPLITS), ids=str)
def test_fp8_matches_te_linear_loop(device, recipe, splits):
    """Each group is one te.Linear step in FP8 (its own scaling slots): same bits."""
    sizes = FP8_SPLITS[splits]
    dtype = torch.bfloat16
    m = _grouped(4, 32, 48, dtype, device)
    linears = [te.Linear(32, 48, params_dtype=dtype, device=device) for _ in sizes]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(getattr(m, f"weight{i}"))
            lin.bias.copy_(getattr(m, f"bias{i}") + 0.01 * (i + 1))
            getattr(m, f"bias{i}").copy_(lin.bias)
    for step in range(3):
        x = randn((sum(sizes), 32), dtype, device, seed=step).requires_grad_(True)
        g = randn((sum(sizes), 48), dtype, device, seed=step + 10)
        with autocast(recipe):
            y = m(x, sizes)
        y.backward(g)
        xr = x.detach().clone().requires_grad_(True)
        with autocast(recipe):
            outs = [lin(p) for lin, p in zip(linears, xr.split(sizes)) if p.shape[0]]
        torch.cat(outs).backward(g[torch.cat([torch.full((s,), s > 0) for s in sizes]).to(device)])
        torch.testing.assert_close(y, torch.cat(outs), rtol=0, atol=0)
        torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=0)
        for i, lin in enumerate(linears):
            if sizes[i]:
                torch.testing.assert_close(getattr(m, f"weight{i}").grad, lin.weight.grad, rtol=0, atol=0)
                torch.testing.assert_close(getattr(m, f"bias{i}").grad, lin.bias.grad, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_needs_aligned_splits(device):
    m = _grouped(2, 32, 32, torch.bfloat16, device)
    x = randn((24, 32), torch.bfloat16, device)
    with autocast("delayed"), pytest.raises(ValueError, match="multiple of 16.*Fp8Padding"):
        m(x, [8, 16])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed"])
def test_padding_roundtrip_through_grouped(device, recipe):
    """pad -> GroupedLinear -> unpad gives the unpadded result (zero rows change nothing)."""
    sizes = [5, 0, 21, 3]
    dtype = torch.bfloat16
    m = _grouped(4, 32, 16, dtype, device)
    pad, unpad = te.Fp8Padding(4), te.Fp8Unpadding(4)
    x = randn((sum(sizes), 32), dtype, device, seed=3).requires_grad_(True)
    xp, padded = pad(x, sizes)
    assert padded == [16, 0, 32, 16] and xp.shape[0] == 64
    torch.testing.assert_close(unpad(xp, sizes), x, rtol=0, atol=0)
    with autocast(recipe):
        y = unpad(m(xp, padded), sizes)
    y.float().sum().backward()
    assert y.shape == (sum(sizes), 16) and x.grad.shape == x.shape
    if recipe == "none":
        torch.testing.assert_close(y, _reference(m, x.detach(), sizes, True), **tols(dtype))


def test_bad_arguments():
    m = te.GroupedLinear(3, 8, 4, device="cpu")
    x = torch.randn(6, 8)
    with pytest.raises(ValueError, match="GroupedLinear.forward: m_splits has 2 entries"):
        m(x, [3, 3])
    with pytest.raises(ValueError, match="add up to the input's 6 rows"):
        m(x, [3, 3, 1])
    with pytest.raises(ValueError, match=r"GroupedLinear.forward: inp has shape \(6, 7\)"):
        m(torch.randn(6, 7), [2, 2, 2])
    with pytest.raises(ValueError, match="num_gemms"):
        te.GroupedLinear(0, 8, 4, device="cpu")
    with pytest.raises(ValueError, match="Fp8Padding.forward: m_splits"):
        te.Fp8Padding(2)(x, [1, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias_and_tensor_splits(device):
    m = _grouped(2, 16, 8, torch.float32, device, return_bias=True)
    x = randn((9, 16), torch.float32, device)
    y, biases = m(x, torch.tensor([4, 5]))
    assert len(biases) == 2
    torch.testing.assert_close(y, _reference(m, x, [4, 5], False))
    torch.testing.assert_close(biases[1], m.bias1)
