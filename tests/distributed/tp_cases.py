"""The tensor-parallel cases of the multi-GPU suite, run inside each rank of an NCCL group (one
process per GPU). Every case builds the unsplit module and its split twin from the same weights,
steps both twice under the same recipe (the second step runs on the scales the first one's amaxes
made, reduced over the group for DelayedScaling), and reports how far the split outputs and
gradients are from the unsplit ones."""
from __future__ import annotations

import copy
import dataclasses
import gc

import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

HIDDEN, FFN, HEADS, GROUPS, SEQ, BATCH = 256, 512, 8, 4, 64, 2
DEVICE = "cuda"  # the suite runs one process per GPU; a gloo run on the CPU may set "cpu"

# parameters split by rows (column-parallel) and by columns (row-parallel); the rest are replicated
COLUMN_SPLIT = ("layernorm_qkv.weight", "layernorm_qkv.bias", "query_weight", "query_bias",
                "key_weight", "key_bias", "value_weight", "value_bias", "fc1_weight", "fc1_bias")
ROW_SPLIT = ("proj.weight", "fc2_weight")

# largest norm-relative error allowed against the unsplit module in the same precision: the
# split and unsplit modules differ in summation order (and, under current scaling, in the
# per-shard weight scales), never in the data. In FP8 the bound is also at least NOISE_FACTOR
# times the unsplit FP8 module's own distance from its BF16 twin: two FP8 runs whose scales
# differ in the last bits round differently, and through a deep block (TransformerLayer) that
# noise grows past a fixed bound, while a missing collective or a wrong shard gives errors of
# order one
BOUND = {"bf16": 3e-2, "delayed": 1e-1, "current": 1.5e-1}
NOISE_FACTOR = 2.0

RECIPES = {
    "bf16": None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": lambda: recipe.Float8CurrentScaling(),
}


@dataclasses.dataclass(frozen=True)
class Case:
    module: str          # linear_column | linear_row | layernorm_linear | layernorm_mlp | layernorm_mlp_swiglu | mha | transformer_layer
    sp: bool             # sequence parallelism
    precision: str       # bf16 | delayed | current
    extra: str = ""      # return_bias | return_layernorm_output

    @property
    def name(self) -> str:
        tail = f"-{self.extra}" if self.extra else ""
        return f"{self.module}-{'sp' if self.sp else 'tp'}-{self.precision}{tail}"


def all_cases() -> list[Case]:
    cases = []
    for module in ("linear_column", "linear_row", "layernorm_linear", "layernorm_mlp",
                   "layernorm_mlp_swiglu", "mha", "transformer_layer"):
        for sp in (False, True):
            for precision in RECIPES:
                cases.append(Case(module, sp, precision))
    cases += [Case("linear_row", True, "bf16", "return_bias"),
              Case("layernorm_linear", True, "delayed", "return_layernorm_output"),
              Case("layernorm_mlp", False, "current", "return_layernorm_output")]
    return cases


def _shard(name: str, t: torch.Tensor, rank: int, world: int, module: str) -> torch.Tensor:
    if module.endswith("swiglu") and name.endswith(("fc1_weight", "fc1_bias")):
        # a gated FC1 holds [activation input; gate] halves, each split over the ranks
        return torch.cat([half.chunk(world, 0)[rank] for half in t.chunk(2, 0)])
    if module == "linear_column" or module == "layernorm_linear":
        return t.chunk(world, 0)[rank] if name in ("weight", "bias") else t
    if module == "linear_row":
        return t.chunk(world, 1)[rank] if name == "weight" else t
    if name.endswith(COLUMN_SPLIT):
        return t.chunk(world, 0)[rank]
    if name.endswith(ROW_SPLIT):
        return t.chunk(world, 1)[rank]
    return t


def _build(case: Case, group, world: int):
    """(unsplit, split) modules, bf16 parameters on this rank's GPU."""
    kw = dict(params_dtype=torch.bfloat16, device=DEVICE)
    par = dict(tp_group=group, tp_size=world, sequence_parallel=case.sp)
    extra = {case.extra: True} if case.extra else {}
    m = case.module
    if m == "linear_column":
        return (te.Linear(HIDDEN, FFN, **kw),
                te.Linear(HIDDEN, FFN, parallel_mode="column", **par, **kw))
    if m == "linear_row":
        return (te.Linear(FFN, HIDDEN, **extra, **kw),
                te.Linear(FFN, HIDDEN, parallel_mode="row", **par, **extra, **kw))
    if m == "layernorm_linear":
        return (te.LayerNormLinear(HIDDEN, FFN, **extra, **kw),
                te.LayerNormLinear(HIDDEN, FFN, parallel_mode="column", **par, **extra, **kw))
    if m.startswith("layernorm_mlp"):
        act = dict(activation="swiglu") if m.endswith("swiglu") else {}
        return (te.LayerNormMLP(HIDDEN, FFN, **act, **extra, **kw),
                te.LayerNormMLP(HIDDEN, FFN, set_parallel_mode=True, **par, **act, **extra, **kw))
    attn = dict(num_gqa_groups=GROUPS, attention_dropout=0.0, attn_mask_type="causal")
    if m == "mha":
        return (te.MultiheadAttention(HIDDEN, HEADS, input_layernorm=True, fuse_qkv_params=True, **attn, **kw),
                te.MultiheadAttention(HIDDEN, HEADS, input_layernorm=True, fuse_qkv_params=True,
                                      set_parallel_mode=True, **par, **attn, **kw))
    layer = dict(num_gqa_groups=GROUPS, hidden_dropout=0.0, attention_dropout=0.0,
                 self_attn_mask_type="causal", fuse_qkv_params=True)
    return (te.TransformerLayer(HIDDEN, FFN, HEADS, **layer, **kw),
            te.TransformerLayer(HIDDEN, FFN, HEADS, set_parallel_mode=True, **par, **layer, **kw))


