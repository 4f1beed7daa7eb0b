"""Tensor and sequence parallelism over NCCL, one process per GPU, against the unsplit module
with the same weights: Linear (column, row), LayerNormLinear, LayerNormMLP (GELU, SwiGLU),
MultiheadAttention and TransformerLayer, with and without sequence parallelism, in BF16, FP8
DelayedScaling (amax reduced over the group) and Float8CurrentScaling; outputs, the input
gradient and every parameter gradient, plus return_bias / return_layernorm_output, under each
NVTE_TP_OVERLAP schedule (row blocks with the copy engines always or only in graph captures, row
blocks with NCCL, whole GEMMs),
and sequence-parallel modules replayed from CUDA graphs against the same modules run eagerly.
Needs two GPUs; the same modules are checked in two-process gloo groups on the CPU in
tests/pytorch."""
import faulthandler
import gc
import json
import os
import sys
import tempfile
import traceback

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_cases  # noqa: E402
from nccl_spawn import free_port, start_ranks, watch_for_hang  # noqa: E402

WORLD = 2
CASES = tp_cases.all_cases()
SCHEDULES = ("1", "graphs", "nccl", "0")
GRAPHED = ("layernorm_mlp", "transformer_layer")  # sequence-parallel in and out, replayed from graphs


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _worker(rank: int, port: int, out_path: str):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    watch_for_hang(f"{out_path}.hang.{rank}")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=torch.device("cuda", rank))
    group = dist.new_group(list(range(WORLD)))
    from transformer_engine.pytorch.module_parts import copy_engine_tp
    results = {}
    for schedule in SCHEDULES:
        os.environ["NVTE_TP_OVERLAP"] = schedule
        before = dict(copy_engine_tp.transfers)
        for case in CASES:
            key = f"{schedule}/{case.name}"
            try:
                errs = tp_cases.run_case(case, group, rank, WORLD)
                results[key] = {"errors": errs}
            except Exception:  # recorded per case; the other cases still run
                results[key] = {"exception": traceback.format_exc(limit=6)}
            dist.barrier(group=group)
        results[f"{schedule}/copy_engine_transfers_eager"] = {
            k: copy_engine_tp.transfers[k] - before[k] for k in before}
        for module in GRAPHED:
            key = f"{schedule}/graphed-{module}"
            try:
                results[key] = {"errors": tp_cases.run_graphed(module, group, rank, WORLD)}
            except Exception:  # recorded; the other runs still go on
                results[key] = {"exception": traceback.format_exc(limit=6)}
            dist.barrier(group=group)
        results[f"{schedule}/copy_engine_transfers"] = {
            k: copy_engine_tp.transfers[k] - before[k] for k in before}
    results["copy_engine_available"] = copy_engine_tp.available()
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(results, f)
    # NCCL's communicator teardown waits until every CUDA graph that captured one of its
    # collectives is destroyed; a graphed module is freed only by the cycle collector
    gc.collect()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


TEARDOWN = {}  # how the ranks' destroy_process_group ended, when it did not return


@pytest.fixture(scope="module")
def results():
    if _gpus() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs with the native backend; {_gpus()} visible")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results")
        try:
            start_ranks(_worker, (port,), WORLD, out)
        except pytest.fail.Exception as exc:
            # the ranks write their results before tearing the group down: a rank that hangs
            # there fails test_ranks_tear_down_cleanly, and the cases are still judged
            if not all(os.path.exists(f"{out}.{r}") for r in range(WORLD)):
                raise
            TEARDOWN["failure"] = str(exc)
        per_rank = []
        for r in range(WORLD):
            with open(f"{out}.{r}") as f:
                per_rank.append(json.load(f))
    return per_rank


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_split_module_matches_unsplit(results, schedule, case):
    for rank, res in enumerate(results):
        got = res[f"{schedule}/{case.name}"]
        assert "exception" not in got, f"rank {rank}:\n{got.get('exception')}"
        bad = {k: (round(err, 5), round(allowed, 5)) for k, (err, allowed) in got["errors"].items()
               if not err <= allowed}
        assert not bad, f"rank {rank}: norm-relative (error, allowed) above the bound: {bad}"


@pytest.mark.parametrize("module", GRAPHED)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_graphed_split_module_matches_eager(results, schedule, module):
    for rank, res in enumerate(results):
        got = res[f"{schedule}/graphed-{module}"]
        assert "exception" not in got, f"rank {rank}:\n{got.get('exception')}"
        bad = {k: (round(err, 5), allowed) for k, (err, allowed) in got["errors"].items()
               if not err <= allowed}
        assert not bad, f"rank {rank}: graphed against eager, (error, allowed): {bad}"


def test_default_schedule_moves_rows_with_copy_engines(results):
    # where torch has the symmetric-memory pipelines, the copy-engine schedules must use them
    # for both the gathers and the reduce-scatters (a silent fallback to NCCL would pass the
    # numerics above): "1" everywhere, the default "graphs" in the captures; "nccl" and "0" never
    for rank, res in enumerate(results):
        if not res["copy_engine_available"]:
            pytest.skip("this torch has no symmetric-memory pipelines")
        used = res["1/copy_engine_transfers"]
        assert used["gather"] > 0 and used["reduce_scatter"] > 0, f"rank {rank}: {used}"
        for schedule in ("nccl", "0"):
            assert not any(res[f"{schedule}/copy_engine_transfers"].values()), (rank, schedule)
        # "graphs": NCCL in the eager calls, the copy engines in the captures (whose eager
        # warm-up grew the workspace for them)
        assert not any(res["graphs/copy_engine_transfers_eager"].values()), (rank, res)
        used = res["graphs/copy_engine_transfers"]
        assert used["gather"] > 0 and used["reduce_scatter"] > 0, f"rank {rank}: graphs {used}"
        if WORLD == 2:  # every pipeline took the two-rank schedules
            for schedule in ("1", "graphs"):
                used = res[f"{schedule}/copy_engine_transfers"]
                assert used["gather_pair"] == used["gather"], (rank, schedule, used)
                assert used["reduce_scatter_pair"] == used["reduce_scatter"], (rank, schedule, used)


def test_ranks_tear_down_cleanly(results):
    # destroy_process_group returns on every rank once the modules, their graphs and the
    # copy-engine workspaces have been used (a hang there would hold a training job at its end)
    assert "failure" not in TEARDOWN, TEARDOWN.get("failure", "")[-3000:]
