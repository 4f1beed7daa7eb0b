"""Context parallelism (ring attention over an NCCL group, one process per GPU) against the unsplit
DotProductAttention on one GPU with the same inputs, in BF16 through the fused backends: causal
and no_mask, bshd and sbhd, GQA; output and q/k/v gradients. Needs two GPUs."""
import faulthandler
import json
import os
import sys
import tempfile
import traceback

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_spawn import free_port, start_ranks, watch_for_hang  # noqa: E402

WORLD = 2
CASES = [(fmt, mask) for fmt in ("bshd", "sbhd") for mask in ("causal", "no_mask")]
B, S, HQ, HKV, D = 2, 4096, 16, 4, 128
BOUND = 2e-2  # norm-relative, bf16: the ring merges fp32 partial results, the unsplit kernel does not


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _worker(rank, port, out_path):
    import torch.distributed as dist
    import transformer_engine.pytorch as te
    from transformer_engine.pytorch.attention.context_parallel import split_for_context_parallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    watch_for_hang(f"{out_path}.hang.{rank}")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=torch.device("cuda", rank))
    group = dist.new_group(list(range(WORLD)))
    results = {}
    for fmt, mask in CASES:
        name = f"{fmt}-{mask}"
        try:
            gen = torch.Generator(device="cpu").manual_seed(7)
            shape = (lambda h: (B, S, h, D)) if fmt == "bshd" else (lambda h: (S, B, h, D))
            sdim = 1 if fmt == "bshd" else 0
            q, k, v = (torch.randn(shape(h), generator=gen).to("cuda", torch.bfloat16) for h in (HQ, HKV, HKV))
            dy = torch.randn(shape(HQ)[:2] + (HQ * D,), generator=gen).to("cuda", torch.bfloat16)
            kw = dict(num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type=mask)
            full = te.DotProductAttention(HQ, D, **kw)
            part = te.DotProductAttention(HQ, D, cp_group=group, **kw)
            ref = [t.clone().requires_grad_() for t in (q, k, v)]
            want = full(*ref)
            want.backward(dy)
            local = [split_for_context_parallel(t, sdim, rank, WORLD).clone().requires_grad_() for t in (q, k, v)]
            got = part(*local)
            got.backward(split_for_context_parallel(dy, sdim, rank, WORLD))
            errs = {"out": _rel(got, split_for_context_parallel(want.detach(), sdim, rank, WORLD))}
            for n, a, r in zip("qkv", local, ref):
                errs[f"d{n}"] = _rel(a.grad, split_for_context_parallel(r.grad, sdim, rank, WORLD))
            results[name] = {"errors": errs, "backend": getattr(full.last_backend_report, "chosen", None)}
        except Exception:
            results[name] = {"exception": traceback.format_exc(limit=6)}
        dist.barrier(group=group)
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def results():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < WORLD:
        pytest.skip(f"needs {WORLD} GPUs; {gpus} visible")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results")
        start_ranks(_worker, (port,), WORLD, out)
        return [json.load(open(f"{out}.{r}")) for r in range(WORLD)]


@pytest.mark.parametrize("fmt,mask", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_ring_attention_matches_unsplit(results, fmt, mask):
    for rank, res in enumerate(results):
        got = res[f"{fmt}-{mask}"]
        assert "exception" not in got, f"rank {rank}:\n{got.get('exception')}"
        bad = {k: round(v, 5) for k, v in got["errors"].items() if not v <= BOUND}
        assert not bad, f"rank {rank} (unsplit backend {got['backend']}): errors above {BOUND}: {bad}"
