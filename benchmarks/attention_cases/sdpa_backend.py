"""The sdpa backend of DotProductAttention (torch SDPA behind our dispatcher), same run:

group 'sdpa_backend': DotProductAttention forced to sdpa ('te_sdpa') against SDPA called directly
  on [b, h, s, d] views of the same bshd tensors ('sdpa', the reference), with PyTorch choosing
  SDPA's kernel in both, at (4,32,4096,128) and (1,32,16384,128), causal and not. Kernel time
  (CUDA graph replays). run_wrapper_cost() adds the eager ratio (host work included), paired
  by round: the wrapper's whole cost, which must stay under 3 % (the timing holds the backend
  switches around all calls, so each call does only what a training step would).
group 'order': the NVIDIA rule that orders sdpa and portable where cuDNN is absent or declines
  (common/attention_selection.py, framework_fast_path): both backends forced on configurations on
  each side of the predicate -- top-left causal / no mask (SDPA needs no dense mask) against
  padding, sliding window and bottom-right causal with sq != skv (SDPA needs one). The ratios
  te_sdpa_*_vs_te_portable belong in that rule's comment.
"""
import math

import torch

import common
from transformer_engine.pytorch.attention import DotProductAttention

SHAPES = [(4, 32, 4096, 128), (1, 32, 16384, 128)]
_SWITCHES = {"cudnn": "NVTE_FUSED_ATTN", "portable": "NVTE_FLASH_ATTN", "sdpa": "NVTE_SDPA_ATTN",
             "unfused": "NVTE_UNFUSED_ATTN"}


def forced(backend):
    """The four attention switches forcing `backend` for the block."""
    return common.env_vars({var: "1" if name == backend else "0" for name, var in _SWITCHES.items()})


def _make(shape, sk, i):
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(i)
    q, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    return q, k, v, do


def _te(backend, shape, mask, window=None, lengths=None, force=True):
    """force=False: the caller holds forced(backend) around every call (the eager wrapper-cost
    timing), so the call itself does not set and restore the four variables, host work the
    direct SDPA contender does not do."""
    b, h, _, d = shape
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask, window_size=window)
    kw = {}
    cu_lengths = None if lengths is None else [0] + [sum(lengths[:i + 1]) for i in range(b)]

    def run(q, k, v, do, backward):
        if cu_lengths is not None and not kw:  # made on the first call (the device exists then)
            cu = torch.tensor(cu_lengths, dtype=torch.int32, device=q.device)
            kw.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        if force:
            with forced(backend):
                out = dpa(q, k, v, **kw)
        else:
            out = dpa(q, k, v, **kw)
        report = dpa.last_backend_report
        if report.chosen != backend:  # never time a fallback under this backend's name
            raise NotImplementedError(f"{backend} declined: {'; '.join(report.reasons(backend))}")
        if backward:
            out.backward(do.reshape(out.shape))
        return out
    return (lambda *a: run(*a, backward=False)), (lambda *a: run(*a, backward=True))


def _direct(causal, scale):
    # inputs require grad in both timings: the training forward (saves the statistics)
    def run(q, k, v, do, backward):
        qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        if backward:
            out.backward(do.transpose(1, 2))
        return out
    return (lambda *a: run(*a, backward=False)), (lambda *a: run(*a, backward=True))


def _flops(b, h, sq, sk, d, frac):
    f = 4 * b * h * sq * sk * d * frac
    return f, 2.5 * f


def _cases():
    cases = []
    for shape in SHAPES:
        b, h, s, d = shape
        for causal in (False, True):
            fwd, bwd = _flops(b, h, s, s, d, 0.5 if causal else 1.0)
            mask = "causal" if causal else "no_mask"
            fns = {"te_sdpa": _te("sdpa", shape, mask),
                   "sdpa": _direct(causal, 1.0 / math.sqrt(d))}
            cases.append({"group": "sdpa_backend", "name": "causal" if causal else "full",
                          "shape": shape, "mask": mask, "flops_fwd": fwd, "flops_bwd": bwd,
                          "make": (lambda i, shape=shape: _make(shape, shape[2], i)), "fns": fns,
                          "ours": ["te_sdpa"], "peers": ["sdpa"], "reference": "sdpa"})
    # the NVIDIA order predicate: (name, mask, window, sk, lengths, fast path?)
    b, h, s, d = 4, 32, 4096, 128
    order = [("causal", "causal", None, s, None),
             ("no_mask", "no_mask", None, s, None),
             ("padding_causal", "padding_causal", None, s, [s, s - 512, s // 2, 1000]),
             ("window_1024", "causal", (1024, 0), s, None),
             ("causal_bottom_right_sk8192", "causal_bottom_right", None, 2 * s, None)]
    for name, mask, window, sk, lengths in order:
        shape = (b, h, s, d)
        fns = {label: _te(label, shape, mask, window, lengths) for label in ("portable", "sdpa", "cudnn")}
        fns = {f"te_{k}": v for k, v in fns.items()}
        fwd, bwd = _flops(b, h, s, sk, d, 0.5 if "causal" in mask else 1.0)
        cases.append({"group": "order", "name": name, "shape": (b, h, s, sk, d), "flops_fwd": fwd,
                      "flops_bwd": bwd, "make": (lambda i, shape=shape, sk=sk: _make(shape, sk, i)),
                      "fns": fns, "ours": ["te_sdpa", "te_cudnn"], "peers": ["te_portable"],
                      "reference": "te_portable"})
    return cases


CASES = _cases()


def run_wrapper_cost(quick):
    """Eager fwd+bwd of te_sdpa against direct SDPA, paired by round (host work included)."""
    rows = []
    for case in CASES:
        if case["group"] != "sdpa_backend":
            continue
        args = case["make"](0)
        te_fb = _te("sdpa", case["shape"], case["mask"], force=False)[1]
        direct_fb = case["fns"]["sdpa"][1]
        with forced("sdpa"):
            res = common.paired_ratio(lambda: te_fb(*args), lambda: direct_fb(*args),
                                      rounds=5 if quick else 15, reps=5 if quick else 10)
        row = {"name": case["name"], "shape": "x".join(map(str, case["shape"])),
               "te_sdpa_eager_fwd_bwd_vs_sdpa": res["median"],
               "quartiles": res["quartiles"], "rounds": res["rounds"]}
        print(f"    eager {row['name']} {row['shape']}: te_sdpa vs sdpa x{res['median']:.3f} "
              f"(quartiles {res['quartiles'][0]:.3f}-{res['quartiles'][1]:.3f})", flush=True)
        rows.append(row)
    return rows
