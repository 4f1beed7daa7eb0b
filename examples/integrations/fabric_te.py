"""Lightning Fabric's precision="transformer-engine" on this library: the plugin's version check
passes, setup_module replaces torch Linear / LayerNorm layers with te layers, the forward runs
under fp8_autocast; the model trains for --steps steps.
    python examples/integrations/fabric_te.py --out r.jsonl
Prints the loss of every step, checks that every TE layer is this library's and that FP8 ran,
and appends one JSON line to --out."""
from __future__ import annotations

import torch

from accelerate_fp8 import model_and_data
from common import check_ours, falling, fp8_ran, parse_args, write_result


def main():
    args = parse_args(__doc__.splitlines()[0])
    try:  # the `lightning` package, or `lightning-fabric` / `pytorch-lightning`
        import lightning as lightning_pkg
        from lightning.fabric import Fabric
    except ImportError:
        import lightning_fabric as lightning_pkg
        from lightning_fabric import Fabric
    fabric = Fabric(accelerator="cuda", devices=1, precision="transformer-engine")
    model, x, target = model_and_data()
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
    ok = falling(losses) and ran
    write_result(args.out, {"client": "lightning-fabric", "client_version": lightning_pkg.__version__,
                            "precision": "transformer-engine", "losses": losses,
                            "loss_falls": falling(losses), "fp8_ran": ran,
                            "te_layers": sorted({c for _, c in layers}),
                            "n_te_layers": len(layers), "ok": ok})
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
