"""The sdpa backend (torch.nn.functional.scaled_dot_product_attention behind the dispatcher):
its selection on ROCm and NVIDIA (asked on any machine through backend_selection.assume_vendor),
forced-backend numerics against the other backends and the reference, rows that see no key,
dropout with the RNG tracker and checkpointing, torch.compile, te.checkpoint, determinism.
The reference-case sweep over every mask x layout is test_attention.py's
test_backend_matches_reference (sdpa is one of its backends)."""
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention import DotProductAttention
from transformer_engine.pytorch.attention import backend_selection as bs
from transformer_engine.pytorch.kernels import attention as attn_ops
from utils import native_gpu_reason, randn

from test_attention import FORCE, SWITCHES, close

HAS_GPU = not native_gpu_reason()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_GPU, reason=native_gpu_reason() or "ok"))]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in SWITCHES + ("NVTE_DEBUG", "NVTE_DEBUG_LEVEL", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        monkeypatch.delenv(var, raising=False)
    bs.clear_backend_cache()
    yield
    bs.clear_backend_cache()


def _force(monkeypatch, backend):
    for var, val in FORCE[backend].items():
        monkeypatch.setenv(var, val)


def _cfg(dtype=torch.bfloat16, **kw):
    base = dict(batch=4, num_heads_q=32, num_heads_kv=8, seqlen_q=2048, seqlen_kv=2048,
                head_dim_qk=128, head_dim_v=128, dtype=dtype, device=torch.device("cpu"),
                qkv_format="bshd", mask_type="causal", window_size=(-1, -1), dropout_p=0.0,
                has_bias=False, deterministic=False)
    base.update(kw)
    return attn_ops.AttentionConfig(**base)


# ----- selection on ROCm (asked on this machine) --------------------------------------------------

LLM_CONFIGS = [  # what decoder training and inference run: bf16/fp16, causal or none, GQA, d 64-128
    dict(),
    dict(dtype=torch.float16, num_heads_kv=32),
    dict(qkv_format="sbhd", mask_type="no_mask", head_dim_qk=64, head_dim_v=64),
    dict(mask_type="padding_causal", num_heads_kv=1),
    dict(dropout_p=0.1, seqlen_q=4096, seqlen_kv=4096),
    dict(mask_type="causal_bottom_right", seqlen_q=1, seqlen_kv=777),     # decoding with a cache
    dict(window_size=(4096, 0), head_dim_qk=96, head_dim_v=96),
]
OTHER_CONFIGS = [  # what SDPA does not take: each goes to unfused with a reason
    (dict(qkv_format="thd", mask_type="padding_causal"), "thd"),
    (dict(has_bias=True), "bias"),
    (dict(dtype=torch.float32), "float32"),
    (dict(head_dim_qk=76, head_dim_v=76), "head_dim_qk 76"),
    (dict(head_dim_qk=512, head_dim_v=512), "head_dim_qk 512"),
    (dict(deterministic=True), "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"),
]


@pytest.mark.parametrize("kw", LLM_CONFIGS)
def test_rocm_chooses_sdpa_for_llm_configs(kw):
    with bs.assume_vendor("rocm"):
        report = bs.get_attention_backend(_cfg(**kw))
    assert report.chosen == "sdpa", str(report)
    assert report.order[0] == "sdpa" and report.vendor == "rocm"
    assert "NVTE_FLASH_ATTN=1" in report.reasons("portable")[0]   # the FMA kernel, with why


@pytest.mark.parametrize("kw,needle", OTHER_CONFIGS)
def test_rocm_sends_the_rest_to_unfused(kw, needle):
    with bs.assume_vendor("rocm"):
        report = bs.get_attention_backend(_cfg(**kw))
    assert report.chosen == "unfused", str(report)
    assert needle in report.reasons("sdpa")[0], str(report)


class _AcceptingKernels:
    """Native kernels that accept everything: the FMA kernel must still not be chosen on AMD."""
    @staticmethod
    def native_attention_support(backend, cfg):
        return True, ""


@pytest.mark.parametrize("kw", LLM_CONFIGS + [kw for kw, _ in OTHER_CONFIGS])
def test_rocm_never_chooses_the_fma_kernel(kw, monkeypatch):
    monkeypatch.setattr(bs, "_ops_attention", lambda: _AcceptingKernels)
    monkeypatch.setattr(bs, "RULES", tuple(r for r in bs.RULES if r[1] != "device"))
    with bs.assume_vendor("rocm"):
        assert bs.get_attention_backend(_cfg(**kw)).chosen in ("sdpa", "unfused")
        monkeypatch.setenv("NVTE_SDPA_ATTN", "0")
        assert bs.get_attention_backend(_cfg(**kw)).chosen == "unfused"
        monkeypatch.setenv("NVTE_FLASH_ATTN", "1")   # only the explicit request reaches it
        want = "unfused" if kw.get("has_bias") else "portable"   # (no bias in the kernels)
        assert bs.get_attention_backend(_cfg(**kw)).chosen == want


def test_nvidia_order_predicate(monkeypatch):
    """cuDNN first; without it, sdpa before portable exactly where SDPA needs no dense mask."""
    monkeypatch.setattr(bs, "RULES", tuple(r for r in bs.RULES if r[1] not in ("device", "kernel support")))
    with bs.assume_vendor("cuda"):
        assert bs.get_attention_backend(_cfg()).chosen == "cudnn"
        monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
        for kw, fast in ((dict(), True), (dict(mask_type="no_mask"), True),
                         (dict(mask_type="causal_bottom_right"), True),          # sq == skv
                         (dict(mask_type="causal_bottom_right", seqlen_q=7), False),
                         (dict(mask_type="padding"), False), (dict(window_size=(128, 0)), False)):
            report = bs.get_attention_backend(_cfg(**kw))
            assert report.chosen == ("sdpa" if fast else "portable"), (kw, str(report))


def test_report_explains_vendor_and_order(capfd, monkeypatch):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    with bs.assume_vendor("rocm"):
        bs.get_attention_backend(_cfg(qkv_format="thd", mask_type="padding"))
    err = capfd.readouterr().err
    assert "attention backend: unfused [rocm; order sdpa > cudnn > portable > unfused]" in err
    assert "sdpa rejected: qkv_format 'thd'" in err and "portable rejected: on AMD" in err


def test_assume_vendor_rejects_unknown():
    with pytest.raises(ValueError, match="assume_vendor: vendor"):
        with bs.assume_vendor("tpu"):
            pass


# ----- numerics ------------------------------------------------------------------------------------

def _dpa_run(monkeypatch, backend, device, fmt="bshd", mask="causal", heads=8, groups=2, d=64,
             sq=37, sk=37, dtype=torch.bfloat16, window=None, mask_tensor=None, lengths=None, seed=0):
    _force(monkeypatch, backend)
    b = 3
    shape = (lambda s, h: (b, s, h, d)) if fmt == "bshd" else (lambda s, h: (s, b, h, d))
    q = randn(shape(sq, heads), dtype, device, seed + 1).requires_grad_()
    k = randn(shape(sk, groups), dtype, device, seed + 2).requires_grad_()
    v = randn(shape(sk, groups), dtype, device, seed + 3).requires_grad_()
    dpa = DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format=fmt, attn_mask_type=mask,
                              window_size=window)
    kw = {}
    if lengths is not None:
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)
        kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out = dpa(q, k, v, attention_mask=mask_tensor, **kw)
    grad = randn(out.shape, out.dtype, device, 9)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    return dpa.last_backend_report, out, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,mask,groups,sq,sk,window", [
    ("bshd", "causal", 2, 37, 37, None),
    ("sbhd", "no_mask", 8, 29, 53, None),
    ("bshd", "causal_bottom_right", 1, 23, 41, None),
    ("sbhd", "padding_causal", 4, 33, 33, None),
    ("bshd", "no_mask", 2, 40, 40, (5, 3)),
])
def test_sdpa_matches_other_backends(device, fmt, mask, groups, sq, sk, window, monkeypatch):
    """Forced sdpa equals forced unfused (and the native backends on the GPU), forward and grads."""
    lengths = [sq, sq - 5, 1] if mask.startswith("padding") else None
    args = dict(fmt=fmt, mask=mask, groups=groups, sq=sq, sk=sk, window=window, lengths=lengths)
    report, out, grads = _dpa_run(monkeypatch, "sdpa", device, **args)
    assert report.chosen == "sdpa", str(report)
    peers = ["unfused"] + (["portable", "cudnn"] if device == "cuda" else [])
    for peer in peers:
        bs.clear_backend_cache()
        peer_report, peer_out, peer_grads = _dpa_run(monkeypatch, peer, device, **args)
        if peer_report.chosen != peer:
            continue   # a native kernel that declines the case (its own tests cover why)
        close(out, peer_out, torch.bfloat16, roundings=8)
        for g, w in zip(grads, peer_grads):
            close(g, w, torch.bfloat16, roundings=16)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_that_see_no_key_are_zero(device, monkeypatch):
    """Bottom-right causal with sq > skv: the first sq - skv queries see nothing -> zeros, no NaN,
    and their gradients are zero too."""
    report, out, grads = _dpa_run(monkeypatch, "sdpa", device, mask="causal_bottom_right", sq=19,
                                  sk=11, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    assert report.chosen == "sdpa"
    out = out.view(3, 19, 8, 64)
    assert torch.isfinite(out).all() and torch.isfinite(grads[0]).all()
    assert (out[:, :8] == 0).all() and (out[:, 8:].abs().sum(-1) > 0).all()
    assert (grads[0][:, :8] == 0).all()


def test_arbitrary_mask_matches_reference(monkeypatch):
    g = torch.Generator().manual_seed(3)
    mask = torch.rand((3, 1, 21, 21), generator=g) < 0.4
    mask[0, 0, 5] = True                                    # one row fully masked -> zeros
    report, out, _ = _dpa_run(monkeypatch, "sdpa", "cpu", mask="arbitrary", groups=8, sq=21, sk=21,
                              dtype=torch.float32, mask_tensor=mask)
    assert report.chosen == "sdpa"
    q = randn((3, 21, 8, 64), torch.float32, "cpu", 1)
    k = randn((3, 21, 8, 64), torch.float32, "cpu", 2)
    v = randn((3, 21, 8, 64), torch.float32, "cpu", 3)
    ref = attn_ops.attention_reference(q, k, v, qkv_format="bshd", mask_type="arbitrary",
                                       softmax_scale=1 / math.sqrt(64), attn_mask=mask)
    close(out, ref.reshape(out.shape), torch.float32)


def test_dropout_follows_the_rng_tracker_and_checkpoint(monkeypatch):
    _force(monkeypatch, "sdpa")
    tracker_seed = [0]

    class Tracker:
        def fork(self):
            return torch.random.fork_rng(devices=[])

    dpa = DotProductAttention(4, 32, attention_dropout=0.3, qkv_format="bshd",
                              attn_mask_type="causal", get_rng_state_tracker=Tracker)
    q = randn((2, 17, 4, 32), torch.float32, "cpu", 1).requires_grad_()
    no_drop = DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")(q, q, q)

    def run(ckpt):
        torch.manual_seed(tracker_seed[0])
        out = dpa(q, q, q, checkpoint_core_attention=ckpt)
        return out, torch.autograd.grad(out.square().sum(), q)[0]
    a, ga = run(False)
    assert dpa.last_backend_report.chosen == "sdpa"
    b, gb = run(True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)         # same seed: same dropout mask
    torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-6)  # recomputation reproduces it
    assert not torch.allclose(a, no_drop)                    # dropout did something
    dpa.eval()
    torch.testing.assert_close(dpa(q, q, q), no_drop, rtol=1e-5, atol=1e-5)


