"""Work that a TransformerLayer's FP8 step split over two GPUs (TP=2 + SP, DelayedScaling, amax
reduced over the group) runs on side streams gives the same bits as in line (outputs, input and
parameter gradients, every FP8 state, three steps), eagerly (NVTE_TP_OVERLAP=1, which asks for
them in eager calls) and replayed from CUDA graphs, and each piece is taken: the backward's
delayed-scaling update and the forward's (transformer_engine/pytorch/update_stream.py), the
transposes of the forward's gathered FP8 rows (module_parts/side_stream.py) and the weight casts
made beside the core attention (module_parts/weight_cast_beside.py), each with its transpose.
Needs two GPUs."""
import functools
import gc
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_spawn import spawn_nccl  # noqa: E402

WORLD = 2
HIDDEN, FFN, HEADS, SEQ, BATCH = 256, 1024, 4, 64, 2


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _steps(group, rank, world, graphed: bool):
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe
    torch.manual_seed(0)
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                                self_attn_mask_type="causal", fuse_qkv_params=True,
                                params_dtype=torch.bfloat16,
                                device="cuda", set_parallel_mode=True, sequence_parallel=True,
                                tp_group=group, tp_size=world)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)
    x = torch.randn(SEQ // world, BATCH, HIDDEN, device="cuda", dtype=torch.bfloat16,
                    generator=gen).requires_grad_()
    dy = torch.randn(SEQ // world, BATCH, HIDDEN, device="cuda", dtype=torch.bfloat16,
                     generator=gen)
    if graphed:
        run = te.make_graphed_callables(layer, (x,), enabled=True, recipe=recipe.DelayedScaling(),
                                        amax_reduction_group=group)
    else:
        def run(inp):
            with te.autocast(recipe=recipe.DelayedScaling(), amax_reduction_group=group):
                return layer(inp)
    got = []
    for _ in range(3):
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        y = run(x)
        y.backward(dy)
        got += [y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    for m in layer.modules():
        rs = getattr(m, "_fp8_state", None)
        if rs is not None:
            got += [rs.amax_history_fwd.clone(), rs.scale_fwd.clone(),
                    rs.amax_history_bwd.clone(), rs.scale_bwd.clone()]
    torch.cuda.synchronize()
    # a graphed module refers to itself through its forward: the cycle collector frees its
    # graphs, which hold the group's communicators until then
    del run, layer, y
    gc.collect()
    return got


def _counts():
    from transformer_engine.pytorch import update_stream
    from transformer_engine.pytorch.module_parts import side_stream, weight_cast_beside
    return {**update_stream.runs, **{f"side_{k}": v for k, v in side_stream.runs.items()},
            "weight_casts_taken": weight_cast_beside.taken,
            "weight_casts_transposed_late": weight_cast_beside.transposed_late}


def _switch(on: bool):
    from transformer_engine.pytorch import update_stream
    from transformer_engine.pytorch.module_parts import side_stream
    update_stream.forward_after_last_cast = side_stream.enabled = on
    update_stream.backward_after_last_cast = on
    update_stream.beside_backward = _BESIDE if on else (lambda update, device: update())


def _body(graphed, rank, world, group):
    import torch.distributed as dist
    from transformer_engine.pytorch import update_stream
    global _BESIDE
    _BESIDE = update_stream.beside_backward
    os.environ["NVTE_TP_OVERLAP"] = "graphs" if graphed else "1"
    before = _counts()
    moved = _steps(group, rank, world, graphed)
    after = _counts()
    taken = {k: after[k] - before[k] for k in before}
    _switch(False)
    try:
        in_line = _steps(group, rank, world, graphed)
    finally:
        _switch(True)
    errors = []
    # eager: every step's updates (the backward's started at its last backward's last cast),
    # both gathers' transposes (QKV, FC1) of every step, the three weight casts of every step
    # after the first (which makes the modules' FP8 states); graphed: the capture's at least
    least = ({"beside_backward": 3, "after_event": 3, "side_transpose": 6,
              "weight_casts_taken": 6, "backward_after_cast": 3}
             if not graphed else dict.fromkeys(taken, 1))
    least.pop("weight_casts_transposed_late", None)
    errors += [f"{k} taken {taken[k]} times" for k in least if taken[k] < least[k]]
    if taken["weight_casts_transposed_late"]:  # each cast beside comes with its transpose
        errors.append(f"{taken['weight_casts_transposed_late']} weight casts transposed in line")
    if _counts() != after:
        errors.append("side-stream work taken while switched off")
    errors += [f"tensor {i} differs" for i, (a, b) in enumerate(zip(moved, in_line))
               if not torch.equal(a, b)]
    if not graphed:
        # eager calls under the default schedule keep the transposes and weight casts in line
        os.environ["NVTE_TP_OVERLAP"] = "graphs"
        start = _counts()
        _steps(group, rank, world, graphed)
        moved_again = {k: _counts()[k] - start[k] for k in ("side_transpose", "weight_casts_taken")}
        if any(moved_again.values()):
            errors.append(f"eager calls under NVTE_TP_OVERLAP=graphs took {moved_again}")
    # every rank learns every rank's verdict, so that none raises while a peer waits for it
    verdicts = [None] * world
    dist.all_gather_object(verdicts, errors, group=group)
    bad = {r: v for r, v in enumerate(verdicts) if v}
    assert not bad, bad


@pytest.mark.skipif(_gpus() < WORLD, reason=f"needs {WORLD} GPUs")
@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_side_stream_work_matches_in_line(graphed):
    spawn_nccl(functools.partial(_body, graphed), WORLD)