def _input_shape(case: Case):
    return (SEQ, BATCH, FFN if case.module == "linear_row" else HIDDEN)


def _seq_chunk(t: torch.Tensor, case: Case, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world, 0)[rank].contiguous() if case.sp else t


def _in_chunk(t: torch.Tensor, case: Case, rank: int, world: int) -> torch.Tensor:
    """This rank's part of the unsplit input: a row-parallel Linear takes its input features,
    everything else its sequence part under sequence parallelism."""
    if case.module == "linear_row":
        return t.chunk(world, -1)[rank].contiguous()
    return _seq_chunk(t, case, rank, world)


def _out_chunk(t: torch.Tensor, case: Case, rank: int, world: int) -> torch.Tensor:
    """The part of the unsplit output this rank's split module returns."""
    if case.module in ("linear_column", "layernorm_linear"):
        return t.chunk(world, -1)[rank]          # column-parallel: its output features
    return _seq_chunk(t, case, rank, world)      # row-parallel end: the whole features, its sequence part


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _check_scales_equal(full, part):
    """Delayed scaling with the amaxes reduced over the group: every split module's scales equal
    the unsplit module's bit for bit (the weight amax is the largest over the shards, the input's
    over the sequence parts)."""
    states_f = [m._fp8_state for m in full.modules() if getattr(m, "_fp8_state", None) is not None]
    states_p = [m._fp8_state for m in part.modules() if getattr(m, "_fp8_state", None) is not None]
    if not states_f or len(states_f) != len(states_p):
        raise AssertionError(f"FP8 states: {len(states_f)} unsplit vs {len(states_p)} split")
    for i, (a, b) in enumerate(zip(states_f, states_p)):
        # within 5 %: a GEMM's input amax downstream of an FP8 GEMM moves by a few per cent with
        # its rounding; a missing reduction shows as a factor of 1.5 or more (the last shard's
        # weights and the second half of the sequence are scaled up by 1.5 in run_case; larger
        # factors make the attention softmax so peaked that FP8 rounding alone moves the
        # gradients by tens of per cent)
        if not torch.allclose(a.scale_fwd, b.scale_fwd, rtol=5e-2, atol=0):
            raise AssertionError(f"forward scales of FP8 state {i} differ: {a.scale_fwd} vs {b.scale_fwd}")


