"""Float8Tensor: FP8 data + scale_inv behaving as its dequantised value, in-place updates that
re-quantise, pickling, the transpose cache, and fp8_model_init storing weights in FP8 only."""
import io

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.kernels.cast import fp8_max_of

from utils import DEVICES, randn, tols


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_bits_and_plain_use(device, dtype):
    x = randn((37, 48), dtype, device, seed=1, scale=3.0)
    fp8 = te.fp8_dtype("e4m3", device)
    t = te.Float8Tensor.quantize(x, fp8)
    assert t.dtype == dtype and t.shape == x.shape and t._data.dtype == fp8
    scale = torch.tensor([fp8_max_of(fp8)], device=device) / x.float().abs().max().reshape(1)
    data, scale_inv = te.kernels.quantize(x, scale, fp8)
    assert torch.equal(t._data.view(torch.uint8), data.view(torch.uint8))
    assert torch.equal(t._scale_inv, scale_inv)
    deq = te.kernels.dequantize(data, scale_inv, dtype)
    assert torch.equal(t + 1, deq + 1)
    assert torch.equal(t.dequantize(), deq)
    torch.testing.assert_close(deq.float(), x.float(), **tols("float8_e4m3"))


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_update_requantizes_and_drops_transpose(device):
    x = randn((32, 48), torch.bfloat16, device, seed=2)
    t = te.Float8Tensor.quantize(x, te.fp8_dtype("e4m3", device))
    tr = t.transpose_fp8()
    assert torch.equal(tr.view(torch.uint8), te.kernels.transpose(t._data).view(torch.uint8))
    before = t.dequantize()
    delta = randn((32, 48), torch.bfloat16, device, seed=3, scale=4.0)
    t.add_(delta)
    assert isinstance(t, te.Float8Tensor) and t._transpose_cache is None
    torch.testing.assert_close(t.dequantize().float(), (before + delta).float(), **tols("float8_e4m3"))


@pytest.mark.parametrize("device", DEVICES)
def test_pickle_round_trip(device):
    t = te.Float8Tensor.quantize(randn((16, 32), torch.bfloat16, device, seed=4), te.fp8_dtype("e4m3", device))
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert isinstance(back, te.Float8Tensor) and back.dtype == t.dtype
    assert torch.equal(back._data.view(torch.uint8), t._data.view(torch.uint8))


