"""FSDP2 (torch.distributed.fsdp.fully_shard) over te modules, run inside each rank of a
two-process group: gloo on the CPU (tests/pytorch/test_fsdp.py) and NCCL, one process per GPU
(tests/distributed/test_fsdp_nccl.py).

A LayerNormMLP + Linear stack is sharded over the group and trained on this rank's slice of each
batch; the same model with the same seed trains unsharded on the whole batch, and the mean of the
sharded losses must follow the unsharded loss step for step. Under quantized_model_init the GEMM
weights are Float8Tensors: they stay FP8 in their shards, are all-gathered as FP8 bytes (the bytes
sent in the first forward are counted) and the losses must agree within FP8 tolerance. Then the
sharded state goes through torch.distributed.checkpoint into a fresh sharded model, which must
give the same outputs."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
from utils import randn  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tolerances import tols  # noqa: E402

BATCH, HIDDEN, FFN = 32, 64, 96

# mean sharded loss against the unsharded loss: BF16/FP32 differ only in summation order; FP8
# weights differ in rounding (each shard is requantised on its own scale after an optimizer step)
LOSS_TOL = {"fp32": dict(rtol=1e-5, atol=1e-7), "fp8": tols("float8_e4m3")}

# largest norm-relative error of this rank's outputs against the unsharded model's. FP8: on a GPU
# the half batch and the whole batch take GEMMs that sum in another order, the wgrad sums meet in a
# reduce-scatter, and AdamW turns the last-bit differences of near-zero gradients into whole steps;
# the FP8 roundings then part the two trajectories, more with every step. The bound is the larger
# of a floor and half the unsharded FP8 model's own distance from its FP32 twin at that step (that
# distance starts near 0.15, the first step running at scale 1, and grows over the steps; on two
# H100s the sharded model was 0.27 of it at step 12). On the CPU the two agree to rounding.
OUT_BOUND = {"fp32": 1e-5, "fp8": 0.05}
FP8_NOISE_FACTOR = 0.5
# on a GPU the sharded half batch and the whole batch may take GEMM algorithms that sum in
# another order: FP32 results then differ in the last bits, which 20 AdamW steps carry on
GPU_FP32_SLACK = 10.0


def _recipe():
    return recipe.DelayedScaling(amax_history_len=4)


def build_model(precision: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    init = te.quantized_model_init(recipe=_recipe()) if precision == "fp8" else contextlib.nullcontext()
    with init:
        return torch.nn.Sequential(te.LayerNormMLP(HIDDEN, FFN, device=device),
                                   te.Linear(HIDDEN, HIDDEN, device=device))


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    for sub in model:
        fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _step_context(precision: str, group):
    if precision != "fp8":
        return contextlib.nullcontext()
    # amaxes reduced over the data-parallel group: every rank's activation scales are those of
    # the whole batch, as in the unsharded model
    return te.autocast(recipe=_recipe(), amax_reduction_group=group)


def expected_gather_bytes(model: torch.nn.Module, world: int) -> int:
    """Bytes one rank sends when every parameter is gathered once: FP8 weights as one byte per
    element plus a float32 inverse scale, the rest in their own dtype."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if isinstance(local, te.Float8Tensor):
            total += local._data.numel() + 4
        else:
            total += local.numel() * local.element_size()
    return total


# FSDP2's all-gather: all_gather_single in newer torch, all_gather_into_tensor before it
_GATHERS = ("all_gather_single", "all_gather_into_tensor")


