"""DotProductAttention and its dispatcher: every available backend against the plain-torch
reference (kernels.attention.attention_reference, fp32 maths) over dtypes x mask types x layouts
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
from transformer_engine.pytorch.kernels import attention as attn_ops
from transformer_engine.pytorch.kernels import attention_packed
from utils import native_gpu_reason, randn, tols

HAS_GPU = not native_gpu_reason()
SWITCHES = ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_SDPA_ATTN")
FORCE = {name: {var: "1" if owner == name else "0"
                for owner, var in (("cudnn", "NVTE_FUSED_ATTN"), ("portable", "NVTE_FLASH_ATTN"),
                                   ("unfused", "NVTE_UNFUSED_ATTN"), ("sdpa", "NVTE_SDPA_ATTN"))}
         for name in ("cudnn", "portable", "unfused", "sdpa")}


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
    """CPU: unfused and sdpa (PyTorch's CPU kernels). GPU: every backend over the GPU case list."""
    params = [pytest.param(b, "cpu", c, id=f"{b}-cpu-{c}") for b in ("unfused", "sdpa")
              for c in _cases("cpu")]
    for backend in ("unfused", "sdpa", "portable", "cudnn"):
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
    elif backend == "sdpa":  # everything but packed sequences (thd needs a copy per sequence)
        assert report.chosen == ("unfused" if case.fmt == "thd" else "sdpa"), str(report)
    else:
        ok, why = _native_support(backend, case, device)
        assert report.chosen == (backend if ok else "unfused"), (why, str(report))
        if not ok:  # rejected with a reason (the frontend's rules may speak before the kernel)
            assert report.reasons(backend), str(report)
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
    """Stands in for kernels.attention's kernel query so the rule table is tested on any machine."""
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


def test_preference_order_nvidia_and_amd(fake_gpu, monkeypatch):
    fake_gpu(("cudnn", "portable"), "cuda")
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "cudnn"
    fake_gpu(("portable",), "cuda")
    # cuDNN declines: SDPA where it needs no dense mask (top-left causal), portable where it would
    report = bs.get_attention_backend(_cfg("cuda"))
    assert report.chosen == "sdpa" and report.reasons("cudnn") == ("fake cudnn kernel declines",)
    assert report.order == ("cudnn", "sdpa", "portable", "unfused")
    report = bs.get_attention_backend(_cfg("cuda", mask_type="padding_causal"))
    assert report.chosen == "portable" and report.order == ("cudnn", "portable", "sdpa", "unfused")
    monkeypatch.setenv("NVTE_SDPA_ATTN", "0")
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "portable"
    monkeypatch.delenv("NVTE_SDPA_ATTN")
    fake_gpu(("cudnn", "portable"), "rocm")   # AMD: SDPA first, never cuDNN or the FMA kernel
    report = bs.get_attention_backend(_cfg("cuda"))
    assert report.chosen == "sdpa" and "NVTE_FLASH_ATTN=1" in report.reasons("portable")[0]
    assert report.reasons("cudnn")
    monkeypatch.setenv("NVTE_SDPA_ATTN", "0")
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "unfused"
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")   # the explicit request reaches the FMA kernel
    assert bs.get_attention_backend(_cfg("cuda")).chosen == "portable"


@pytest.mark.parametrize("kw,needle,chosen", [
    (dict(mask_type="arbitrary"), "arbitrary", "sdpa"),   # SDPA takes the mask tensor
    (dict(has_bias=True), "bias", "unfused"),
])
def test_frontend_rules_send_to_unfused(fake_gpu, kw, needle, chosen):
    fake_gpu()
    report = bs.get_attention_backend(_cfg("cuda", **kw))
    assert report.chosen == chosen, str(report)
    assert needle in report.reasons("cudnn")[0] and needle in report.reasons("portable")[0]
    if chosen == "unfused":
        assert needle in report.reasons("sdpa")[0]


@pytest.mark.parametrize("var,backend,next_choice", [
    ("NVTE_FUSED_ATTN", "cudnn", "sdpa"),
    ("NVTE_FLASH_ATTN", "portable", "cudnn"),
    ("NVTE_SDPA_ATTN", "sdpa", "cudnn"),
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
    assert bs.get_attention_backend(_cfg("cpu")).chosen == "sdpa"    # SDPA's CPU kernels
    monkeypatch.setenv("NVTE_SDPA_ATTN", "0")
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


def test_attention_env_follows_every_change(monkeypatch):
    """The parsed attention variables are remembered per raw value set: every change between two
    calls is seen, and a bad value raises on every call, not once."""
    from transformer_engine.common import config as env
    base = env.attention_env()
    assert base.allowed == (True,) * 4 and base.allow_nondeterministic and base.debug_level == 0
    for var, value, field, want in (("NVTE_SDPA_ATTN", "0", "allowed", (True, True, True, False)),
                                    ("NVTE_FLASH_ATTN", "1", "portable_requested", True),
                                    ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0", "allow_nondeterministic", False),
                                    ("NVTE_DEBUG", "1", "debug_level", 1),
                                    ("NVTE_DEBUG_LEVEL", "2", "debug_level", 2)):
        monkeypatch.setenv(var, value)
        assert getattr(env.attention_env(), field) == want, var
    monkeypatch.setenv("NVTE_DEBUG", "0")
    assert env.attention_env().debug_level == 0     # the level counts only under NVTE_DEBUG
    for _ in range(2):
        monkeypatch.setenv("NVTE_UNFUSED_ATTN", "sometimes")
        with pytest.raises(ValueError, match="NVTE_UNFUSED_ATTN"):
            env.attention_env()
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", " 0 ")
    assert env.attention_env().allowed == (True, True, False, False)


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
        order = bs.sel.preference("rocm" if torch.version.hip else "cuda", cfg)
        assert report.order == order
        expected = next(b for b in order if b == "unfused" or (b == "sdpa" and report.accepted(b))
                        or (b != "sdpa" and report.accepted(b)
                            and attn_ops.native_attention_support(b, cfg)[0]))
        assert report.chosen == expected, str(report)


# ----- DotProductAttention features ------------------------------------------------------------

def _qkv(shape_q, shape_kv, dtype=torch.float32, device="cpu", seed=0):
    return (randn(shape_q, dtype, device, seed + 1).requires_grad_(),
            randn(shape_kv, dtype, device, seed + 2).requires_grad_(),
            randn(shape_kv, dtype, device, seed + 3).requires_grad_())


def test_padding_mask_tensor_equals_cu_seqlens():
    """A [b, 1, 1, s] padding mask (True = padded) and the equivalent cu_seqlens give one result."""
    q, k, v = _qkv((3, 13, 4, 16), (3, 13, 4, 16))
    lengths = torch.tensor([13, 6, 1])
    pad = (torch.arange(13)[None] >= lengths[:, None]).view(3, 1, 1, 13)
    cu = torch.tensor([0, 13, 19, 20], dtype=torch.int32)
    dpa = DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="padding_causal")
    a = dpa(q, k, v, attention_mask=pad)
    b = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # cross lengths: a (query mask, key mask) tuple
    kk, vv = randn((3, 9, 4, 16), torch.float32, "cpu", 5), randn((3, 9, 4, 16), torch.float32, "cpu", 6)
    kpad = (torch.arange(9)[None] >= torch.tensor([9, 2, 5])[:, None]).view(3, 1, 1, 9)
    c = dpa(q, kk, vv, attention_mask=(pad, kpad), attn_mask_type="padding")
    ref = attn_ops.attention_reference(q, kk, vv, qkv_format="bshd", mask_type="padding", softmax_scale=0.25,
                                       cu_seqlens_q=cu, cu_seqlens_kv=torch.tensor([0, 9, 11, 16], dtype=torch.int32))
    close(c, ref.reshape(c.shape), torch.float32)


def test_post_scale_bias_and_softmax_scale():
    q, k, v = _qkv((2, 9, 3, 8), (2, 12, 3, 8))
    bias = randn((1, 3, 9, 12), torch.float32, "cpu", 7)
    dpa = DotProductAttention(3, 8, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=0.7)
    out = dpa(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.7 + bias
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(out.shape)
    close(out, ref, torch.float32)
    assert dpa.last_backend_report.chosen == "unfused"


def test_checkpoint_core_attention_same_grads():
    q, k, v = _qkv((11, 2, 4, 16), (11, 2, 2, 16))
    dpa = DotProductAttention(4, 16, num_gqa_groups=2, attn_mask_type="causal")
    g = randn((11, 2, 64), torch.float32, "cpu", 8)
    plain = torch.autograd.grad(dpa(q, k, v), (q, k, v), g)
    ckpt = torch.autograd.grad(dpa(q, k, v, checkpoint_core_attention=True), (q, k, v), g)
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_attention_dropout_uses_rng_tracker():
    # the tracker forks the CUDA generator wherever CUDA exists, so the tensors follow it
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tracker = te.CudaRNGStatesTracker()

    def reseed():
        tracker.reset()
        tracker.add("model-parallel-rng", 1234)
    q, k, v = _qkv((2, 17, 2, 16), (2, 17, 2, 16), device=device)
    dpa = DotProductAttention(2, 16, attention_dropout=0.5, qkv_format="bshd",
                              get_rng_state_tracker=lambda: tracker)
    reseed()
    a = dpa(q, k, v)
    reseed()
    b = dpa(q, k, v)
    torch.testing.assert_close(a, b, rtol=0, atol=0)        # same tracker state: same dropout
    dpa.eval()
    c = dpa(q, k, v)
    assert not torch.allclose(a, c)                          # eval: no dropout
    ref = attn_ops.attention_reference(q, k, v, qkv_format="bshd", mask_type="causal", softmax_scale=0.25)
    close(c, ref.reshape(c.shape), torch.float32)


@pytest.mark.parametrize("kwargs,call,match", [
    (dict(attn_mask_type="sideways"), {}, "attn_mask_type"),
    (dict(qkv_format="hsbd"), {}, "qkv_format"),
    (dict(num_gqa_groups=3), {}, "num_gqa_groups"),
    (dict(window_size=(4, 2), attn_mask_type="causal"), {}, "causal"),
    (dict(window_size=(-3, 0)), {}, ">= -1"),
    (dict(attention_dropout=1.0), {}, "attention_dropout"),
])
def test_constructor_errors(kwargs, call, match):
    with pytest.raises(ValueError, match=match):
        DotProductAttention(4, 16, **kwargs)


def test_forward_errors():
    dpa = DotProductAttention(4, 16, qkv_format="bshd", attn_mask_type="padding")
    q = torch.randn(2, 5, 4, 16)
    with pytest.raises(ValueError, match="attention_mask"):
        dpa(q, q, q)                                         # padding without lengths
    with pytest.raises(ValueError, match="4 heads"):
        dpa(torch.randn(2, 5, 3, 16), q, q, attn_mask_type="causal")
    with pytest.raises(ValueError, match="thd"):
        dpa(q[0], q[0], q[0], qkv_format="thd")              # thd needs cu_seqlens
    with pytest.raises(ValueError, match="arbitrary"):
        dpa(q, q, q, attn_mask_type="arbitrary")             # arbitrary needs a mask tensor
    with pytest.raises(ValueError, match="attention_mask has shape"):
        dpa(q, q, q, attn_mask_type="arbitrary", attention_mask=torch.zeros(2, 1, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="dtype"):
        dpa(q, q.double(), q, attn_mask_type="causal")
    with pytest.raises(NotImplementedError, match="alibi"):
        dpa(q, q, q, attn_mask_type="causal", core_attention_bias_type="alibi")


# ----- RoPE --------------------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_table_and_apply(interleaved):
    """The table rotates pair (i, i + R/2) (or (2i, 2i+1)) by position * base^(-2i/R), and the
    channels past R pass through."""
    rope = RotaryPositionEmbedding(24, rotary_percent=0.5, interleaved=interleaved)
    freqs = rope(7, offset=2)
    assert freqs.shape == (7, 1, 1, 12) and freqs.dtype == torch.float32
    inv = 10000.0 ** (-torch.arange(0, 12, 2, dtype=torch.float32) / 12)
    angles = torch.outer(torch.arange(2, 9, dtype=torch.float32), inv)
    expect = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)
    torch.testing.assert_close(freqs.view(7, 12), expect)
    x = randn((7, 2, 3, 24), torch.float32, "cpu", 3)
    y = te.apply_rotary_pos_emb(x, freqs, "sbhd", interleaved=interleaved)
    torch.testing.assert_close(y[..., 12:], x[..., 12:], rtol=0, atol=0)
    pairs = (0, 1) if interleaved else (0, 6)
    c, s = angles[:, 0].cos().view(7, 1, 1), angles[:, 0].sin().view(7, 1, 1)
    a, b = x[..., pairs[0]], x[..., pairs[1]]
    torch.testing.assert_close(y[..., pairs[0]], a * c - b * s)
    torch.testing.assert_close(y[..., pairs[1]], b * c + a * s)
    half = RotaryPositionEmbedding(24, seq_len_interpolation_factor=2.0)(4)
    torch.testing.assert_close(half.view(4, 24)[:, 0], torch.arange(4.0) / 2)


# ----- packed QKV: strided views in, gradients into one buffer -----------------------------------

# (interleaved weight layout, heads, kv groups): interleaved packs MHA only (see can_pack)
PACKINGS = [(True, 4, 4), (False, 4, 4), (False, 6, 2)]
_SEQS = (19, 12)  # two sequences; bshd/sbhd use the first length for both


def _mixed(fmt, heads, groups, d, dtype, device, seed=0):
    lead = {"sbhd": (_SEQS[0], 2), "bshd": (2, _SEQS[0]), "thd": (sum(_SEQS),)}[fmt]
    return randn(lead + ((heads + 2 * groups) * d,), dtype, device, seed).requires_grad_()


def _split_copies(mixed, heads, groups, d, interleaved):
    """q, k, v as MultiheadAttention split them before packing (torch.split, contiguous)."""
    lead = mixed.shape[:-1]
    if interleaved:
        grouped = mixed.view(*lead, groups, heads // groups + 2, d)
        q, k, v = torch.split(grouped, (heads // groups, 1, 1), dim=-2)
        return q.reshape(*lead, heads, d), k.squeeze(-2), v.squeeze(-2)
    q, k, v = torch.split(mixed, (heads * d, groups * d, groups * d), dim=-1)
    return q.reshape(*lead, heads, d), k.reshape(*lead, groups, d), v.reshape(*lead, groups, d)


@pytest.mark.parametrize("interleaved,heads,groups", PACKINGS)
def test_split_packed_qkv_views_and_gradients(interleaved, heads, groups):
    """The packed split gives views of mixed (no copies) equal to torch.split's tensors, and the
    gradients torch.split gives, also when a view is unused (its part of the gradient is zero)."""
    mixed = _mixed("sbhd", heads, groups, 8, torch.float32, "cpu")
    assert attention_packed.can_pack(mixed, heads, groups, interleaved)
    q, k, v = attention_packed.split_packed_qkv(mixed, heads, groups, 8, interleaved)
    ref = _split_copies(mixed, heads, groups, 8, interleaved)
    lo, hi = mixed.data_ptr(), mixed.data_ptr() + mixed.numel() * mixed.element_size()
    for got, want in zip((q, k, v), ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert lo <= got.data_ptr() < hi and not got.is_contiguous()
    assert attention_packed.pack_of(q, k, v) is not None
    weights = [randn(t.shape, torch.float32, "cpu", 20 + i) for i, t in enumerate(ref)]
    for used in ((0, 1, 2), (0, 2)):
        got = torch.autograd.grad(sum((q, k, v)[i].mul(weights[i]).sum() for i in used), mixed)[0]
        want = torch.autograd.grad(sum(ref[i].mul(weights[i]).sum() for i in used), mixed)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="split_packed_qkv"):
        attention_packed.split_packed_qkv(mixed, 6, 2, 8, True)   # interleaved GQA: no views


def test_packed_gradient_buffer_becomes_the_gradient():
    """Gradients written as the pack's views of one buffer reach mixed as that buffer (no copy)."""
    seen = []

    class FillPacked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.pack = attention_packed.pack_of(q, k, v)
            return q.sum() + k.sum() + v.sum()

        @staticmethod
        def backward(ctx, g):
            buf, grads = ctx.pack.new_grads(zero=False)
            for i, t in enumerate(grads):
                t.fill_(i + 1.0)
            seen.append(buf)
            return grads

    leaf = _mixed("bshd", 4, 2, 8, torch.float32, "cpu")
    mixed = leaf * 1.0
    grads = []
    mixed.register_hook(grads.append)
    q, k, v = attention_packed.split_packed_qkv(mixed, 4, 2, 8, False)
    FillPacked.apply(q, k, v).backward()
    assert grads[0].data_ptr() == seen[0].data_ptr()
    want = torch.cat([torch.full((2, _SEQS[0], n * 8), float(i + 1)) for i, n in enumerate((4, 2, 2))], -1)
    torch.testing.assert_close(grads[0], want, rtol=0, atol=0)


@_GPU_MARK
@pytest.mark.parametrize("backend", ["cudnn", "portable"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved,heads,groups", PACKINGS)
def test_packed_qkv_attention(backend, fmt, interleaved, heads, groups, monkeypatch):
    """DotProductAttention on the views of a packed projection equals the reference on copies,
    forward and mixed's gradient; cuDNN reads the views in place and writes the gradients into
    one packed buffer that becomes mixed's gradient (the portable kernels work on copies)."""
    for var, val in FORCE[backend].items():
        monkeypatch.setenv(var, val)
    d, dtype = 64, torch.bfloat16
    mixed = _mixed(fmt, heads, groups, d, dtype, "cuda", seed=3)
    mask = "padding_causal" if fmt == "thd" else "causal"
    cu = torch.tensor([0, _SEQS[0], sum(_SEQS)], dtype=torch.int32, device="cuda")
    extra = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(_SEQS),
                 max_seqlen_kv=max(_SEQS)) if fmt == "thd" else {}
    buffers, grads = [], []
    new_grads = attention_packed.QKVPack.new_grads

    def spy(self, zero):
        buf, views = new_grads(self, zero)
        buffers.append(buf)
        return buf, views
    monkeypatch.setattr(attention_packed.QKVPack, "new_grads", spy)
    inner = mixed * 1.0
    inner.register_hook(grads.append)
    q, k, v = attention_packed.split_packed_qkv(inner, heads, groups, d, interleaved)
    dpa = DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format=fmt, attn_mask_type=mask)
    out = dpa(q, k, v, **extra)
    assert dpa.last_backend_report.chosen == backend, str(dpa.last_backend_report)
    g_out = randn(out.shape, dtype, "cuda", 9)
    out.backward(g_out)
    ref_mixed = mixed.detach().clone().requires_grad_()
    rq, rk, rv = (t.contiguous() for t in _split_copies(ref_mixed, heads, groups, d, interleaved))
    ref = attn_ops.attention_reference(rq, rk, rv, qkv_format=fmt, mask_type=mask,
                                       softmax_scale=d ** -0.5, **extra).reshape(out.shape)
    ref.backward(g_out)
    close(out, ref, dtype)
    close(mixed.grad, ref_mixed.grad, dtype, roundings=8)
    if backend == "cudnn":
        assert len(buffers) == 1 and grads[0].data_ptr() == buffers[0].data_ptr()
    else:
        assert not buffers


@_GPU_MARK
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_fused_attention_strided_views(fmt):
    """The op takes transposed views (bshd over sbhd storage and back): cuDNN reads them in place
    and returns gradients with their strides, equal to the contiguous call's results; malformed
    strides are refused by the C API with a reason."""
    other = "bshd" if fmt == "sbhd" else "sbhd"
    shape = (37, 2, 4, 64)  # the storage, in the other layout
    base = [randn(shape, torch.float16, "cuda", i).transpose(0, 1) for i in range(3)]
    kw = dict(backend="cudnn", qkv_format=fmt, mask_type="causal", softmax_scale=0.125)
    out, lse, rng = attn_ops.fused_attention_forward(*base, **kw)
    dense = [t.contiguous() for t in base]
    out_c, lse_c, _ = attn_ops.fused_attention_forward(*dense, **kw)
    close(out, out_c, torch.float16)
    torch.testing.assert_close(lse, lse_c, rtol=1e-5, atol=1e-5)
    d_out = randn(out.shape, torch.float16, "cuda", 5)
    grads = attn_ops.fused_attention_backward(*base, out, d_out, lse, rng, **kw)
    grads_c = attn_ops.fused_attention_backward(*dense, out_c, d_out, lse_c, rng, **kw)
    for g, gc, t in zip(grads, grads_c, base):
        assert g.stride() == t.stride(), (other, g.stride(), t.stride())
        close(g, gc, torch.float16, roundings=8)
    params = attn_ops._params_tuple(2, 4, 4, 37, 37, 64, 64, torch.float16, fmt, "causal", -1, 0,
                                    0.125, False, strides=(12, 4, 4) + (0,) * 9)
    ok, reason = attn_ops.native.native_for_torch().attention_support(
        attn_ops.BACKEND_CODE["cudnn"], params, torch.cuda.current_device())
    assert not ok and "multiples of 8" in reason, reason
