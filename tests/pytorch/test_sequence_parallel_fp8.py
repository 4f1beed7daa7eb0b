"""The sequence-parallel all-gather of a column-parallel FP8 GEMM's input moves FP8 bytes:
te.Linear (column), LayerNormLinear and LayerNormMLP split over a two-process gloo group, under
DelayedScaling (amaxes reduced over the group) and Float8CurrentScaling, against the unsplit
module with the same weights. Checked: each forward's gather moves one byte per element (the
collective is wrapped and counted) and the backward gathers no input again; outputs and every
gradient match the unsplit module; delayed-scaling scales equal the unsplit module's bit for
bit; current scaling's gathered FP8 rows are those of the high-precision gather cast
afterwards (outputs and gradients equal bit for bit); a checkpoint recompute gathers FP8
again with the forward's scale (gradients equal bit for bit); and where the ranks' scales may
differ (delayed scaling without an amax reduction over every tensor-parallel rank) the gather
stays in high precision."""
import contextlib
import os
import sys

import pytest
import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module import layernorm_linear as lnl_mod
from transformer_engine.pytorch.module import layernorm_mlp as lnmlp_mod
from transformer_engine.pytorch.module import linear as linear_mod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn, tols  # noqa: E402

# 16 x 3 = 48 tokens (a multiple of 16, as FP8 GEMMs need), 24 on each rank; a batch of 3
SEQ, BATCH, HIDDEN, FFN = 16, 3, 48, 96
DTYPE = torch.bfloat16
KINDS = ("linear", "layernorm_linear", "layernorm_mlp")
# a row-parallel Linear: no input gather; its backward gathers the output gradient (as FC2's)
ROW_OUTPUT = ("layernorm_mlp", "linear_row")
# the gathers go through torch.distributed.all_gather (counted below); the copy-engine test
# moves them through its stand-in pipelines instead and checks their bytes there
COUNT_NCCL_GATHERS = True
RECIPES = {"delayed": lambda: recipe.DelayedScaling(amax_history_len=3),
           "current": lambda: recipe.Float8CurrentScaling()}


class _CountGathers:
    """Records (elements, bytes per element) of every torch.distributed.all_gather input."""

    def __enter__(self):
        self.calls, self.original = [], dist.all_gather

        def wrapper(tensor_list, tensor, *args, **kwargs):
            self.calls.append((tensor.numel(), tensor.element_size()))
            return self.original(tensor_list, tensor, *args, **kwargs)

        dist.all_gather = wrapper
        return self

    def __exit__(self, *exc):
        dist.all_gather = self.original


def _build(kind, group, world):
    """(unsplit, split) modules; splits: parameter name -> dim it is split along."""
    kw = dict(params_dtype=DTYPE, device="cpu")
    par = dict(tp_group=group, tp_size=world, sequence_parallel=True)
    if kind == "linear":
        return (te.Linear(HIDDEN, FFN, **kw), te.Linear(HIDDEN, FFN, parallel_mode="column", **par, **kw),
                {"weight": 0, "bias": 0})
    if kind == "layernorm_linear":
        return (te.LayerNormLinear(HIDDEN, FFN, **kw),
                te.LayerNormLinear(HIDDEN, FFN, parallel_mode="column", **par, **kw),
                {"weight": 0, "bias": 0})
    if kind == "linear_row":  # row parallel: the input split by features, the output by rows
        return (te.Linear(FFN, HIDDEN, **kw), te.Linear(FFN, HIDDEN, parallel_mode="row", **par, **kw),
                {"weight": 1})
    return (te.LayerNormMLP(HIDDEN, FFN, **kw),
            te.LayerNormMLP(HIDDEN, FFN, set_parallel_mode=True, **par, **kw),
            {"fc1_weight": 0, "fc1_bias": 0, "fc2_weight": 1})


