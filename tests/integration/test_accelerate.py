"""Accelerate's FP8 path with the Transformer Engine backend on this library:
Accelerator(mixed_precision="fp8") prepares a model (its torch Linear / LayerNorm layers become
te layers, the forward runs under fp8_autocast) and trains it (FP8 emulated on the CPU reference
backend, natively on a GPU); the conversion helpers work on their own too."""
import pytest
import torch

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed")

import transformer_engine.pytorch as te  # noqa: E402


@pytest.fixture
def accelerator(installed_metadata):
    """An Accelerator(mixed_precision="fp8"); accelerate keeps one process-wide state, reset after."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import TERecipeKwargs
    AcceleratorState._reset_state(True)
    yield Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()],
                      cpu=not torch.cuda.is_available())
    AcceleratorState._reset_state(True)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 16))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(48, 32, generator=g), torch.randn(48, 16, generator=g)


def test_conversion_helpers(accelerator):
    from accelerate.utils.transformer_engine import convert_model, has_transformer_engine_layers
    model = _model()
    want = model(_data()[0])
    assert not has_transformer_engine_layers(model)
    with torch.no_grad():
        convert_model(model)
    assert has_transformer_engine_layers(model)
    assert isinstance(model[0], te.Linear) and isinstance(model[2], te.LayerNorm)
    # same weights, high precision outside fp8_autocast: the same function (te layers are made
    # on the default device, a GPU where there is one, as NV TE's are)
    dev = model[0].weight.device
    torch.testing.assert_close(model(_data()[0].to(dev)).cpu(), want, rtol=1e-5, atol=1e-5)


def test_accelerator_fp8_prepares_and_trains(accelerator, train):
    acc = accelerator
    model = _model()
    # prepare() converts the layers and points the optimizer at the new parameters
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    layers = [m for m in model.modules() if isinstance(m, (te.Linear, te.LayerNorm))]
    assert len(layers) == 3
    losses = train(acc, model, optimizer, *_data())
    assert losses[-1] < 0.9 * losses[0], losses
    # FP8 was on in the forward: the te Linears made FP8 recipe state
    assert all(m._fp8_state is not None for m in layers if isinstance(m, te.Linear))


def test_accelerator_bf16_trains_converted_layers(installed_metadata, train):
    """Accelerator(mixed_precision="bf16") over te layers from Accelerate's own convert_model:
    the te layers compute in bf16 under its torch.autocast, no FP8, and the model trains."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils.transformer_engine import convert_model
    AcceleratorState._reset_state(True)
    try:
        acc = Accelerator(mixed_precision="bf16", cpu=not torch.cuda.is_available())
        model = _model()
        with torch.no_grad():
            convert_model(model)
        model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
        # the client hands back fp32 outputs; the te layers inside compute in bf16
        dtypes = []
        model[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        losses = train(acc, model, optimizer, *_data())
        assert losses[-1] < 0.9 * losses[0], losses
        assert dtypes and set(dtypes) == {torch.bfloat16}, dtypes
        linears = [m for m in model.modules() if isinstance(m, te.Linear)]
        assert len(linears) == 2 and all(m._fp8_state is None for m in linears)
    finally:
        AcceleratorState._reset_state(True)