def _copy_weights(full, part, case: Case, rank: int, world: int, gen) -> None:
    with torch.no_grad():
        for n, p in full.named_parameters():
            base = 1.0 if "layer_norm_weight" in n else 0.0
            p.copy_(base + 0.02 * torch.randn(p.shape, generator=gen).to(p))
            if p.dim() == 2:
                # larger values in the last shard's rows and columns, so that each rank's amax
                # differs and a missing amax reduction shows in the scales
                p[-(p.shape[0] // 4):] *= 1.5
                p[:, -(p.shape[1] // 4):] *= 1.5
        src = dict(full.named_parameters())
        for n, p in part.named_parameters():
            s = _shard(n, src[n], rank, world, case.module)
            if p.shape != s.shape:
                raise AssertionError(f"{n}: split {tuple(p.shape)} vs shard of unsplit {tuple(s.shape)}")
            p.copy_(s)


def _results(case: Case, rank: int, world: int, x, yf, yp, xf, xp, full, part, group) -> dict:
    """Norm-relative distance of every split output and gradient from the unsplit module's."""
    res = {"output": _rel(yp[0], _out_chunk(yf[0].detach(), case, rank, world))}
    if case.extra == "return_bias":
        res["bias_output"] = _rel(yp[1], yf[1].detach())
    if case.extra == "return_layernorm_output":
        res["layernorm_output"] = _rel(yp[-1], _seq_chunk(yf[-1].detach(), case, rank, world))
    res["dx"] = _rel(xp.grad, _in_chunk(xf.grad, case, rank, world))
    grads = dict(full.named_parameters())
    for n, p in part.named_parameters():
        g = p.grad
        if g is None:
            raise AssertionError(f"{n}: no gradient")
        if group is not None and getattr(p, "sequence_parallel", False):
            g = g.clone()
            dist.all_reduce(g, group=group)  # what a training loop does for SP parameters
        res[f"d{n}"] = _rel(g, _shard(n, grads[n].grad, rank, world, case.module))
    return res


def run_case(case: Case, group, rank: int, world: int) -> dict:
    """{quantity: [error, allowed]} for the second step's outputs and gradients."""
    gen = torch.Generator(device="cpu").manual_seed(1234)
    full, part = _build(case, group, world)
    _copy_weights(full, part, case, rank, world, gen)
    make = RECIPES[case.precision]
    # the unsplit module's BF16 twin (same weights), the measure of FP8's own noise
    twin = copy.deepcopy(full) if make is not None else None
    report = {}
    for step in range(2):
        x = torch.randn(_input_shape(case), generator=gen)
        x[SEQ // 2:] *= 1.5  # the sequence parts differ in amax too
        x = x.to(DEVICE, torch.bfloat16)
        full.zero_grad(set_to_none=True)
        part.zero_grad(set_to_none=True)
        xf = x.clone().requires_grad_()
        xp = _in_chunk(x, case, rank, world).clone().requires_grad_()
        if make is None:
            yf, yp = _outputs(full(xf)), _outputs(part(xp))
        else:
            with te.fp8_autocast(enabled=True, fp8_recipe=make()):
                yf = _outputs(full(xf))
            with te.fp8_autocast(enabled=True, fp8_recipe=make(), fp8_group=group):
                yp = _outputs(part(xp))
        dy_full = torch.randn(yf[0].shape, generator=gen).to(DEVICE, torch.bfloat16)
        if case.extra == "return_bias":  # the caller adds the returned bias
            yf, yp = (yf[0] + yf[1],) + yf[1:], (yp[0] + yp[1],) + yp[1:]
        yf[0].backward(dy_full)
        yp[0].backward(_out_chunk(dy_full, case, rank, world))
        if step == 0:
            continue
        # the collectives first (SP gradients are all-reduced in _results): a check that raised
        # on one rank before them would leave the other waiting
        errors = _results(case, rank, world, x, yf, yp, xf, xp, full, part, group)
        if case.precision == "delayed":
            _check_scales_equal(full, part)
        noise = {}
        if twin is not None:
            twin.zero_grad(set_to_none=True)
            xt = x.clone().requires_grad_()
            yt = _outputs(twin(xt))
            if case.extra == "return_bias":
                yt = (yt[0] + yt[1],) + yt[1:]
            yt[0].backward(dy_full)
            # the unsplit FP8 module against its BF16 twin: both whole, so "rank 0 of 1"
            unsplit = dataclasses.replace(case, sp=False, module="twin")
            noise = _results(unsplit, 0, 1, x, yt, yf, xt, xf, twin, full, None)
        bound = BOUND[case.precision]
        for k, err in errors.items():
            report[k] = [err, max(bound, NOISE_FACTOR * noise.get(k, 0.0))]
    return report


def run_graphed(module: str, group, rank: int, world: int) -> dict:
    """{quantity: [error, allowed]} of a split, sequence-parallel BF16 module replayed from CUDA
    graphs (te.make_graphed_callables, its collectives captured) against the same module run
    eagerly: output, input gradient and every parameter gradient of three replays on new
    inputs. The collectives the schedule picks (copy engines, NCCL) must capture and replay."""
    case = Case(module, True, "bf16")
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    _, eager = _build(case, group, world)
    _, graphed_module = _build(case, group, world)  # (a deep copy would copy the group too)
    graphed_module.load_state_dict(eager.state_dict())
    shape = (SEQ // world, BATCH, _input_shape(case)[-1])
    sample = torch.randn(shape, generator=gen).to(DEVICE, torch.bfloat16).requires_grad_()
    graphed = te.make_graphed_callables(graphed_module, (sample,))
    report = {}
    for step in range(3):
        x = torch.randn(shape, generator=gen).to(DEVICE, torch.bfloat16)
        dy = torch.randn(shape[:-1] + (HIDDEN,), generator=gen).to(DEVICE, torch.bfloat16)
        outs = []
        for fn, m in ((eager, eager), (graphed, graphed_module)):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            y = fn(xi)
            y.backward(dy)
            outs.append((y.detach(), xi.grad, {n: p.grad for n, p in m.named_parameters()}))
        (ye, dxe, ge), (yg, dxg, gg) = outs
        report[f"step{step}.out"] = [_rel(yg, ye), 1e-2]
        report[f"step{step}.dx"] = [_rel(dxg, dxe), 1e-2]
        for n in ge:
            report[f"step{step}.d{n}"] = [_rel(gg[n], ge[n]), 1e-2]
    torch.cuda.synchronize()
    # the graphs hold the group's communicators until destroyed (a graphed module refers to
    # itself through its forward, so the cycle collector frees it)
    del graphed, graphed_module, outs
    gc.collect()
    return report
