"""te.make_graphed_callables: graphed steps against eager steps of an identical copy, over several
steps with an in-place optimizer update between them: outputs, gradients and (FP8
DelayedScaling) the amax history and scales that the replays advance, bit for bit."""
import copy
import gc
import weakref

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import graph as graph_mod
from transformer_engine.common import recipe
from utils import native_gpu_reason, randn

needs_gpu = pytest.mark.skipif(bool(native_gpu_reason()), reason=native_gpu_reason() or "ok")
STEPS = 4


def _module(name):
    torch.manual_seed(1)
    kw = dict(params_dtype=torch.bfloat16, device="cuda")
    if name == "Linear":
        return te.Linear(64, 96, **kw)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(64, 96, **kw)
    if name == "LayerNormMLP":
        return te.LayerNormMLP(64, 96, **kw)
    return te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, **kw)


def _recipe(name):
    return {"bf16": None, "delayed": recipe.DelayedScaling(amax_history_len=4),
            "current": recipe.Float8CurrentScaling()}[name]


def _state(m):
    rs = m._fp8_state
    if rs is None:
        return []
    return [rs.amax_history_fwd, rs.amax_history_bwd, rs.scale_fwd, rs.scale_bwd]


@needs_gpu
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer"])
@pytest.mark.parametrize("rname", ["bf16", "delayed", "current"])
def test_graphed_matches_eager(module, rname):
    r = _recipe(rname)
    eager = _module(module)
    graphed_mod = copy.deepcopy(eager)
    x0 = randn((32, 2, 64) if module == "TransformerLayer" else (64, 64), torch.bfloat16, "cuda")
    graphed = te.make_graphed_callables(graphed_mod, (x0.clone().requires_grad_(True),),
                                        enabled=r is not None, recipe=r)
    assert graphed is graphed_mod
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1)
    for step in range(STEPS):
        x = randn(x0.shape, torch.bfloat16, "cuda", seed=step, scale=1.0 + step)
        g = randn(x0.shape[:-1] + (96 if "Linear" in module else 64,), torch.bfloat16, "cuda",
                  seed=step + 100)
        xe, xg = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
            ye = eager(xe)
        ye.backward(g)
        yg = graphed(xg)
        yg.backward(g)
        torch.testing.assert_close(yg, ye, rtol=0, atol=0, msg=f"step {step}: output")
        torch.testing.assert_close(xg.grad, xe.grad, rtol=0, atol=0, msg=f"step {step}: dgrad")
        for (n, pe), pg in zip(eager.named_parameters(), graphed.parameters()):
            torch.testing.assert_close(pg.grad, pe.grad, rtol=0, atol=0, msg=f"step {step}: {n}")
        for me, mg in zip(eager.modules(), graphed.modules()):
            if isinstance(me, te.module.base.TransformerEngineBaseModule):
                for a, b in zip(_state(me), _state(mg)):
                    torch.testing.assert_close(b, a, rtol=0, atol=0, msg=f"step {step}: fp8 state")
        opt_e.step()
        opt_g.step()
        opt_e.zero_grad(set_to_none=True)
        opt_g.zero_grad(set_to_none=True)
    if rname == "delayed" and module != "TransformerLayer":  # the replays advanced the history
        assert torch.count_nonzero(graphed._fp8_state.amax_history_fwd) > 0


@needs_gpu
def test_graphed_functions_and_tuples():
    lin1, lin2 = _module("Linear"), te.Linear(96, 64, params_dtype=torch.bfloat16, device="cuda")
    x = randn((64, 64), torch.bfloat16, "cuda").requires_grad_(True)
    h = randn((64, 96), torch.bfloat16, "cuda").requires_grad_(True)
    g1, g2 = te.make_graphed_callables((lin1, lin2), ((x,), (h,)))
    assert g1 is lin1 and g2 is lin2
    y = g2(g1(x))
    want = torch.nn.functional.linear(torch.nn.functional.linear(x, lin1.weight, lin1.bias),
                                      lin2.weight, lin2.bias)
    torch.testing.assert_close(y, want, rtol=1.6e-2, atol=1e-2)


def test_unsupported_options_and_context():
    lin = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16)
    with pytest.raises(NotImplementedError, match="make_graphed_callables: fp8_weight_caching"):
        te.make_graphed_callables(lin, (x,), fp8_weight_caching=True)
    with pytest.raises(NotImplementedError, match="make_graphed_callables: _order"):
        te.make_graphed_callables(lin, (x,), _order=[1, -1])
    with te.fp8_autocast(enabled=False), pytest.raises(RuntimeError, match="inside an FP8 autocast"):
        te.make_graphed_callables(lin, (x,))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_no_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="make_graphed_callables: CUDA graphs need a GPU"):
        te.make_graphed_callables(te.Linear(16, 16, device="cpu"), (torch.randn(16, 16),))


def test_exported_names():
    from transformer_engine.pytorch.graph import make_graphed_callables
    assert te.make_graphed_callables is make_graphed_callables


@pytest.mark.parametrize("name", ["LayerNormLinear", "LayerNormMLP"])
def test_released_capture_autograd_frees_the_module(name):
    # the CPU half: an output that keeps its autograd graph (as the static outputs of a capture
    # do) keeps a norm module alive through its Function's context until the release
    mod = getattr(te, name)(64, 96, device="cpu")
    x = torch.randn(8, 64, requires_grad=True)
    y = mod(x)
    y.sum().backward()
    ref = weakref.ref(mod)
    del mod
    gc.collect()
    assert ref() is not None
    graph_mod.release_captured_autograd(y, (x,))
    gc.collect()
    assert ref() is None
    assert y.grad_fn is not None  # the tensor itself is untouched


@needs_gpu
def test_graphed_module_is_freed_when_dropped():
    # its graphs (and any communicators they captured) go with it
    mod = te.LayerNormMLP(64, 96, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mod = te.make_graphed_callables(mod, (x,))
    mod(x).sum().backward()
    ref = weakref.ref(mod)
    del mod
    gc.collect()
    assert ref() is None
