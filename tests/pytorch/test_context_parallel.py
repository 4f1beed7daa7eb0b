"""Context parallelism (ring attention over a cp_group) against the unsplit DotProductAttention
with the same inputs, in a two-process gloo group on the CPU: causal and no_mask, bshd and sbhd,
GQA, output and the q/k/v gradients; TransformerLayer.set_context_parallel_group; configurations
the ring cannot split fail on every rank before any exchange. The two-GPU NCCL run is in
tests/distributed."""
import os
import sys

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.context_parallel import split_for_context_parallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn, tols  # noqa: E402

B, S, HQ, HKV, D = 2, 24, 4, 2, 16


def _body_ring_matches_unsplit(rank, world, group):
    for fmt in ("bshd", "sbhd"):
        for mask in ("causal", "no_mask"):
            shape = (lambda h: (B, S, h, D)) if fmt == "bshd" else (lambda h: (S, B, h, D))
            sdim = 1 if fmt == "bshd" else 0
            q, k, v = (randn(shape(h), torch.float32, "cpu", seed=s) for h, s in ((HQ, 1), (HKV, 2), (HKV, 3)))
            dy = randn(shape(HQ)[:2] + (HQ * D,), torch.float32, "cpu", seed=4)
            full = te.DotProductAttention(HQ, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type=mask)
            part = te.DotProductAttention(HQ, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type=mask,
                                          cp_group=group)
            qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
            want = full(qf, kf, vf)
            want.backward(dy)
            local = [split_for_context_parallel(t, sdim, rank, world).clone().requires_grad_() for t in (q, k, v)]
            got = part(*local)
            got.backward(split_for_context_parallel(dy, sdim, rank, world))
            t = tols(torch.float32)
            ctx = f"{fmt} {mask}"
            torch.testing.assert_close(got, split_for_context_parallel(want.detach(), sdim, rank, world),
                                       **t, msg=lambda m: f"{ctx} out: {m}")
            for name, a, r in zip("qkv", local, (qf, kf, vf)):
                torch.testing.assert_close(a.grad, split_for_context_parallel(r.grad, sdim, rank, world),
                                           rtol=t["rtol"], atol=1e-5, msg=lambda m: f"{ctx} d{name}: {m}")


def _body_layer_and_refusals(rank, world, group):
    torch.manual_seed(0)
    kw = dict(hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal",
              params_dtype=torch.float32, device="cpu")
    full = te.TransformerLayer(64, 128, 4, **kw)
    part = te.TransformerLayer(64, 128, 4, **kw)
    part.load_state_dict(full.state_dict())
    part.set_context_parallel_group(group, None, None)
    x = randn((S, B, 64), torch.float32, "cpu", seed=5)
    want = full(x)
    got = part(split_for_context_parallel(x, 0, rank, world))
    torch.testing.assert_close(got, split_for_context_parallel(want.detach(), 0, rank, world),
                               rtol=1e-4, atol=1e-4)
    # every rank raises the same error before the first exchange (none is left waiting)
    padded = te.DotProductAttention(4, 16, attn_mask_type="padding_causal", cp_group=group)
    q = randn((S // world, B, 4, 16), torch.float32, "cpu", seed=6)
    with pytest.raises(ValueError, match="cannot be split over the context-parallel group"):
        padded(q, q, q, attention_mask=torch.zeros(B, 1, 1, S // world, dtype=torch.bool))
    odd = te.DotProductAttention(4, 16, cp_group=group)
    q = randn((7, B, 4, 16), torch.float32, "cpu", seed=7)
    with pytest.raises(ValueError, match="must be even"):
        odd(q, q, q)


def test_context_parallel_ring_matches_unsplit_two_ranks_gloo():
    _spawn(_body_ring_matches_unsplit)


def test_context_parallel_layer_and_refusals_two_ranks_gloo():
    _spawn(_body_layer_and_refusals)


def test_split_for_context_parallel_layout():
    x = torch.arange(8).view(8, 1)
    assert split_for_context_parallel(x, 0, 0, 2).flatten().tolist() == [0, 1, 6, 7]
    assert split_for_context_parallel(x, 0, 1, 2).flatten().tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="multiple of 2"):
        split_for_context_parallel(torch.zeros(6, 1), 0, 0, 2)
