"""Accelerate with Transformer Engine layers on this library. --precision fp8 (default):
Accelerator(mixed_precision="fp8") with its Transformer Engine backend, whose prepare() converts
the model's Linear / LayerNorm layers to te layers and runs the forward under fp8_autocast.
--precision bf16: the layers converted by Accelerate's own convert_model, then
Accelerator(mixed_precision="bf16") (torch.autocast). The model trains for --steps steps.
    python examples/integrations/accelerate_fp8.py [--precision bf16] --out r.jsonl
Prints the loss of every step, checks that every TE layer is this library's and that FP8 ran
(or, in BF16, did not), and appends one JSON line to --out."""
from __future__ import annotations

import torch

from common import check_ours, falling, fp8_ran, parse_args, write_result


def model_and_data(hidden=256, classes=16, tokens=512):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                                torch.nn.Linear(4 * hidden, hidden), torch.nn.LayerNorm(hidden),
                                torch.nn.Linear(hidden, classes * 16))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g)
    target = torch.randint(0, classes * 16, (tokens,), generator=g)
    return model, x, target


def _precision(p):
    p.add_argument("--precision", choices=("fp8", "bf16"), default="fp8")


def main():
    args = parse_args(__doc__.splitlines()[0], _precision)
    fp8 = args.precision == "fp8"
    import accelerate
    from accelerate import Accelerator
    from accelerate.utils import TERecipeKwargs
    model, x, target = model_and_data()
    if fp8:
        acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[
            TERecipeKwargs(fp8_format="HYBRID", amax_history_len=16)])
    else:
        acc = Accelerator(mixed_precision="bf16")  # accelerate's helpers need it made first
        from accelerate.utils.transformer_engine import convert_model
        with torch.no_grad():
            convert_model(model)
    model, optimizer = acc.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    layers = check_ours(model)
    x, target = x.to(acc.device), target.to(acc.device)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), target)
        acc.backward(loss)
        optimizer.step()
        losses.append(round(loss.item(), 4))
        print(f"step {step:2d}  loss {loss.item():.4f}")
    ran = fp8_ran(model)
    ok = falling(losses) and ran == fp8
    write_result(args.out, {"client": "accelerate", "client_version": accelerate.__version__,
                            "precision": args.precision, "losses": losses, "loss_falls": falling(losses),
                            "fp8_ran": ran, "te_layers": sorted({c for _, c in layers}),
                            "n_te_layers": len(layers), "ok": ok})
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