@contextlib.contextmanager
def count_gathered_bytes():
    """Sums the input bytes of every FSDP2 all-gather inside the block (whichever of the
    collectives this torch's FSDP2 calls)."""
    sent = [0]
    originals = {name: getattr(dist, name) for name in _GATHERS if hasattr(dist, name)}

    def counting(original):
        def gather(output_tensor, input_tensor, *args, **kwargs):
            sent[0] += input_tensor.numel() * input_tensor.element_size()
            return original(output_tensor, input_tensor, *args, **kwargs)
        return gather

    for name, original in originals.items():
        setattr(dist, name, counting(original))
    try:
        yield sent
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def agree(ok: bool, msg: str, group, device: str) -> None:
    """Raises on every rank when the check failed on any: a rank that raised alone would leave
    the others waiting in their next collective."""
    flag = torch.tensor([1.0 if ok else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if not ok:
        raise AssertionError(msg)
    if flag.item() < 1.0:
        raise AssertionError("the check failed on another rank (its report says which)")


def run_fsdp_case(rank: int, world: int, group, device: str, precision: str, steps: int) -> None:
    """Raises AssertionError when the sharded model leaves the unsharded one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(torch.device(device).type, (world,))
    sharded, ref = shard(build_model(precision, device), mesh), build_model(precision, device)
    if precision == "fp8":
        weights = [p.to_local() for n, p in sharded.named_parameters() if n.endswith("weight")
                   and "layer_norm" not in n]
        assert weights and all(isinstance(w, te.Float8Tensor) for w in weights), \
            "fully_shard left a quantized_model_init weight shard in high precision"
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    twin = build_model("fp32", device) if precision == "fp8" else None
    twin_opt = (torch.optim.AdamW(twin.parameters(), lr=1e-2, foreach=True)
                if twin is not None else None)
    per = BATCH // world
    slack = GPU_FP32_SLACK if precision == "fp32" and torch.device(device).type == "cuda" else 1.0
    loss_tol = {k: v * slack for k, v in LOSS_TOL[precision].items()}
    for step in range(steps):
        x = randn((BATCH, HIDDEN), torch.float32, device, seed=100 + step)
        target = randn((BATCH, HIDDEN), torch.float32, device, seed=200 + step)
        mine = slice(rank * per, (rank + 1) * per)
        with count_gathered_bytes() as sent, _step_context(precision, group):
            out = sharded(x[mine])
            loss = (out - target[mine]).square().sum() / target.numel()
        if step == 0:
            want = expected_gather_bytes(sharded, world)
            agree(sent[0] == want, f"first forward all-gathered {sent[0]} bytes; expected {want}",
                  group, device)
        loss.backward()
        # each rank's loss is its share of the whole batch's mean, so that its output gradient
        # equals the unsharded model's on those rows (a gradient twice as large rounds
        # differently in FP8 before the scales adapt); FSDP averages the parameter gradients
        # over the ranks, which this undoes exactly (world is a power of two)
        for p in sharded.parameters():
            p.grad.mul_(world)
        opt.step()
        opt.zero_grad()
        with _step_context(precision, None):
            ref_out = ref(x)
            ref_loss = (ref_out - target).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        # the outputs themselves, not only the loss (which the target's variance dominates)
        err = (out.detach() - ref_out.detach()[mine]).norm() / ref_out.detach()[mine].norm()
        bound = OUT_BOUND[precision] * slack
        if twin is not None:
            twin_out = twin(x)
            (twin_out - target).square().mean().backward()
            twin_opt.step()
            twin_opt.zero_grad()
            noise = (ref_out.detach() - twin_out.detach()).norm() / twin_out.detach().norm()
            bound = max(bound, FP8_NOISE_FACTOR * float(noise))
        agree(bool(err <= bound),
              f"{precision} step {step}: output norm-relative error {float(err):.4g} > "
              f"{bound:.4g}", group, device)
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        torch.testing.assert_close(total, ref_loss.detach(), **loss_tol,
                                   msg=lambda m: f"{precision} step {step}: {m}")
    # the sharded state saved and loaded into a fresh sharded model gives the same outputs
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path, src=0, group=group)
    dcp.save({"model": sharded.state_dict()}, checkpoint_id=path[0])
    fresh = shard(build_model(precision, device), mesh)
    x = randn((per, HIDDEN), torch.float32, device, seed=7 + rank)
    if precision == "fp8":
        # a module makes its FP8 metadata (saved as extra state) on its first FP8 forward; the
        # load planner asks for the keys the fresh model has
        with torch.no_grad(), _step_context(precision, group):
            fresh(x)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=path[0])
    fresh.load_state_dict(state["model"])
    with _step_context(precision, group):
        want = sharded(x)
    with _step_context(precision, group):
        got = fresh(x)
    same = bool(torch.equal(got, want))
    agree(same, f"{precision} after DCP load: outputs differ from the saved model's "
                f"(largest difference {float((got - want).abs().max()):.4g})", group, device)
