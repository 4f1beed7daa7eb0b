"""Lightning Fabric with Transformer Engine layers on this library. --precision fp8 (default):
precision="transformer-engine", whose plugin checks the version, replaces torch Linear /
LayerNorm layers with te layers in setup_module and runs the forward under fp8_autocast.
--precision bf16: a model built from te layers under precision="bf16-mixed". The model trains
for --steps steps.
    python examples/integrations/fabric_te.py [--precision bf16] --out r.jsonl
Prints the loss of every step, checks that every TE layer is this library's and that FP8 ran
(or, in BF16, did not), and appends one JSON line to --out."""
from __future__ import annotations

import torch

from accelerate_fp8 import _precision, model_and_data
from common import check_ours, falling, fp8_ran, parse_args, write_result


def te_model(model: torch.nn.Sequential) -> torch.nn.Sequential:
    """The same model built from te layers, with the same weights."""
    import transformer_engine.pytorch as te
    layers = []
    for m in model:
        if isinstance(m, torch.nn.Linear):
            t = te.Linear(m.in_features, m.out_features, params_dtype=m.weight.dtype, device="cpu")
        elif isinstance(m, torch.nn.LayerNorm):
            t = te.LayerNorm(m.normalized_shape[0], eps=m.eps, params_dtype=m.weight.dtype, device="cpu")
        else:
            layers.append(m)
            continue
        with torch.no_grad():
            t.weight.copy_(m.weight)
            t.bias.copy_(m.bias)
        layers.append(t)
    return torch.nn.Sequential(*layers)


def main():
    args = parse_args(__doc__.splitlines()[0], _precision)
    fp8 = args.precision == "fp8"
    try:  # the `lightning` package, or `lightning-fabric` / `pytorch-lightning`
        import lightning as lightning_pkg
        from lightning.fabric import Fabric
    except ImportError:
        import lightning_fabric as lightning_pkg
        from lightning_fabric import Fabric
    fabric = Fabric(accelerator="cuda", devices=1,
                    precision="transformer-engine" if fp8 else "bf16-mixed")
    model, x, target = model_and_data()
    if not fp8:
        model = te_model(model)
    model = fabric.setup_module(model)  # replaces the layers: the optimizer comes after
    optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=1e-3))
    layers = check_ours(model)
    x, target = x.to(fabric.device), target.to(fabric.device)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), target)
        fabric.backward(loss)
        optimizer.step()
        losses.append(round(loss.item(), 4))
        print(f"step {step:2d}  loss {loss.item():.4f}")
    ran = fp8_ran(model)
    ok = falling(losses) and ran == fp8
    write_result(args.out, {"client": "lightning-fabric", "client_version": lightning_pkg.__version__,
                            "precision": "transformer-engine" if fp8 else "bf16-mixed",
                            "losses": losses,
                            "loss_falls": falling(losses), "fp8_ran": ran,
                            "te_layers": sorted({c for _, c in layers}),
                            "n_te_layers": len(layers), "ok": ok})
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
