"""Context parallelism for attention: the sequence split over the ranks of a group, ring attention
with point-to-point exchange of K/V, partial results merged by their log-sum-exp.

Layout. Each rank holds 1/cp of the sequence as two chunks: rank r holds chunks r and 2cp-1-r of
the sequence cut into 2cp equal chunks, concatenated in that order (the usual balancing for
causal masks: every rank then does the same amount of work; `split_for_context_parallel` makes
this layout from a whole sequence). For 'no_mask' any equal split works the same way.

Forward, on rank r, step i = 0 .. cp-1 with the K/V of rank j = (r - i) mod cp (passed along the
ring, the next transfer in flight while this step computes):
  i = 0        causal: the local queries against the local keys under the ordinary causal mask
               (local order is global order); no_mask: everything
  j < r        causal: every local query sees the first chunk of j's keys and none of its second
  j > r        causal: only the second local query chunk sees anything, all of j's keys
Each step gives (out_i, lse_i) for some rows; out = sum_i exp(lse_i - lse) out_i with
lse = logsumexp_i lse_i. Backward repeats the ring with the global out and lse: a chunk's
gradients from the same kernels, given those (the softmax of a chunk is exp(s - lse_global));
dK/dV travel with their K/V and reach their owner after a full turn.

Chunks run on a native fused backend where it accepts them (cuDNN, then the portable kernel),
else on the plain-torch maths below. Only 'causal' and 'no_mask', bshd/sbhd, no dropout and no
bias: anything else is refused before any communication starts.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

from ..kernels import attention as attn_kernels

_OP = "DotProductAttention (context parallel)"
CP_MASK_TYPES = ("causal", "no_mask")
CP_FORMATS = ("bshd", "sbhd")


def check_context_parallel(mask_type: str, qkv_format: str, dropout_p: float, has_bias: bool,
                           window_size, seq_len: int, cp_size: int) -> None:
    """Every rank runs this before the first exchange, so a configuration the ring cannot split
    fails everywhere with the same message instead of leaving a rank waiting."""
    if mask_type not in CP_MASK_TYPES:
        raise ValueError(f"{_OP}: attn_mask_type {mask_type!r} cannot be split over the context-"
                         f"parallel group; supported: {', '.join(CP_MASK_TYPES)}")
    if qkv_format not in CP_FORMATS:
        raise ValueError(f"{_OP}: qkv_format {qkv_format!r}; context parallelism supports "
                         f"{', '.join(CP_FORMATS)}")
    if dropout_p:
        raise ValueError(f"{_OP}: attention_dropout {dropout_p}; context parallelism needs 0.0")
    if has_bias:
        raise ValueError(f"{_OP}: core_attention_bias is not supported with context parallelism")
    if window_size is not None and tuple(window_size) not in ((-1, -1), (-1, 0)):
        raise ValueError(f"{_OP}: window_size {tuple(window_size)}; context parallelism supports "
                         "no sliding window")
    if seq_len % 2:
        raise ValueError(f"{_OP}: the local sequence length {seq_len} must be even (two chunks per "
                         f"rank: the whole sequence a multiple of 2 * {cp_size})")


def split_for_context_parallel(x: torch.Tensor, seq_dim: int, rank: int, cp_size: int) -> torch.Tensor:
    """This rank's part of a whole sequence: chunks rank and 2cp-1-rank of 2cp, concatenated."""
    if x.shape[seq_dim] % (2 * cp_size):
        raise ValueError(f"split_for_context_parallel: sequence length {x.shape[seq_dim]} is not a "
                         f"multiple of 2 * cp_size = {2 * cp_size}")
    chunks = x.chunk(2 * cp_size, dim=seq_dim)
    return torch.cat([chunks[rank], chunks[2 * cp_size - 1 - rank]], dim=seq_dim)


# ----- one chunk: native backend or plain torch --------------------------------------------------

def _native_backend(q, k, v, qkv_format: str, mask_type: str, scale: float) -> Optional[str]:
    if not q.is_cuda:
        return None
    cfg = attn_kernels.AttentionConfig.from_tensors(q, k, v, qkv_format=qkv_format, mask_type=mask_type)
    # on ROCm the portable kernel is the FMA build, slower than the plain maths' GEMMs
    backends = ("cudnn",) if torch.version.hip else attn_kernels.NATIVE_BACKENDS
    for backend in backends:
        if attn_kernels.native_attention_support(backend, cfg)[0]:
            return backend
    return None


