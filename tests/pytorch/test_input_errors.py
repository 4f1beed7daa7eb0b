"""Bad input is refused at the public module's entry, with an error that names the module and
its argument: non-float inputs of the modules, and thd cu_seqlens that are not cumulative
lengths within the tokens (decreasing, not starting at 0, past the end, wrong dtype or device);
an input on another device than the module's parameters."""
import pytest
import torch

import transformer_engine.pytorch as te

from utils import DEVICES, randn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_modules_name_themselves_for_non_float_input(device, dtype):
    cases = [(te.Linear(32, 48, device=device), (5, 32), "inp"),
             (te.LayerNormLinear(32, 48, device=device), (5, 32), "inp"),
             (te.LayerNormMLP(32, 48, device=device), (5, 32), "inp"),
             (te.LayerNorm(32, device=device), (5, 32), "inp"),
             (te.RMSNorm(32, device=device), (5, 32), "inp"),
             (te.MultiheadAttention(32, 2, device=device), (5, 2, 32), "hidden_states"),
             (te.TransformerLayer(32, 48, 2, device=device), (5, 2, 32), "hidden_states")]
    for module, shape, arg in cases:
        x = (randn(shape, torch.float32, device) * 4).to(dtype)
        name = type(module).__name__
        with pytest.raises(ValueError, match=f"^te\\.{name}: {arg} has dtype {str(dtype)[6:]}; "
                                             f"expected a floating-point tensor"):
            module(x)
        assert module(randn(shape, torch.float32, device)).shape[:-1] == shape[:-1]


def _thd(device, tokens=23, heads=2, dim=16):
    dpa = te.DotProductAttention(heads, dim, qkv_format="thd", attn_mask_type="padding_causal")
    q = randn((tokens, heads, dim), torch.float32, device, seed=1)
    return dpa, q


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cu, match", [
    ([0, 9, 5, 23], "cu_seqlens_q is not non-decreasing"),
    ([2, 9, 15, 23], "cu_seqlens_q starts at 2; expected 0"),
    ([0, 9, 15, 30], "cu_seqlens_q ends at 30, beyond the 23 tokens"),
])
def test_thd_cu_seqlens_are_checked(device, cu, match):
    dpa, q = _thd(device)
    good = torch.tensor([0, 9, 15, 23], dtype=torch.int32, device=device)
    bad = torch.tensor(cu, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=f"^DotProductAttention: {match}"):
        dpa(q, q, q, cu_seqlens_q=bad, cu_seqlens_kv=good)
    with pytest.raises(ValueError, match=f"^DotProductAttention: {match.replace('_q', '_kv')}"):
        dpa(q, q, q, cu_seqlens_q=good, cu_seqlens_kv=bad)
    assert dpa(q, q, q, cu_seqlens_q=good, cu_seqlens_kv=good).shape[0] == 23


@pytest.mark.parametrize("device", DEVICES)
def test_thd_cu_seqlens_dtype_and_device(device):
    dpa, q = _thd(device)
    good = torch.tensor([0, 9, 15, 23], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="DotProductAttention: cu_seqlens_q has dtype int64"):
        dpa(q, q, q, cu_seqlens_q=good.long(), cu_seqlens_kv=good)
    if device == "cuda":
        with pytest.raises(ValueError, match="DotProductAttention: cu_seqlens_kv is on cpu; "
                                             "expected the device of the tokens"):
            dpa(q, q, q, cu_seqlens_q=good, cu_seqlens_kv=good.cpu())



def _linear_callables(device):
    """(callable of x, the start of its error for an input on another device) for the modules
    with GEMMs and te.ops.Linear made on device, each taking a [32, 32] input."""
    grouped = te.GroupedLinear(2, 32, 48, device=device)
    return [(te.Linear(32, 48, device=device), "te.Linear: inp is on {} but weight is on "),
            (te.LayerNormLinear(32, 48, device=device),
             "te.LayerNormLinear: inp is on {} but layer_norm_weight is on "),
            (te.LayerNormMLP(32, 48, device=device),
             "te.LayerNormMLP: inp is on {} but layer_norm_weight is on "),
            (lambda x: grouped(x, [16, 16]), "te.GroupedLinear: inp is on {} but weight0 is on "),
            (te.ops.Linear(32, 48, device=device),
             r"transformer_engine.pytorch.ops.BasicLinear: input is on {}; expected [\w:]+, where "
             "the operation's parameters are")]


def _other_device(device):
    # the meta device stands in for a GPU on a CPU-only machine: no kernel may run on it either
    return "cpu" if device == "cuda" else "meta"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [None, te.recipe.DelayedScaling(),
                                    te.recipe.Float8CurrentScaling()],
                         ids=["hp", "delayed", "current"])
def test_input_on_another_device_than_the_parameters(device, recipe):
    """An input on another device than the module's parameters is refused before any kernel
    runs, naming the module, both devices and the parameter, in high precision and FP8 (the
    direct calls hand the kernels raw addresses: a GPU kernel given the host's faults, which
    ends the process's CUDA context). The module then runs on its own device as before."""
    fp8 = recipe is not None
    for module, error in _linear_callables(_other_device(device)):
        x = randn((32, 32), torch.float32, device, seed=3)
        with pytest.raises(ValueError, match="^" + error.format(x.device)):
            with te.autocast(enabled=fp8, recipe=recipe):
                module(x)
    for module, error in _linear_callables(device):
        wrong = randn((32, 32), torch.float32, _other_device(device), seed=4)
        with te.autocast(enabled=fp8, recipe=recipe):
            with pytest.raises(ValueError, match="^" + error.format(wrong.device)):
                module(wrong)
            y = module(randn((32, 32), torch.float32, device, seed=5).requires_grad_(True))
        y.float().sum().backward()
        assert torch.isfinite(y).all(), error
    if device == "cuda":
        torch.cuda.synchronize()  # no kernel ran on the wrong device's addresses


class _OnGPU1(torch.Tensor):
    """A CPU tensor that says it is on cuda:1 (what call_checked reads)."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 1


@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("through", ["call_checked", "DotProductAttention", "MultiheadAttention"])
def test_a_call_runs_with_the_inputs_gpu_current(monkeypatch, current, through):
    # an input on another GPU than the current one: the call runs inside torch.cuda.device of
    # the input's; on the current GPU, as it is (the GPU itself: tests/distributed). The
    # attention modules' own calls go through the same guard
    from transformer_engine.pytorch.module_parts import input_check
    entered = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            entered.append("exit")

    monkeypatch.setattr(input_check, "_current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device", Device)
    x = torch.ones(2, 4).as_subclass(_OnGPU1)
    seen = []

    def nn_call(module, *args, **kwargs):
        return seen.append(list(entered)) or "y"
    if through == "call_checked":
        out = input_check.call_checked(torch.nn.Identity(), "inp", nn_call, (x,), {})
    else:
        module = (te.DotProductAttention(2, 2) if through == "DotProductAttention"
                  else te.MultiheadAttention(4, 2))
        monkeypatch.setattr(torch.nn.Module, "__call__", nn_call)
        out = module(x, x, x) if through == "DotProductAttention" else module(x)
    assert out == "y"
    if current == 1:
        assert entered == [] and seen == [[]]
    else:
        assert seen == [[1]] and entered == [1, "exit"]
