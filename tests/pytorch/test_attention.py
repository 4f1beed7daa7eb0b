"""DotProductAttention and its dispatcher: every available backend against the plain-torch
reference (ops.attention.attention_reference, fp32 maths) over dtypes x mask types x layouts
(incl. thd) x GQA x window x head dims x odd sequence lengths, forward and gradients; the
dispatcher's decisions and env switches (on CPU too: the report needs no GPU); RoPE, KV-cache
decoding; the layers are tested in test_attention_layers.py.

Tolerance: attention rounds to the input dtype after each GEMM and after the softmax, so errors
scale with the largest value of the result, not each element: atol = 4 roundings (the table's
rtol) of the largest reference magnitude, rtol from the shared table.
"""
import dataclasses
import itertools
import math
import random

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention import backend_selection as bs
from transformer_engine.pytorch.attention import DotProductAttention, InferenceParams, RotaryPositionEmbedding
from transformer_engine.pytorch.ops import attention as attn_ops
from utils import native_gpu_reason, randn, tols

HAS_GPU = not native_gpu_reason()
SWITCHES = ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN")
FORCE = {"cudnn": {"NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
         "portable": {"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
         "unfused": {"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in SWITCHES + ("NVTE_DEBUG", "NVTE_DEBUG_LEVEL", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        monkeypatch.delenv(var, raising=False)
    bs.clear_backend_cache()
    yield
    bs.clear_backend_cache()


def close(actual, expected, dtype, roundings=4):
    t = tols(dtype)
    atol = max(t["atol"], roundings * t["rtol"] * expected.float().abs().max().item())
    torch.testing.assert_close(actual.float(), expected.float(), rtol=t["rtol"], atol=atol)


# ----- cases -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    mask: str
    fmt: str
    heads: int
    groups: int
    head_dim: int
    window: tuple
    sq: int
    sk: int
    batch: int = 2

    def __str__(self):
        dt = str(self.dtype).replace("torch.", "")
        return (f"{dt}-{self.mask}-{self.fmt}-h{self.heads}g{self.groups}-d{self.head_dim}-"
                f"w{self.window[0]}_{self.window[1]}-s{self.sq}x{self.sk}")


MASKS = attn_ops.MASK_TYPES
FORMATS = ("bshd", "sbhd", "thd")


def _cases(device):
    """Every mask x format pair (thd takes no dense mask), with dtype / GQA / window / head dim /
    odd lengths spread over them in a seeded balanced shuffle (every value of every axis appears)."""
    rng = random.Random(7)
    dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if device == "cpu" else [])
    gqa = [(4, 4), (4, 2), (6, 1)]
    dims = [64, 128] if device == "cuda" else [32, 64, 128]
    lengths = [(37, 37), (1, 23), (29, 64), (128, 128), (70, 33)]
    pairs = [(m, f) for m, f in itertools.product(MASKS, FORMATS) if not (m == "arbitrary" and f == "thd")]
    spread = {"dtype": dtypes, "gqa": gqa, "dim": dims, "len": lengths, "win": [False, True]}
    columns = {k: (v * (len(pairs) // len(v) + 1))[:len(pairs)] for k, v in spread.items()}
    for col in columns.values():
        rng.shuffle(col)
    out = []
    for i, (mask, fmt) in enumerate(pairs):
        sq, sk = columns["len"][i]
        if mask == "causal" and sq > sk:  # top-left causal with more queries than keys: fine, but
            sq, sk = sk, sq               # keep some queries seeing keys in every case
        causal = "causal" in mask
        window = ((5, 0) if causal else (7, 3)) if columns["win"][i] else (-1, -1)
        h, g = columns["gqa"][i]
        out.append(Case(columns["dtype"][i], mask, fmt, h, g, columns["dim"][i], window, sq, sk))
    return out


def _lengths(case, gen):
    """Per-sequence lengths (the first sequence full, the others shorter) for padding/thd."""
    lq = [case.sq] + [max(1, case.sq - 1 - gen.randrange(case.sq)) for _ in range(case.batch - 1)]
    lk = [case.sk] + [max(1, case.sk - 1 - gen.randrange(case.sk)) for _ in range(case.batch - 1)]
    return lq, lk


def _make_inputs(case, device, seed=0):
    gen = random.Random(seed)
    b, d = case.batch, case.head_dim
    lq, lk = _lengths(case, gen)
    cu = lambda ls: torch.tensor([0] + list(itertools.accumulate(ls)), dtype=torch.int32, device=device)
    padded = case.mask.startswith("padding") or case.fmt == "thd"
    cu_q, cu_kv = (cu(lq), cu(lk)) if padded else (None, None)

    def shape(s, h):
        return {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "thd": (s, h, d)}[case.fmt]
    sq = sum(lq) if case.fmt == "thd" else case.sq
    sk = sum(lk) if case.fmt == "thd" else case.sk
    q = randn(shape(sq, case.heads), case.dtype, device, seed + 1)
    k = randn(shape(sk, case.groups), case.dtype, device, seed + 2)
    v = randn(shape(sk, case.groups), case.dtype, device, seed + 3)
    mask = None
    if case.mask == "arbitrary":
        g = torch.Generator().manual_seed(seed + 4)
        mask = (torch.rand((b, 1, case.sq, case.sk), generator=g) < 0.3).to(device)
    return q, k, v, cu_q, cu_kv, mask, (max(lq), max(lk))


def _run_and_reference(case, device, backend, monkeypatch):
    for var, val in FORCE[backend].items():
        monkeypatch.setenv(var, val)
    q, k, v, cu_q, cu_kv, mask, (mq, mk) = _make_inputs(case, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dpa = DotProductAttention(case.heads, case.head_dim, num_gqa_groups=case.groups,
                              qkv_format=case.fmt, attn_mask_type=case.mask, window_size=case.window)
    extra = dict(max_seqlen_q=mq, max_seqlen_kv=mk) if case.fmt == "thd" else {}
    out = dpa(q, k, v, attention_mask=mask, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, **extra)
    ref = attn_ops.attention_reference(
        q, k, v, qkv_format=case.fmt, mask_type=case.mask, window_size=case.window,
        softmax_scale=1.0 / math.sqrt(case.head_dim), cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
        attn_mask=mask, **extra).reshape(out.shape)
    grad = randn(out.shape, out.dtype, device, 9)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    return dpa.last_backend_report, out, ref, got, want


def _native_support(backend, case, device):
    q, k, v, cu_q, _, _, (mq, mk) = _make_inputs(case, device)
    cfg = attn_ops.AttentionConfig.from_tensors(q, k, v, qkv_format=case.fmt, mask_type=case.mask,
                                                window_size=case.window, cu_seqlens_q=cu_q,
                                                max_seqlen_q=mq if case.fmt == "thd" else None,
                                                max_seqlen_kv=mk if case.fmt == "thd" else None)
    return attn_ops.native_attention_support(backend, cfg)


_GPU_MARK = pytest.mark.skipif(not HAS_GPU, reason=native_gpu_reason() or "ok")


def _backend_params():
    """CPU: the unfused backend (the only one there). GPU: every backend over the GPU case list."""
    params = [pytest.param("unfused", "cpu", c, id=f"unfused-cpu-{c}") for c in _cases("cpu")]
    for backend in ("unfused", "portable", "cudnn"):
        params += [pytest.param(backend, "cuda", c, id=f"{backend}-cuda-{c}", marks=_GPU_MARK)
                   for c in _cases("cuda")]
    return params


@pytest.mark.parametrize("backend,device,case", _backend_params())
def test_backend_matches_reference(backend, device, case, monkeypatch):
    """Forced to one backend, DotProductAttention equals the reference forward and backward; a
    native backend that does not support the case must hand it to unfused (never fail)."""
    report, out, ref, got, want = _run_and_reference(case, device, backend, monkeypatch)
    if backend == "unfused":
        assert report.chosen == "unfused"
    else:
        ok, why = _native_support(backend, case, device)
        assert report.chosen == (backend if ok else "unfused"), (why, str(report))
        if not ok:
            assert any(why in r for _, r in report.rejections), str(report)
    close(out, ref, case.dtype)
    for g, w in zip(got, want):
        close(g, w, case.dtype, roundings=8)


# ----- dispatcher ------------------------------------------------------------------------------

def _cfg(device="cpu", dtype=torch.bfloat16, **kw):
    base = dict(batch=2, num_heads_q=16, num_heads_kv=4, seqlen_q=512, seqlen_kv=512, head_dim_qk=128,
                head_dim_v=128, dtype=dtype, device=torch.device(device), qkv_format="bshd",
                mask_type="causal", window_size=(-1, -1), dropout_p=0.0, has_bias=False,
                deterministic=False)
    base.update(kw)
    return attn_ops.AttentionConfig(**base)


class _FakeKernels:
    """Stands in for ops.attention's kernel query so the rule table is tested on any machine."""
    def __init__(self, supported):
        self.supported = supported

    def native_attention_support(self, backend, cfg):
        if backend in self.supported:
            return True, ""
        return False, f"fake {backend} kernel declines"


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine with a native GPU build whose kernels accept what `supported` lists."""
    def install(supported=("cudnn", "portable"), vendor="cuda"):
        monkeypatch.setattr(bs, "_on_gpu", lambda backend, cfg: None)
        monkeypatch.setattr(bs, "_ops_attention", lambda: _FakeKernels(supported))
        monkeypatch.setattr(bs, "_vendor", lambda cfg: vendor)
        rules = tuple((b, n, {"device": bs._on_gpu, "kernel support": bs._kernel}.get(n, f))
                      for b, n, f in bs.RULES)
        monkeypatch.setattr(bs, "RULES", rules)
        bs.clear_backend_cache()
    return install


def test_cpu_chooses_unfused_with_reasons():
    report = bs.get_attention_backend(_cfg("cpu"))
    assert report.chosen == "unfused" and report.note == ""
    assert report.reasons("cudnn") and report.reasons("portable")
    assert all("GPU" in r or "not built" in r for _, r in report.rejections), str(report)
    assert "unfused" in str(report)


def test_preference_order_nvidia_and_amd(fake_gpu):
    fake_gpu(("cudnn", "portable"), "cuda")
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "cudnn"
    fake_gpu(("portable",), "cuda")
    report = bs.get_attention_backend(_cfg("cuda"))
    assert report.chosen == "portable" and report.reasons("cudnn") == ("fake cudnn kernel declines",)
    fake_gpu(("cudnn", "portable"), "rocm")   # AMD: the portable kernel first
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "portable"


@pytest.mark.parametrize("kw,needle", [
    (dict(mask_type="arbitrary"), "arbitrary"),
    (dict(has_bias=True), "bias"),
])
def test_frontend_rules_send_to_unfused(fake_gpu, kw, needle):
    fake_gpu()
    report = bs.get_attention_backend(_cfg("cuda", **kw))
    assert report.chosen == "unfused"
    assert needle in report.reasons("cudnn")[0] and needle in report.reasons("portable")[0]


@pytest.mark.parametrize("var,backend,next_choice", [
    ("NVTE_FUSED_ATTN", "cudnn", "portable"),
    ("NVTE_FLASH_ATTN", "portable", "cudnn"),
])
def test_env_switches(fake_gpu, monkeypatch, var, backend, next_choice):
    fake_gpu()
    monkeypatch.setenv(var, "0")
    report = bs.get_attention_backend(_cfg("cuda"))
    assert report.chosen == next_choice
    assert report.reasons(backend) == (f"disabled by {var}=0",)
    monkeypatch.setenv(var, "1")   # read at call time, not cached across a change
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "cudnn"


def test_unfused_switch_never_leaves_no_backend(fake_gpu, monkeypatch):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    report = bs.get_attention_backend(_cfg("cpu"))        # real rules: CPU has no native kernel
    assert report.chosen == "unfused" and "NVTE_UNFUSED_ATTN=0 overridden" in report.note
    fake_gpu()
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "cudnn"   # switch honoured when possible
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    report = bs.get_attention_backend(_cfg("cuda"))
    assert report.chosen == "unfused" and report.note


def test_bad_switch_value_raises(monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "maybe")
    with pytest.raises(ValueError, match="NVTE_FUSED_ATTN"):
        bs.get_attention_backend(_cfg("cpu"))


def test_debug_logging(capfd, monkeypatch):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "2")
    bs.get_attention_backend(_cfg("cpu", seqlen_q=77))
    err = capfd.readouterr().err
    assert "attention backend: unfused" in err and "cudnn rejected:" in err and "seqlen_q=77" in err
    bs.get_attention_backend(_cfg("cpu", seqlen_q=77))      # logged once per configuration
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("NVTE_DEBUG", "0")
    bs.get_attention_backend(_cfg("cpu", seqlen_q=78))
    assert capfd.readouterr().err == ""


def test_deterministic_switch_reaches_the_config(monkeypatch):
    dpa = DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")
    q = randn((2, 9, 4, 32), torch.float32, "cpu", 1)
    dpa(q, q, q)
    assert dpa.last_backend_report.config.deterministic is False
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    dpa(q, q, q)
    assert dpa.last_backend_report.config.deterministic is True


@pytest.mark.skipif(not HAS_GPU, reason=native_gpu_reason() or "ok")
def test_gpu_picks_first_supported_backend():
    """On the GPU, the choice is the first backend of the vendor's order that the kernels accept."""
    for kw in (dict(), dict(mask_type="no_mask", head_dim_qk=64, head_dim_v=64),
               dict(qkv_format="thd", mask_type="padding_causal"), dict(window_size=(64, 0))):
        cfg = _cfg("cuda", **kw)
        report = bs.get_attention_backend(cfg)
        order = bs.PREFERENCE["rocm" if torch.version.hip else "cuda"]
        expected = next(b for b in order if b == "unfused" or attn_ops.native_attention_support(b, cfg)[0])
        assert report.chosen == expected, str(report)