def _pair(kind, group, rank, world, seed):
    full, part, splits = _build(kind, group, world)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in full.named_parameters():
            base = 1.0 if n == "layer_norm_weight" else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            if p.dim() == 2:  # the last shard larger: the ranks' weight amaxes differ
                p[-p.shape[0] // 4:] *= 3
                p[:, -p.shape[1] // 4:] *= 3
            getattr(part, n).copy_(p.chunk(world, splits[n])[rank] if n in splits else p)
    return full, part, splits


def _out_part(kind, y, rank, world):
    if kind in ROW_OUTPUT:  # ends row-parallel: all features, this rank's sequence part
        return y.chunk(world, 0)[rank]
    return y.chunk(world, -1)[rank]  # column-parallel: this rank's output features


def _grads(module, group):
    """Parameter gradients; those of parameters replicated over sequence shards summed over the
    group, as a training loop does."""
    out = {}
    for n, p in module.named_parameters():
        g = p.grad.clone()
        if getattr(p, "sequence_parallel", False):
            dist.all_reduce(g, group=group)
        out[n] = g
    return out


def _run_split(kind, part, x_part, dy_part, make, group):
    """One split step: (output, input grad, parameter grads, forward gathers, backward gathers)."""
    part.zero_grad(set_to_none=True)
    xp = x_part.clone().requires_grad_()
    with _CountGathers() as fwd:
        with te.autocast(recipe=make(), amax_reduction_group=group):
            y = part(xp)
    with _CountGathers() as bwd:
        y.backward(dy_part)
    return y.detach(), xp.grad, _grads(part, group), fwd.calls, bwd.calls


def _inputs(step, rank, world, kind):
    x = randn((SEQ, BATCH, FFN if kind == "linear_row" else HIDDEN), torch.float32, "cpu",
              seed=100 + step)
    x[SEQ // 2:] *= 3  # the ranks' sequence parts differ in amax
    x = x.to(DTYPE)
    out_shape = (SEQ, BATCH, HIDDEN if kind in ROW_OUTPUT else FFN)
    dy = randn(out_shape, torch.float32, "cpu", seed=200 + step).to(DTYPE)
    x_part = x.chunk(world, -1 if kind == "linear_row" else 0)[rank].contiguous()
    if kind in ROW_OUTPUT:
        dy_part = dy.chunk(world, 0)[rank].contiguous()
    else:
        dy_part = dy.chunk(world, -1)[rank].contiguous()
    return x, dy, x_part, dy_part


def _close(got, want, bound, where):
    got, want = got.float(), want.float()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= bound, f"{where}: norm-relative error {rel:.3g} > {bound}"


def _check_against_unsplit(kind, name, group, rank, world):
    make = RECIPES[name]
    full, part, splits = _pair(kind, group, rank, world, seed=7)
    local_elems = SEQ // world * BATCH * HIDDEN
    for step in range(2):  # the second step runs on the scales the first one's amaxes made
        x, dy, x_part, dy_part = _inputs(step, rank, world, kind)
        full.zero_grad(set_to_none=True)
        xf = x.clone().requires_grad_()
        with te.autocast(recipe=make()):
            yf = full(xf)
        yf.backward(dy)
        y, dx, grads, fwd, bwd = _run_split(kind, part, x_part, dy_part, make, group)
        where = f"{kind} {name} step {step}"
        if COUNT_NCCL_GATHERS:
            # forward: one gather, of this rank's rows in FP8 (1 byte each); none row parallel
            assert fwd == ([] if kind == "linear_row" else [(local_elems, 1)]), (where, fwd)
            # backward: no input gather; a row-parallel output (LayerNormMLP's FC2, the row
            # Linear) gathers its gradient, in FP8 too (each rank's rows cast with the shared
            # scale)
            want_bwd = [(SEQ // world * BATCH * HIDDEN, 1)] if kind in ROW_OUTPUT else []
            assert bwd == want_bwd, (where, bwd)
        # delayed: the same scales, so the FP8 operands are the unsplit module's and only the
        # split's sums of bf16 partial results (reduce-scatters, all-reduces) differ: within
        # bf16's rtol as a norm-relative error. Current: the split weight and output gradient
        # are scaled per shard, so their FP8 roundings differ: within one E4M3 rtol
        bound = tols(DTYPE if name == "delayed" else torch.float8_e4m3fn)["rtol"]
        _close(y, _out_part(kind, yf.detach(), rank, world), bound, f"{where} output")
        _close(dx, xf.grad.chunk(world, -1 if kind == "linear_row" else 0)[rank], bound,
               f"{where} dx")
        for n, p in full.named_parameters():
            want = p.grad.chunk(world, splits[n])[rank] if n in splits else p.grad
            _close(grads[n], want, bound, f"{where} d{n}")
        if name == "delayed":
            for a, b in ((full._fp8_state, part._fp8_state),):
                assert torch.equal(a.scale_fwd, b.scale_fwd), (where, a.scale_fwd, b.scale_fwd)
                assert torch.equal(a.scale_bwd, b.scale_bwd), (where, a.scale_bwd, b.scale_bwd)


class _HighPrecisionGather:
    """Switches the FP8 gather off in the modules: the high-precision gather, then the cast."""

    def __enter__(self):
        self.saved = [(mod, mod.fp8_gather_applies) for mod in (lnl_mod, lnmlp_mod, linear_mod)]
        for mod, _ in self.saved:
            mod.fp8_gather_applies = lambda fi, tp: False

    def __exit__(self, *exc):
        for mod, original in self.saved:
            mod.fp8_gather_applies = original


def _check_current_matches_high_precision_gather(kind, group, rank, world):
    """Current scaling: the scale of the reduced amax is the gathered rows' own, so the FP8 rows
    gathered are bit for bit those of the high-precision gather cast afterwards."""
    make = RECIPES["current"]
    results = []
    for high_precision in (False, True):
        _, part, _ = _pair(kind, group, rank, world, seed=9)
        _, _, x_part, dy_part = _inputs(5, rank, world, kind)
        with _HighPrecisionGather() if high_precision else contextlib.nullcontext():
            y, dx, grads, fwd, _ = _run_split(kind, part, x_part, dy_part, make, group)
        assert fwd[0][1] == (2 if high_precision else 1), (kind, fwd)
        results.append((y, dx, grads))
    (y1, dx1, g1), (y2, dx2, g2) = results
    assert torch.equal(y1, y2) and torch.equal(dx1, dx2), kind
    for n in g1:
        assert torch.equal(g1[n], g2[n]), (kind, n)


def _check_delayed_unshared_scales_gather_high_precision(kind, group, rank, world, own_group):
    """Delayed scaling whose amaxes are not reduced over the tensor-parallel ranks (no amax
    reduction group, or one holding this rank alone, or reduce_amax=False): each rank's scale
    follows its own amaxes, so the rows are gathered in BF16 and cast after the gather (results
    match the unsplit module as before)."""
    variants = {"no group": (None, True), "own rank only": (own_group, True),
                "reduce_amax=False": (group, False)}
    for what, (amax_group, reduce_amax) in variants.items():
        def make():
            return recipe.DelayedScaling(amax_history_len=3, reduce_amax=reduce_amax)
        full, part, _ = _pair(kind, group, rank, world, seed=11)
        for step in range(2):
            x, dy, x_part, dy_part = _inputs(step + 7, rank, world, kind)
            full.zero_grad(set_to_none=True)
            part.zero_grad(set_to_none=True)
            xf, xp = x.clone().requires_grad_(), x_part.clone().requires_grad_()
            with te.autocast(recipe=make()):
                yf = full(xf)
            with _CountGathers() as fwd:
                with te.autocast(recipe=make(), amax_reduction_group=amax_group):
                    y = part(xp)
            yf.backward(dy)
            y.backward(dy_part)
            where = f"{kind} delayed, {what}, step {step}"
            assert fwd.calls == [(SEQ // world * BATCH * HIDDEN, 2)], (where, fwd.calls)
            # each rank's weight shard has its own scale now: the output within one E4M3 rtol
            _close(y, _out_part(kind, yf.detach(), rank, world), tols(torch.float8_e4m3fn)["rtol"],
                   where)


def _check_checkpoint_recompute(kind, name, group, rank, world):
    """te.checkpoint: the recompute replays the forward's shared scale and gathers FP8 again,
    so the gradients equal those of the plain step bit for bit."""
    make = RECIPES[name]
    results = []
    for checkpointed in (False, True):
        _, part, _ = _pair(kind, group, rank, world, seed=13)
        _, _, x_part, dy_part = _inputs(3, rank, world, kind)
        xp = x_part.clone().requires_grad_()
        with _CountGathers() as gathers:
            with te.autocast(recipe=make(), amax_reduction_group=group):
                y = te.checkpoint(part, xp) if checkpointed else part(xp)
            y.backward(dy_part)
        fp8_gathers = [c for c in gathers.calls if c[1] == 1]
        # the forward's input gather (again in the recompute), and LayerNormMLP's backward
        # gathers its output gradient in FP8 once either way
        want = (2 if checkpointed else 1) + (kind == "layernorm_mlp")
        assert len(fp8_gathers) == want, (kind, name, gathers.calls)
        results.append((y.detach(), xp.grad, _grads(part, group)))
    (y1, dx1, g1), (y2, dx2, g2) = results
    assert torch.equal(y1, y2) and torch.equal(dx1, dx2), (kind, name)
    for n in g1:
        assert torch.equal(g1[n], g2[n]), (kind, name, n)


def _body(rank, world, group):
    torch.manual_seed(0)
    # every rank takes part in making every group; each keeps the one of its own rank
    own_group = [dist.new_group([r]) for r in range(world)][rank]
    for name in RECIPES:
        _check_against_unsplit("linear_row", name, group, rank, world)
    for kind in KINDS:
        for name in RECIPES:
            _check_against_unsplit(kind, name, group, rank, world)
        _check_current_matches_high_precision_gather(kind, group, rank, world)
        _check_delayed_unshared_scales_gather_high_precision(kind, group, rank, world, own_group)
        for name in RECIPES:
            _check_checkpoint_recompute(kind, name, group, rank, world)


def test_sequence_parallel_gather_moves_fp8_bytes_two_ranks_gloo():
    _spawn(_body)


def _body_rank_blocks(rank, world, group):
    # 32 rows on each rank, a multiple of 16: the column-parallel modules then run their FP8
    # GEMM on this rank's rows while the others' are gathered, and on those once they land
    # (module_parts/gather_gemm.py); the 24-row runs above await the whole gather instead
    global BATCH
    BATCH = 4
    torch.manual_seed(0)
    for kind in KINDS + ("linear_row",):
        for name in RECIPES:
            _check_against_unsplit(kind, name, group, rank, world)


@pytest.mark.parametrize("overlap", ["1", "nccl", "0"])
def test_gemm_over_rank_blocks_while_gathering_two_ranks_gloo(overlap, monkeypatch):
    # every NVTE_TP_OVERLAP schedule gives the unsplit module's numbers (gloo: blocks after the
    # gather; NCCL and the copy engines run in the GPU tests)
    monkeypatch.setenv("NVTE_TP_OVERLAP", overlap)
    _spawn(_body_rank_blocks)


def test_tp_overlap_setting_rejects_unknown_values(monkeypatch):
    from transformer_engine.common import config
    monkeypatch.setenv("NVTE_TP_OVERLAP", "yes")
    with pytest.raises(ValueError, match="NVTE_TP_OVERLAP='yes': expected one of 0, 1, nccl, graphs"):
        config.tp_overlap()
    monkeypatch.setenv("NVTE_TP_OVERLAP", " NCCL ")
    assert config.tp_overlap() == "nccl"
    monkeypatch.delenv("NVTE_TP_OVERLAP")
    assert config.tp_overlap() == "graphs"  # the default


class _PipelinesOverGloo:
    """Stand-in for torch's symmetric-memory pipelines with their contract (which block each
    callback sees, where the results land), its bytes moved by a gloo all-reduce over zeros
    (exact, and not one of the gathers the checks above count): the copy-engine branches of the
    modules then run on the CPU, their block arithmetic checked against the unsplit module. How
    the GPUs move the bytes is checked in the two-GPU tests."""

    def __init__(self, group):
        self.group, self.gathered, self.workspace_sizes = group, [], []
        self._group_name_to_workspace_tensor = {}

    def _share(self, mine):
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        every = torch.zeros((world,) + tuple(mine.shape), dtype=mine.dtype)
        every[rank] = mine
        dist.all_reduce(every, group=self.group)
        return every

    def get_symm_mem_workspace(self, group_name, min_size):
        self.workspace_sizes.append(min_size)
        self._group_name_to_workspace_tensor[group_name] = torch.empty(min_size, dtype=torch.uint8)

    def _pipelined_all_gather_and_consume(self, shard, consume, ag_out, group_name):
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.gathered.append((shard.numel(), shard.dtype))
        ag_out.copy_(self._share(shard).reshape(ag_out.shape))
        consume(shard, rank)  # this rank's rows first, then each peer's
        for step in range(1, world):
            src = (rank + step) % world
            consume(ag_out.chunk(world)[src], src)

    def _pipelined_produce_and_all2all(self, produce, output, group_name):
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        chunks = output.chunk(world)
        mine = torch.empty((world,) + tuple(chunks[0].shape), dtype=output.dtype)
        for step in range(1, world + 1):  # the peers' blocks first, this rank's last
            dst = (rank + step) % world
            produce(dst, mine[dst])
        every = self._share(mine)  # [src rank, dst rank, rows, cols]
        for src in range(world):
            chunks[src].copy_(every[src, rank])


def _body_copy_engine_blocks(rank, world, group):
    from transformer_engine.pytorch.module_parts import copy_engine_tp
    global COUNT_NCCL_GATHERS
    COUNT_NCCL_GATHERS = False
    copy_engine_tp._symm = pipelines = _PipelinesOverGloo(group)
    copy_engine_tp.usable = lambda t, tp, nbytes: tp.group.group_name
    _body_rank_blocks(rank, world, group)  # FP8: the column gathers and row reduce-scatters
    # the row-parallel Linear's FP8 forward makes its output in blocks that the pipelines
    # reduce-scatter (one per forward, two steps a check; its backward gathers, and
    # reduce-scatters nothing)
    before = copy_engine_tp.transfers["reduce_scatter"]
    for name in RECIPES:
        _check_against_unsplit("linear_row", name, group, rank, world)
    assert copy_engine_tp.transfers["reduce_scatter"] - before == 2 * len(RECIPES), copy_engine_tp.transfers
    # the FP8 column gathers moved this rank's FP8 rows as bytes (1 byte each)
    rows_bytes = SEQ // world * BATCH * HIDDEN
    assert (rows_bytes, torch.uint8) in pipelines.gathered, pipelines.gathered
    # high precision: the column gathers and the backward's output-gradient gathers too
    from test_module_parallel import _check_norm_modules, _check_parallel
    _check_parallel(rank, world)
    before = copy_engine_tp.transfers["reduce_scatter"]
    _check_norm_modules(rank, world)
    # with sequence parallelism: FC2's forward and, in the backward, the norm output's gradient
    # of LayerNormLinear and of LayerNormMLP, each made in blocks the pipelines reduce-scatter
    assert copy_engine_tp.transfers["reduce_scatter"] - before == 3, copy_engine_tp.transfers
    used = copy_engine_tp.transfers
    assert used["gather"] > 0 and used["reduce_scatter"] > 0, used


def test_gemm_blocks_through_copy_engine_pipelines_two_ranks_gloo(monkeypatch):
    monkeypatch.setenv("NVTE_TP_OVERLAP", "1")
    _spawn(_body_copy_engine_blocks)


def _body_graphs_schedule_eager(rank, world, group):
    from transformer_engine.pytorch.module_parts import copy_engine_tp
    global COUNT_NCCL_GATHERS
    COUNT_NCCL_GATHERS = False
    import inspect
    copy_engine_tp._symm = pipelines = _PipelinesOverGloo(group)
    copy_engine_tp.usable = lambda t, tp, nbytes: tp.group.group_name
    asked_by, chosen = set(), copy_engine_tp.chosen

    def chosen_recorded(t, tp, nbytes):
        asked_by.add(inspect.stack()[1].function)
        return chosen(t, tp, nbytes)
    copy_engine_tp.chosen = chosen_recorded
    before = dict(copy_engine_tp.transfers)
    try:
        _body_rank_blocks(rank, world, group)
    finally:
        copy_engine_tp.chosen = chosen
    # eager calls under "graphs" take NCCL (here gloo), never the pipelines, with each GEMM
    # whole, and grow the workspace to what a capture of the same calls would need: the
    # gathers' and the row-parallel reduce-scatters' (whose GEMMs no longer run in blocks)
    assert copy_engine_tp.transfers == before, copy_engine_tp.transfers
    assert not pipelines.gathered
    assert pipelines.workspace_sizes and max(pipelines.workspace_sizes) > 0, pipelines.workspace_sizes
    assert {"gemm_reduce_scatter", "start_fp8_gather"} <= asked_by, asked_by


def test_graphs_schedule_keeps_eager_calls_off_the_copy_engines_two_ranks_gloo(monkeypatch):
    monkeypatch.setenv("NVTE_TP_OVERLAP", "graphs")
    _spawn(_body_graphs_schedule_eager)