def _to_bhsd(t: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return t.permute(0, 2, 1, 3) if qkv_format == "bshd" else t.permute(1, 2, 0, 3)


def _from_bhsd(t: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return t.permute(0, 2, 1, 3) if qkv_format == "bshd" else t.permute(2, 0, 1, 3)


def _scores(q, k, causal: bool, scale: float):
    """fp32 [b, hq, sq, skv] scores of bhsd q/k (GQA: kv heads repeated)."""
    rep = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep, dim=1)
    s = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale
    if causal:
        sq, skv = s.shape[-2:]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _chunk_forward(q, k, v, qkv_format: str, causal: bool, scale: float):
    """(out in q's dtype and layout, lse fp32 [b, hq, sq])."""
    mask = "causal" if causal else "no_mask"
    backend = _native_backend(q, k, v, qkv_format, mask, scale)
    if backend is not None:
        out, lse, _ = attn_kernels.fused_attention_forward(q, k, v, backend=backend, qkv_format=qkv_format,
                                                           mask_type=mask, softmax_scale=scale)
        return out, lse.float()
    qb, kb, vb = (_to_bhsd(t, qkv_format) for t in (q, k, v))
    s = _scores(qb, kb, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    rep = qb.shape[1] // kb.shape[1]
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), vb.float().repeat_interleave(rep, dim=1))
    return _from_bhsd(out, qkv_format).to(q.dtype), lse


