"""Weight-gradient options of the GEMM modules: delay_wgrad_compute with backward_dw(), and
fuse_wgrad_accumulation into main_grad with Megatron's grad_added_to_main_grad protocol. Each
is compared with the same module without the option (same parameters, same inputs)."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.module.base import get_dummy_wgrad
from module_cases import autocast
from utils import DEVICES, randn, stable_seed, tols

MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear")
SPLITS = [16, 0, 32]


def _make(name, dtype, device, **kw):
    torch.manual_seed(stable_seed(name))
    if name == "GroupedLinear":
        return te.GroupedLinear(3, 32, 48, params_dtype=dtype, device=device, **kw)
    if name == "LayerNormMLP":
        return te.LayerNormMLP(32, 48, params_dtype=dtype, device=device, **kw)
    return getattr(te, name)(32, 48, params_dtype=dtype, device=device, **kw)


def _weights(m):
    return [(n, p) for n, p in m.named_parameters()
            if "weight" in n and not n.startswith("layer_norm")]


def _run(m, name, x, g, recipe):
    with autocast(recipe):
        y = m(x, SPLITS) if name == "GroupedLinear" else m(x)
    y.backward(g)


def _pair(name, dtype, device, **kw):
    m = _make(name, dtype, device, **kw)
    ref = _make(name, dtype, device, fuse_wgrad_accumulation=kw.get("fuse_wgrad_accumulation", False))
    ref.load_state_dict(m.state_dict())
    return m, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current", "block", "current_override"])
@pytest.mark.parametrize("fuse", [False, True])
def test_delay_wgrad_compute(device, module, recipe, fuse):
    dtype = torch.bfloat16
    m, ref = _pair(module, dtype, device, delay_wgrad_compute=True, fuse_wgrad_accumulation=fuse)
    for mod in (m, ref):
        for _, p in _weights(mod):
            if fuse:
                p.main_grad = randn(p.shape, torch.float32, device, seed=5)
                p.grad_added_to_main_grad = False
    for step in range(2):  # two backwards queue two GEMMs per weight, run oldest first
        x = randn((48, 32), dtype, device, seed=step).requires_grad_(True)
        g = randn((48, 48 if module != "LayerNormMLP" else 32), dtype, device, seed=step + 3)
        xr = x.detach().clone().requires_grad_(True)
        _run(m, module, x, g, recipe)
        _run(ref, module, xr, g, recipe)
        torch.testing.assert_close(x.grad, xr.grad, **tols(dtype))
    for n, p in _weights(m):
        assert p.grad is None, f"{n}: the delayed gradient arrived before backward_dw()"
        assert p.skip_backward_post_hook is True  # Megatron's DDP leaves it to the wgrad hooks
    assert m.need_backward_dw()
    calls = []
    m.register_wgrad_accumulation_and_reduce_hooks(lambda: calls.append(1))
    m.backward_dw()
    assert calls == [1] and not m.need_backward_dw()
    for (n, p), (_, q) in zip(_weights(m), _weights(ref)):
        if fuse:
            assert p.grad_added_to_main_grad
            torch.testing.assert_close(p.main_grad, q.main_grad, **tols(dtype), msg=n)
        else:
            torch.testing.assert_close(p.grad, q.grad, **tols(dtype), msg=n)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        if "weight" not in n or n.startswith("layer_norm"):  # bias and norm gradients: in backward
            torch.testing.assert_close(p.grad, q.grad, **tols(dtype), msg=n)
    m.backward_dw()  # nothing queued: no hook call
    assert calls == [1]


def _bad_main_grad(p, bad, device):
    if bad == "shape":  # one row short: the GEMM would write past its end
        return randn((p.shape[0] - 1, p.shape[1]), torch.float32, device, seed=6)
    if bad == "strided":
        return randn((p.shape[1], p.shape[0]), torch.float32, device, seed=6).t()
    if bad == "dtype":
        return randn(p.shape, torch.float32, device, seed=6).double()
    # another device: the host's memory for a GPU weight (meta stands in on a CPU-only machine)
    return randn(p.shape, torch.float32, "cpu" if device == "cuda" else "meta", seed=6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
@pytest.mark.parametrize("bad", ["shape", "strided", "dtype", "device"])
def test_fuse_wgrad_accumulation_refuses_a_main_grad_it_cannot_add_into(device, module, recipe,
                                                                         bad):
    """main_grad must be a contiguous fp32 / bf16 / fp16 tensor of the weight's shape on the
    weight's device: the wgrad GEMM adds into it by address. Anything else is refused in the
    backward with an error naming weight.main_grad, before the GEMM runs."""
    dtype = torch.bfloat16
    m = _make(module, dtype, device, fuse_wgrad_accumulation=True)
    for _, p in _weights(m):
        p.main_grad = _bad_main_grad(p, bad, device)
    x = randn((48, 32), dtype, device, seed=1)
    g = randn((48, 48 if module != "LayerNormMLP" else 32), dtype, device, seed=2)
    with pytest.raises(ValueError, match=r"weight\.main_grad is a .*; expected a contiguous "
                                         r"float32 \(or bfloat16 / float16\) tensor of the "
                                         r"weight's shape"):
        _run(m, module, x, g, recipe)
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "block", "current_override"])
@pytest.mark.parametrize("protocol", ["megatron", "megatron_zero_out", "plain"])
def test_fuse_wgrad_accumulation(device, module, recipe, protocol):
    dtype = torch.bfloat16
    m, ref = _make(module, dtype, device, fuse_wgrad_accumulation=True), _make(module, dtype, device)
    ref.load_state_dict(m.state_dict())
    start = {}
    for n, p in _weights(m):
        start[n] = randn(p.shape, torch.float32, device, seed=stable_seed(n))
        p.main_grad = start[n].clone()
        if protocol != "plain":
            p.grad_added_to_main_grad = False
        if protocol == "megatron_zero_out":
            p.zero_out_wgrad = True
    steps = {n: [] for n, _ in _weights(ref)}
    for step in range(2):
        x = randn((48, 32), dtype, device, seed=step)
        g = randn((48, 48 if module != "LayerNormMLP" else 32), dtype, device, seed=step + 3)
        _run(m, module, x, g, recipe)
        _run(ref, module, x.clone(), g, recipe)
        for n, q in _weights(ref):
            steps[n].append(q.grad.float())
            q.grad = None
    for n, p in _weights(m):
        # main_grad = start + both steps' gradients, accumulated in fp32 by the GEMM; the
        # reference's steps are each rounded to bf16: bf16's rtol of each step's magnitude
        want, bound = sum(steps[n]), sum(s.abs() for s in steps[n])
        err = (p.main_grad - start[n] - want).abs()
        assert bool((err <= tols(dtype)["rtol"] * bound + 1e-5).all()), (n, err.max())
        if protocol == "plain":
            assert p.grad is None and not hasattr(p, "grad_added_to_main_grad")
        else:
            assert p.grad_added_to_main_grad is True
            assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
            # the cached placeholder (NVIDIA TE's get_dummy_wgrad), not a new tensor per backward
            dummy = get_dummy_wgrad(list(p.shape), p.dtype, device=p.device)
            assert p.grad.data_ptr() == dummy.data_ptr()
            if protocol == "megatron_zero_out":
                assert torch.count_nonzero(p.grad) == 0


def test_backward_dw_without_delay_is_a_no_op():
    m = te.Linear(16, 16, device="cpu")
    m(torch.randn(4, 16)).sum().backward()
    grad = m.weight.grad.clone()
    assert not m.need_backward_dw()
    m.backward_dw()
    torch.testing.assert_close(m.weight.grad, grad, rtol=0, atol=0)
    with pytest.raises(TypeError, match="register_wgrad_accumulation_and_reduce_hooks: hook is int"):
        m.register_wgrad_accumulation_and_reduce_hooks(3)
