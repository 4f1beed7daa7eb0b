"""The backward's delayed-scaling update of a step that reduces its amaxes over a group runs on
a side stream (transformer_engine/pytorch/update_stream.py): a TransformerLayer split over two
GPUs (TP=2 + SP, DelayedScaling, amax reduced over the group) gives the same bits as with the
update in line (outputs, input and parameter gradients, every FP8 state, three steps), eagerly
and replayed from CUDA graphs, and the side stream is taken. Needs two GPUs."""
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
                                self_attn_mask_type="causal", params_dtype=torch.bfloat16,
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


def _body(graphed, rank, world, group):
    import torch.distributed as dist
    from transformer_engine.pytorch import update_stream
    before = update_stream.runs["beside_backward"]
    beside = _steps(group, rank, world, graphed)
    taken = update_stream.runs["beside_backward"] - before
    saved = update_stream.beside_backward
    update_stream.beside_backward = lambda update, device: update()
    try:
        in_line = _steps(group, rank, world, graphed)
    finally:
        update_stream.beside_backward = saved
    errors = []
    # every backward of the eager steps; the graph's warm-up and captured backwards
    if taken < (3 if not graphed else 1):
        errors.append(f"side stream taken {taken} times")
    errors += [f"tensor {i} differs" for i, (a, b) in enumerate(zip(beside, in_line))
               if not torch.equal(a, b)]
    # every rank learns every rank's verdict, so that none raises while a peer waits for it
    verdicts = [None] * world
    dist.all_gather_object(verdicts, errors)
    assert not any(verdicts), verdicts


@pytest.mark.skipif(_gpus() < WORLD, reason=f"needs {WORLD} GPUs")
@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_update_beside_backward_matches_in_line(graphed):
    spawn_nccl(functools.partial(_body, graphed), WORLD)
