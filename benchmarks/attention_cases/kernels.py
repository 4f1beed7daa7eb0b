"""Attention kernels: our native backends ('cudnn', 'portable') against SDPA's cuDNN and flash
backends (torch.nn.attention.sdpa_kernel), forward and forward+backward, bf16, bshd memory
layout for everyone (SDPA gets [b, h, s, d] views of it, as a TE user's tensors would be).

FLOPs: forward 4*B*H*S*S*D (two products), backward 2.5x that (five products); causal halves
both. The backward time is (forward + backward) - forward.
"""
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_engine.pytorch.kernels import attention as A

SHAPES = [(4, 32, 4096, 128), (8, 16, 2048, 64), (1, 32, 16384, 128)]
OURS = ("cudnn", "portable", "portable_fma")  # portable_fma: the FMA kernels AMD builds run
PEERS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def _make(shape, i):
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(i)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    return q, k, v, do


def _ours(label, causal, scale):
    backend, variant = ("portable", "fma") if label == "portable_fma" else (label, "auto")
    kw = dict(backend=backend, qkv_format="bshd", mask_type="causal" if causal else "no_mask",
              softmax_scale=scale)

    def fwd(q, k, v, do):
        with A.portable_kernel_variant(variant):
            return A.fused_attention_forward(q, k, v, **kw)

    def fwd_bwd(q, k, v, do):
        with A.portable_kernel_variant(variant):
            out, lse, rng = A.fused_attention_forward(q, k, v, **kw)
            return A.fused_attention_backward(q, k, v, out, do, lse, rng, **kw)
    return fwd, fwd_bwd


def _sdpa(backend, causal, scale):
    # Inputs require grad in both timings: the forward is then the training forward (it saves
    # the softmax statistics, as ours does), not the cheaper inference kernel.
    def run(q, k, v, do, backward):
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                   scale=scale)
        if backward:
            out.backward(do.transpose(1, 2))
        return out
    return (lambda *a: run(*a, backward=False)), (lambda *a: run(*a, backward=True))


def _cases():
    cases = []
    for shape in SHAPES:
        b, h, s, d = shape
        for causal in (False, True):
            flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
            scale = 1.0 / math.sqrt(d)
            fns = {name: _ours(name, causal, scale) for name in OURS}
            fns.update({name: _sdpa(be, causal, scale) for name, be in PEERS.items()})
            cases.append({"group": "kernels", "name": "causal" if causal else "full",
                          "shape": shape, "flops_fwd": flops, "flops_bwd": 2.5 * flops,
                          "make": (lambda i, shape=shape: _make(shape, i)), "fns": fns,
                          "ours": list(OURS), "peers": list(PEERS), "reference": "sdpa_cudnn"})
    return cases


CASES = _cases()