def _chunk_backward(q, k, v, out, dout, lse, qkv_format: str, causal: bool, scale: float):
    """(dq, dk, dv) of one chunk given the GLOBAL out and lse of these query rows."""
    mask = "causal" if causal else "no_mask"
    backend = _native_backend(q, k, v, qkv_format, mask, scale)
    if backend is not None:
        empty = torch.empty(0, dtype=torch.int64, device=q.device)
        return attn_kernels.fused_attention_backward(
            q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), dout.contiguous(),
            lse.contiguous(), empty, backend=backend, qkv_format=qkv_format, mask_type=mask,
            softmax_scale=scale)
    qb, kb, vb, ob, dob = (_to_bhsd(t, qkv_format).float() for t in (q, k, v, out, dout))
    rep = qb.shape[1] // kb.shape[1]
    p = torch.exp(_scores(qb, kb, causal, scale) - lse.unsqueeze(-1))        # [b, hq, sq, skv]
    vr = vb.repeat_interleave(rep, dim=1)
    dv = torch.matmul(p.transpose(-1, -2), dob)
    dp = torch.matmul(dob, vr.transpose(-1, -2))
    ds = p * (dp - (dob * ob).sum(-1, keepdim=True)) * scale
    dq = torch.matmul(ds, kb.repeat_interleave(rep, dim=1))
    dk = torch.matmul(ds.transpose(-1, -2), qb)

    def fold(t):  # GQA: sum the query heads of each kv head
        b, h, s, d = t.shape
        return t.view(b, h // rep, rep, s, d).sum(2)
    return (_from_bhsd(dq, qkv_format), _from_bhsd(fold(dk), qkv_format), _from_bhsd(fold(dv), qkv_format))


# ----- the ring ---------------------------------------------------------------------------------

class _Ring:
    """Point-to-point exchange with the neighbours of this rank in the group's ring."""

    def __init__(self, group, global_ranks):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        ranks = list(global_ranks) if global_ranks is not None else dist.get_process_group_ranks(group)
        if len(ranks) != self.size:
            raise ValueError(f"{_OP}: cp_global_ranks has {len(ranks)} ranks; the group has {self.size}")
        self.send_to = ranks[(self.rank + 1) % self.size]
        self.recv_from = ranks[(self.rank - 1) % self.size]

    def start(self, tensors):
        """Send `tensors` to the next rank and receive same-shaped ones from the previous one."""
        sends = [t.contiguous() for t in tensors]  # held in reqs' tuple until the transfer ends
        recv = [torch.empty_like(t) for t in sends]
        ops = [dist.P2POp(dist.isend, t, self.send_to, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, r, self.recv_from, self.group) for r in recv]
        return recv, (dist.batch_isend_irecv(ops), sends)

    @staticmethod
    def finish(reqs):
        for r in reqs[0]:
            r.wait()


def _step_rows(step: int, rank: int, src: int, causal: bool, seq_len: int):
    """(query row range, key row range, causal) of a ring step, or None when it sees nothing."""
    half = seq_len // 2
    if not causal:
        return (0, seq_len), (0, seq_len), False
    if step == 0:
        return (0, seq_len), (0, seq_len), True
    if src < rank:
        return (0, seq_len), (0, half), False
    return (half, seq_len), (0, seq_len), False


def _narrow(t, dim, rows):
    return t.narrow(dim, rows[0], rows[1] - rows[0])


class ContextParallelAttention(torch.autograd.Function):
    """out = attention of this rank's queries over the whole group's keys (see the module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, qkv_format, causal, scale, group, global_ranks):
        ring = _Ring(group, global_ranks)
        sdim = 1 if qkv_format == "bshd" else 0
        seq = q.shape[sdim]
        b, hq = q.shape[0 if sdim == 1 else 1], q.shape[2]
        out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=torch.float32, device=q.device)
        lse = torch.full((b, hq, seq), float("-inf"), dtype=torch.float32, device=q.device)
        kv = (k, v)
        for step in range(ring.size):
            pending = ring.start(kv) if step + 1 < ring.size else None
            src = (ring.rank - step) % ring.size
            qr, kr, c = _step_rows(step, ring.rank, src, causal, seq)
            o_i, l_i = _chunk_forward(_narrow(q, sdim, qr), _narrow(kv[0], sdim, kr),
                                      _narrow(kv[1], sdim, kr), qkv_format, c, scale)
            rows_lse = lse[..., qr[0]:qr[1]]
            new = torch.logaddexp(rows_lse, l_i)
            # per row weights, in the output's layout: [b, h, s] -> bshd [b, s, h, 1] / sbhd [s, b, h, 1]
            w_old, w_new = torch.exp(rows_lse - new), torch.exp(l_i - new)
            to_layout = (lambda w: w.permute(0, 2, 1).unsqueeze(-1)) if sdim == 1 else \
                        (lambda w: w.permute(2, 0, 1).unsqueeze(-1))
            rows_out = _narrow(out, sdim, qr)
            rows_out.mul_(to_layout(torch.nan_to_num(w_old))).add_(to_layout(w_new) * o_i.float())
            lse[..., qr[0]:qr[1]] = new
            if pending is not None:
                recv, reqs = pending
                _Ring.finish(reqs)
                kv = tuple(recv)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta = (qkv_format, causal, scale, group, global_ranks)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        qkv_format, causal, scale, group, global_ranks = ctx.meta
        ring = _Ring(group, global_ranks)
        sdim = 1 if qkv_format == "bshd" else 0
        seq = q.shape[sdim]
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = (k, v)
        dkv = (torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32))
        dout = dout.contiguous()
        for step in range(ring.size):
            kv_pending = ring.start(kv) if step + 1 < ring.size else None
            src = (ring.rank - step) % ring.size
            qr, kr, c = _step_rows(step, ring.rank, src, causal, seq)
            g = _chunk_backward(_narrow(q, sdim, qr), _narrow(kv[0], sdim, kr), _narrow(kv[1], sdim, kr),
                                _narrow(out, sdim, qr), _narrow(dout, sdim, qr),
                                lse[..., qr[0]:qr[1]].contiguous(), qkv_format, c, scale)
            _narrow(dq, sdim, qr).add_(g[0].float())
            _narrow(dkv[0], sdim, kr).add_(g[1].float())
            _narrow(dkv[1], sdim, kr).add_(g[2].float())
            # the gradients of the K/V just used go where that K/V goes next; after the last
            # step one more hop brings each rank its own
            recv, reqs = ring.start(dkv)
            _Ring.finish(reqs)
            dkv = tuple(recv)
            if kv_pending is not None:
                _Ring.finish(kv_pending[1])
                kv = tuple(kv_pending[0])
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def context_parallel_attention(q, k, v, *, qkv_format: str, mask_type: str, softmax_scale: Optional[float],
                               cp_group, cp_global_ranks=None, dropout_p: float = 0.0,
                               has_bias: bool = False, window_size=None) -> torch.Tensor:
    """Attention of this rank's part of the sequence (layout in the module docstring) over the
    whole context-parallel group; q/k/v in qkv_format with separate head dims, out likewise."""
    size = dist.get_world_size(cp_group)
    sdim = 1 if qkv_format == "bshd" else 0
    check_context_parallel(mask_type, qkv_format, dropout_p, has_bias, window_size, q.shape[sdim], size)
    if k.shape[sdim] != q.shape[sdim]:
        raise ValueError(f"{_OP}: query and key sequence lengths differ ({q.shape[sdim]} vs {k.shape[sdim]}); "
                         "context parallelism splits self-attention")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return ContextParallelAttention.apply(q, k, v, qkv_format, mask_type == "causal", scale,
                                          cp_group, cp_global_ranks)