def _param_bytes(module):
    total = 0
    for p in module.parameters():
        data = p._data if isinstance(p, te.Float8Tensor) else p
        total += data.numel() * data.element_size()
    return total


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_model_init_stores_weights_in_fp8_only(device):
    """The weights are Float8Tensors and the modules' parameter memory drops (storage size on
    every device; allocated CUDA memory on the GPU)."""
    def build():
        return te.LayerNormMLP(256, 1024, params_dtype=torch.bfloat16, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    hp = build()
    if device == "cuda":
        hp_mem = torch.cuda.memory_allocated() - base
        del hp
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        hp = None
    with te.fp8_model_init(enabled=True):
        q = build()
    assert isinstance(q.fc1_weight, te.Float8Tensor) and isinstance(q.fc1_weight, torch.nn.Parameter)
    assert isinstance(q.fc2_weight, te.Float8Tensor)
    weights_hp = 2 * (256 * 1024) * 2
    if device == "cuda":
        q_mem = torch.cuda.memory_allocated() - base
        assert hp_mem - q_mem >= weights_hp // 2 * 0.9, (hp_mem, q_mem)
    else:
        assert _param_bytes(build()) - _param_bytes(q) == weights_hp // 2


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_weights_match_high_precision_and_train(device):
    """Same values in FP8 and high-precision weights give the same FP8 forward (the weights
    made under the recipe the forward runs: the same cast); SGD steps on Float8Tensor weights
    reduce a regression loss."""
    torch.manual_seed(0)
    with te.fp8_model_init(enabled=True, recipe=recipe.Float8CurrentScaling()):
        q = te.Linear(64, 32, device=device)
    hp = te.Linear(64, 32, device=device)
    with torch.no_grad():
        hp.weight.copy_(q.weight.dequantize())
        hp.bias.copy_(q.bias)
    x = randn((64, 64), torch.float32, device, seed=5)
    r = recipe.Float8CurrentScaling()
    with te.autocast(recipe=r):
        a, b = q(x), hp(x)
    assert torch.equal(a, b)
    target = randn((64, 32), torch.float32, device, seed=6, scale=0.1)
    opt = torch.optim.SGD(q.parameters(), lr=0.05)
    losses = []
    for _ in range(5):
        with te.autocast(recipe=r):
            loss = (q(x) - target).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        assert isinstance(q.weight, te.Float8Tensor)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_weights_survive_deepcopy_and_casts(device):
    """deepcopy copies the FP8 data (not shared); .half()/.to(bf16) change the nominal dtype only."""
    import copy
    with te.fp8_model_init(enabled=True):
        m = te.LayerNormMLP(64, 128, device=device)
    twin = copy.deepcopy(m)
    assert isinstance(twin.fc1_weight, te.Float8Tensor) and isinstance(twin.fc1_weight, torch.nn.Parameter)
    assert twin.fc1_weight._data.data_ptr() != m.fc1_weight._data.data_ptr()
    x = randn((16, 64), torch.float32, device, seed=7)
    assert torch.equal(m(x), twin(x))
    raw = m.fc2_weight._data.clone()
    m.half()
    assert isinstance(m.fc2_weight, te.Float8Tensor) and m.fc2_weight.dtype == torch.float16
    assert torch.equal(m.fc2_weight._data.view(torch.uint8), raw.view(torch.uint8))
    assert m(x.half()).dtype == torch.float16


def test_deferred_init_under_fp8_model_init():
    """device='meta' defers the weights; to_empty + reset_parameters then stores them in FP8."""
    with te.fp8_model_init(enabled=True):
        m = te.Linear(64, 48, device="meta")
    assert m.weight.is_meta
    m = m.to_empty(device="cpu")
    m.reset_parameters()
    assert isinstance(m.weight, te.Float8Tensor) and isinstance(m.weight, torch.nn.Parameter)
    assert 0.01 < float(m.weight.dequantize().std()) < 0.04  # the default init, std 0.023
    assert m(randn((16, 64), torch.float32, "cpu")).shape == (16, 48)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("fp8_recipe", ["delayed", "current"])
def test_inference_mode_makes_no_weight_transpose(device, module, fp8_recipe):
    """Under torch.inference_mode no backward follows: FP8 weights keep no transposed copy, and
    the output equals the one computed under no_grad."""
    r = recipe.DelayedScaling() if fp8_recipe == "delayed" else recipe.Float8CurrentScaling()
    build = {"Linear": lambda: te.Linear(64, 64, device=device),
             "LayerNormLinear": lambda: te.LayerNormLinear(64, 64, device=device),
             "LayerNormMLP": lambda: te.LayerNormMLP(64, 64, device=device)}[module]
    with torch.no_grad(), te.quantized_model_init(enabled=True, recipe=r):
        m = build()
    x = randn((32, 64), torch.float32, device, seed=4)
    with torch.inference_mode(), te.autocast(recipe=r):
        y = m(x)
    fp8_weights = [p for p in m.parameters() if isinstance(p, te.Float8Tensor)]
    assert fp8_weights and all(p._transpose is None and p._transpose_invalid for p in fp8_weights)
    with torch.no_grad(), te.autocast(recipe=r):
        y_ref = m(x)
    # (delayed scaling: the second call casts with the scale the first one's amax updated)
    torch.testing.assert_close(y, y_ref, **(dict(rtol=0, atol=0) if fp8_recipe == "current"
                                            else tols(torch.float8_e4m3fn)))
