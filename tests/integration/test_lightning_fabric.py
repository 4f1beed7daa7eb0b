"""Lightning Fabric's precision="transformer-engine" on this library: the plugin's version check
passes, its layer replacement builds te.Linear / te.LayerNorm, and a tiny model trains (FP8
emulated on the CPU reference backend, natively on a GPU)."""
import importlib.util

import pytest
import torch

# Fabric ships in the `lightning` package (lightning.fabric) and in `lightning-fabric` /
# `pytorch-lightning` (lightning_fabric)
if importlib.util.find_spec("lightning") is not None:
    from lightning.fabric import Fabric
elif importlib.util.find_spec("lightning_fabric") is not None:
    from lightning_fabric import Fabric
else:
    pytest.skip("Lightning Fabric is not installed", allow_module_level=True)

import transformer_engine.pytorch as te  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 16))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(48, 32, generator=g), torch.randn(48, 16, generator=g)


def test_fabric_transformer_engine_precision_trains(installed_metadata, train):
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    fabric = Fabric(accelerator=accelerator, devices=1, precision="transformer-engine")
    # the plugin replaces layers when the module is set up: the optimizer takes the new parameters
    model = fabric.setup_module(_model())
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.05))
    layers = [m for m in model.modules() if type(m).__module__.startswith("transformer_engine.pytorch")]
    assert {type(m).__name__ for m in layers} == {"Linear", "LayerNorm"}
    assert all(isinstance(m, (te.Linear, te.LayerNorm)) for m in layers)
    losses = train(fabric, model, optimizer, *_data())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses
    # the plugin's forward context turned FP8 on: the TE linears made FP8 state
    assert all(m._fp8_state is not None for m in layers if isinstance(m, te.Linear))


def test_fabric_bf16_mixed_trains_te_layers(train):
    """precision="bf16-mixed" over a model built from te layers: they compute in bf16 under
    Fabric's autocast, no FP8, and the model trains."""
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    fabric = Fabric(accelerator=accelerator, devices=1, precision="bf16-mixed")
    torch.manual_seed(0)
    model = torch.nn.Sequential(te.Linear(32, 64, device="cpu"), torch.nn.GELU(),
                                te.LayerNorm(64, device="cpu"), te.Linear(64, 16, device="cpu"))
    # Fabric hands back fp32 outputs; the te layers inside compute in bf16
    dtypes = []
    model[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.05))
    losses = train(fabric, model, optimizer, *_data())
    assert losses[-1] < 0.9 * losses[0], losses
    assert dtypes and set(dtypes) == {torch.bfloat16}, dtypes
    assert all(m._fp8_state is None for m in model.modules() if isinstance(m, te.Linear))
