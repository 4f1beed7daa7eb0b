"""Tensor-parallel TransformerLayer (set_parallel_mode: QKV and FC1 column-parallel, the attention
output projection and FC2 row-parallel, heads split over the ranks) against the unsplit layer with
the same weights, in a two-process gloo group on the CPU."""
import os
import sys

import torch

import transformer_engine.pytorch as te

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import _spawn  # noqa: E402
from utils import randn, tols  # noqa: E402

HIDDEN, FFN, HEADS, GROUPS, SEQ, BATCH = 32, 48, 4, 2, 7, 2
COLUMN_SPLIT = ("layernorm_qkv.weight", "layernorm_qkv.bias", "query_weight", "query_bias",
                "key_weight", "key_bias", "value_weight", "value_bias", "fc1_weight", "fc1_bias")
ROW_SPLIT = ("proj.weight", "fc2_weight")


def _shard(name, t, rank, world):
    """This rank's slice: whole heads (interleaved QKV rows come grouped per kv group, so a row
    chunk holds whole groups) and whole FFN columns."""
    if name.endswith(COLUMN_SPLIT):
        return t.chunk(world, 0)[rank]
    if name.endswith(ROW_SPLIT):
        return t.chunk(world, 1)[rank]
    return t


def _layer(fused, **kw):
    return te.TransformerLayer(HIDDEN, FFN, HEADS, num_gqa_groups=GROUPS, hidden_dropout=0.0,
                               attention_dropout=0.0, fuse_qkv_params=fused, params_dtype=torch.float32,
                               device="cpu", **kw)


def _body_parallel_layer(rank, world, group):
    for fused in (True, False):
        torch.manual_seed(0)
        ref = _layer(fused)
        with torch.no_grad():
            for i, (n, p) in enumerate(ref.named_parameters()):
                base = 1.0 if n.endswith("layer_norm_weight") else 0.0
                p.copy_(base + randn(p.shape, torch.float32, "cpu", seed=300 + i, scale=0.2))
        x = randn((SEQ, BATCH, HIDDEN), torch.float32, "cpu", seed=7)
        dy = randn((SEQ, BATCH, HIDDEN), torch.float32, "cpu", seed=8)
        xr = x.clone().requires_grad_()
        want = ref(xr)
        want.backward(dy)
        full = dict(ref.named_parameters())

        m = _layer(fused, tp_group=group, tp_size=world, set_parallel_mode=True)
        assert m.self_attention.core_attention.heads_q == HEADS // world
        with torch.no_grad():
            for n, p in m.named_parameters():
                src = _shard(n, full[n], rank, world)
                assert p.shape == src.shape, f"{n}: {tuple(p.shape)} vs {tuple(src.shape)}"
                p.copy_(src)
        xin = x.clone().requires_grad_()
        out = m(xin)
        t = tols(torch.float32)
        atol = 8 * t["rtol"] * want.abs().max().item()
        torch.testing.assert_close(out, want.detach(), rtol=t["rtol"], atol=atol)
        out.backward(dy)
        torch.testing.assert_close(xin.grad, xr.grad, rtol=t["rtol"], atol=8 * t["rtol"] * xr.grad.abs().max().item())
        for n, p in m.named_parameters():
            expect = _shard(n, full[n].grad, rank, world)
            # the key bias's exact gradient is zero (softmax ignores a per-row shift): judge its
            # rounding noise against the value bias's gradient
            scale_of = n.replace("key_bias", "value_bias")
            scale = _shard(scale_of, full[scale_of].grad, rank, world).abs().max().item()
            torch.testing.assert_close(p.grad, expect, rtol=t["rtol"], atol=8 * t["rtol"] * scale + 1e-6,
                                       msg=lambda s: f"{n} (fused={fused}): {s}")


def test_tensor_parallel_transformer_layer_matches_unsplit_two_ranks_gloo():
    _spawn(_body_parallel_layer)