def test_under_torch_compile_and_te_checkpoint(monkeypatch):
    _force(monkeypatch, "sdpa")
    dpa = DotProductAttention(4, 32, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    q = randn((2, 13, 4, 32), torch.float32, "cpu", 1).requires_grad_()
    kv = randn((2, 13, 2, 32), torch.float32, "cpu", 2).requires_grad_()
    eager = dpa(q, kv, kv)
    assert dpa.last_backend_report.chosen == "sdpa"
    g_eager = torch.autograd.grad(eager.sum(), (q, kv))
    compiled = torch.compile(lambda a, b: dpa(a, b, b), fullgraph=True, backend="aot_eager")
    out = compiled(q, kv)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, kv)), g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ck = te.checkpoint(dpa, q, kv, kv)
    torch.testing.assert_close(ck, eager, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(ck.sum(), (q, kv)), g_eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_determinism_request(monkeypatch):
    """NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the GPU SDPA backward promises none -> rejected there;
    the CPU kernels are deterministic and keep it."""
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    _force(monkeypatch, "sdpa")
    _, a, ga = _dpa_run(monkeypatch, "sdpa", "cpu", dtype=torch.float32)
    report, b, gb = _dpa_run(monkeypatch, "sdpa", "cpu", dtype=torch.float32)
    assert report.chosen == "sdpa" and report.config.deterministic
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    with bs.assume_vendor("cuda"):
        report = bs.get_attention_backend(_cfg(deterministic=True))
    assert report.reasons("sdpa") and "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in report.reasons("sdpa")[0]


# ----- per-call work cached per geometry -----------------------------------------------------------

def test_cached_module_rechecks_and_recomputes_each_new_call(monkeypatch):
    """A module keeps its checks and configurations per geometry: after a call is cached, a bad
    call still raises, and each new shape, dtype, mask, layout or switch gets the answer and the
    report of a module that never saw a call."""
    _force(monkeypatch, "sdpa")

    def make():
        return DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="causal")
    dpa = make()
    q = randn((2, 9, 4, 16), torch.float32, "cpu", 1)
    kv = randn((2, 9, 2, 16), torch.float32, "cpu", 2)
    dpa(q, kv, kv)
    with pytest.raises(ValueError, match="4 heads"):
        dpa(randn((2, 9, 3, 16), torch.float32, "cpu", 3), kv, kv)
    with pytest.raises(ValueError, match="dtype"):
        dpa(q, kv.double(), kv)
    with pytest.raises(ValueError, match="key/value shapes"):
        dpa(q, randn((2, 11, 2, 16), torch.float32, "cpu", 4), kv)
    with pytest.raises(ValueError, match="attn_mask_type"):
        dpa(q, kv, kv, attn_mask_type="diagonal")
    calls = [
        (q, kv, kv, {}),
        (randn((2, 12, 4, 16), torch.float32, "cpu", 5), randn((2, 7, 2, 16), torch.float32, "cpu", 6),
         randn((2, 7, 2, 16), torch.float32, "cpu", 7), {}),                      # sq != skv
        (q.bfloat16(), kv.bfloat16(), kv.bfloat16(), {}),                         # dtype
        (q, kv, kv, {"attn_mask_type": "no_mask"}),                               # mask type
        (q, kv, kv, {"attn_mask_type": "causal_bottom_right", "window_size": (3, 0)}),
        (q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1), {"qkv_format": "sbhd"}),
    ]
    for a, b, c, kw in calls:
        out = dpa(a, b, c, **kw)
        fresh = make()
        want = fresh(a, b, c, **kw)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert dpa.last_backend_report == fresh.last_backend_report
        assert dpa.last_backend_report.config.dtype == a.dtype
    monkeypatch.setenv("NVTE_SDPA_ATTN", "0")                  # same geometry, another switch
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "1")
    dpa(q, kv, kv)
    assert dpa.last_backend_report.chosen == "unfused"
    monkeypatch.setenv("NVTE_SDPA_ATTN", "1")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    dpa(q, kv, kv)
    assert dpa.last_backend_report.chosen == "sdpa"
