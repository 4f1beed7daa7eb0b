"""A module on a GPU other than the current one (model.to('cuda:1') without
torch.cuda.set_device(1)) gives the bits of the same module on the current GPU, forward and
every gradient, in high precision and FP8 (TransformerLayer within the tolerance table: its
attention backward may sum in any order): its call runs with the input's GPU current
(module_parts/input_check.call_checked). DotProductAttention and MultiheadAttention called on
their own likewise, on each attention backend; and a backward with autograd multithreading
off, run on the calling thread. One process, two GPUs; the GPUS=2 mode of .ci/gpu_verify.sh
runs it."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe
from tolerances import tols


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _make(name):
    if name == "Linear":
        return te.Linear(64, 96, params_dtype=torch.bfloat16, device="cuda:0")
    if name == "LayerNormLinear":
        return te.LayerNormLinear(64, 96, params_dtype=torch.bfloat16, device="cuda:0")
    if name == "LayerNormMLP":
        return te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16, device="cuda:0")
    return te.TransformerLayer(64, 128, 4, params_dtype=torch.bfloat16, device="cuda:0",
                               hidden_dropout=0.0, attention_dropout=0.0)


def _step(module, x, dy, recipe):
    x = x.clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = module(x)
    y.backward(dy)
    grads = [p.grad for _, p in sorted(module.named_parameters())]
    return [t.cpu() for t in [y, x.grad] + grads]


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP", "TransformerLayer"])
@pytest.mark.parametrize("recipe", [None, te_recipe.DelayedScaling(),
                                    te_recipe.Float8CurrentScaling()],
                         ids=["bf16", "delayed", "current"])
def test_module_on_a_gpu_that_is_not_current(name, recipe):
    torch.cuda.set_device(0)
    torch.manual_seed(5)
    here = _make(name)
    there = copy.deepcopy(here).to("cuda:1")
    shape = (32, 2, 64) if name == "TransformerLayer" else (64, 64)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(shape, generator=gen).to(torch.bfloat16)
    dy = torch.randn(shape if name != "Linear" and name != "LayerNormLinear" else (64, 96),
                     generator=gen).to(torch.bfloat16)
    for _ in range(2):  # the second step reads the first's delayed scales
        want = _step(here, x.to("cuda:0"), dy.to("cuda:0"), recipe)
        got = _step(there, x.to("cuda:1"), dy.to("cuda:1"), recipe)
        assert torch.cuda.current_device() == 0
        for i, (a, b) in enumerate(zip(got, want)):
            _same(name, a, b, i)
        for p in list(here.parameters()) + list(there.parameters()):
            p.grad = None
    if recipe is not None:
        # no backward follows: the delayed update runs at the autocast's exit, outside any call
        with torch.no_grad(), te.autocast(recipe=recipe):
            want = here(x.to("cuda:0")).cpu()
            got = there(x.to("cuda:1")).cpu()
        _same(name, got, want, "inference")
        for m0, m1 in zip(here.modules(), there.modules()):
            s0, s1 = getattr(m0, "_fp8_state", None), getattr(m1, "_fp8_state", None)
            assert (s0 is None) == (s1 is None)
            if s0 is not None and s0.delayed:
                assert torch.equal(s0.scale_fwd.cpu(), s1.scale_fwd.cpu()), type(m0).__name__
    torch.cuda.synchronize(1)


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("name", ["Linear", "LayerNormMLP"])
def test_backward_without_autograd_threads_on_a_gpu_that_is_not_current(name):
    # with multithreading off the backward runs on this thread, whose current GPU is cuda:0:
    # autograd makes each node's forward stream (and so its GPU) current around the node
    torch.cuda.set_device(0)
    torch.manual_seed(9)
    here = _make(name)
    there = copy.deepcopy(here).to("cuda:1")
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(64, 64, generator=gen).to(torch.bfloat16)
    dy = torch.randn(64, 96 if name == "Linear" else 64, generator=gen).to(torch.bfloat16)
    recipe = te_recipe.DelayedScaling()
    with torch.autograd.set_multithreading_enabled(False):
        want = _step(here, x.to("cuda:0"), dy.to("cuda:0"), recipe)
        got = _step(there, x.to("cuda:1"), dy.to("cuda:1"), recipe)
    assert torch.cuda.current_device() == 0
    for i, (a, b) in enumerate(zip(got, want)):
        _same(name, a, b, i)
    torch.cuda.synchronize(1)


def _same(name, a, b, what):
    if name == "TransformerLayer":  # the attention backward may sum in any order
        torch.testing.assert_close(a, b, **tols(a.dtype))
    else:
        assert torch.equal(a, b), (name, what)


# the attention backends by their switches: the default order (cuDNN first), the portable
# kernel, the unfused path
_BACKENDS = {"default": {}, "portable": {"NVTE_FUSED_ATTN": "0", "NVTE_SDPA_ATTN": "0"},
             "unfused": {"NVTE_FUSED_ATTN": "0", "NVTE_SDPA_ATTN": "0", "NVTE_FLASH_ATTN": "0"}}


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("name", ["DotProductAttention", "MultiheadAttention"])
@pytest.mark.parametrize("backend", list(_BACKENDS))
def test_attention_on_a_gpu_that_is_not_current(monkeypatch, name, backend):
    for var, value in _BACKENDS[backend].items():
        monkeypatch.setenv(var, value)
    torch.cuda.set_device(0)
    torch.manual_seed(7)
    if name == "DotProductAttention":
        here = te.DotProductAttention(4, 16, attn_mask_type="causal", attention_dropout=0.0)
        shape, out_shape = (32, 2, 4, 16), (32, 2, 64)
    else:
        here = te.MultiheadAttention(64, 4, params_dtype=torch.bfloat16, device="cuda:0",
                                     attention_dropout=0.0, attn_mask_type="causal")
        shape = out_shape = (32, 2, 64)
    there = copy.deepcopy(here).to("cuda:1")
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=gen).to(torch.bfloat16)
    dy = torch.randn(out_shape, generator=gen).to(torch.bfloat16)

    def step(module, device):
        inp = x.to(device).requires_grad_(True)
        y = module(inp, inp, inp) if name == "DotProductAttention" else module(inp)
        y.backward(dy.to(device))
        grads = [p.grad for _, p in sorted(module.named_parameters())]
        return [t.cpu() for t in [y, inp.grad] + grads]

    want = step(here, "cuda:0")
    got = step(there, "cuda:1")
    assert torch.cuda.current_device() == 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tols(a.dtype))
    torch.cuda.synchronize(1)
