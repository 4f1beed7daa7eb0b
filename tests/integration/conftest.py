"""Shared fixtures of the client-integration tests (Megatron-Core, Lightning, Accelerate).

Clients check the installed `transformer_engine` distribution's version through its metadata
(importlib.metadata). When the library runs from a source tree (PYTHONPATH) rather than an
install, `installed_metadata` writes the .dist-info an install would write (name and the
version from transformer_engine.__version__) into a temporary folder on sys.path. `train` runs
the same short regression loop through whichever client (its `backward` and `device`)."""
from __future__ import annotations

import importlib.metadata
import sys

import pytest
import torch


@pytest.fixture
def installed_metadata(tmp_path, monkeypatch):
    import transformer_engine
    try:
        dist = importlib.metadata.distribution("transformer_engine")
        if dist.version == transformer_engine.__version__:
            return dist.version
    except importlib.metadata.PackageNotFoundError:
        pass
    info = tmp_path / f"transformer_engine-{transformer_engine.__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer_engine\n"
                                   f"Version: {transformer_engine.__version__}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert importlib.metadata.version("transformer_engine") == transformer_engine.__version__
    return transformer_engine.__version__


def _train(client, model, optimizer, x, target, steps=12):
    """Losses of `steps` SGD steps of MSE regression, the backward through the client."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x.to(client.device))
        loss = torch.nn.functional.mse_loss(out.float(), target.to(client.device))
        client.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def train():
    """The clients' training loop (see _train)."""
    return _train
