"""MNIST-like digit classifier with te.Linear, trained in BF16 and in FP8 side by side.

Data: scikit-learn's bundled 8x8 digits (no download). Model: three te.Linear layers with GELU.
BF16 runs under torch.autocast with FP32 master weights; FP8 adds te.fp8_autocast with delayed
scaling (HYBRID: E4M3 forward, E5M2 gradients). Without a GPU it runs a few steps on the
reference backend.

    python examples/mnist_pytorch.py            # full length on a GPU, quick on CPU
    python examples/mnist_pytorch.py --quick --out /tmp/examples
"""
import numpy as np
import torch
import torch.nn.functional as F

import example_common as common
import transformer_engine.pytorch as te
from transformer_engine.common import recipe

NUM_CLASSES = 10
PADDED_CLASSES = 16  # FP8 GEMMs need feature sizes that are multiples of 16
BATCH = 128
HIDDEN = 256


class DigitsMLP(torch.nn.Module):
    def __init__(self, in_features: int, device: str):
        super().__init__()
        self.fc1 = te.Linear(in_features, HIDDEN, device=device)
        self.fc2 = te.Linear(HIDDEN, HIDDEN, device=device)
        self.head = te.Linear(HIDDEN, PADDED_CLASSES, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.head(x)[:, :NUM_CLASSES]


def main() -> int:
    has_gpu = torch.cuda.is_available()
    args = common.parse_args(__doc__.splitlines()[0], full_steps=3000, quick_steps=20,
                             has_gpu=has_gpu)
    device = "cuda" if has_gpu else "cpu"
    x_tr, y_tr, x_te, y_te = common.digits_split(args.seed)
    x_tr, x_te = torch.from_numpy(x_tr).to(device), torch.from_numpy(x_te).to(device)
    y_tr, y_te = torch.from_numpy(y_tr).to(device), torch.from_numpy(y_te).to(device)
    # one data order for both runs: the same batches in the same sequence
    order = np.random.default_rng(args.seed).integers(0, len(x_tr), size=(args.steps, BATCH))
    order = torch.from_numpy(order).to(device)
    fp8_recipe = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16,
                                       amax_compute_algo="max")

    def train(precision: str):
        torch.manual_seed(args.seed)
        model = DigitsMLP(x_tr.shape[1], device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
        use_fp8 = precision == "fp8"
        losses = []
        bar = common.progress(args.steps, f"digits {precision}", args.no_progress)
        for step in bar:
            idx = order[step]
            with torch.autocast(device, dtype=torch.bfloat16), \
                    te.fp8_autocast(enabled=use_fp8, fp8_recipe=fp8_recipe):
                logits = model(x_tr[idx])
            loss = F.cross_entropy(logits.float(), y_tr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
        model.eval()
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16), \
                te.fp8_autocast(enabled=use_fp8, fp8_recipe=fp8_recipe):
            pred = model(x_te).argmax(-1)
        accuracy = 100.0 * (pred == y_te).float().mean().item()
        return {"losses": losses, "metric": accuracy}

    results = common.run_both(train)
    return common.report("mnist_pytorch", "te.Linear digits classifier", "accuracy %", results,
                         args, torch.cuda.get_device_name() if has_gpu else "cpu")


if __name__ == "__main__":
    raise SystemExit(main())
