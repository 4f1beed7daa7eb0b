"""JAX attention behind its dispatcher: every backend forced in turn (unfused and sdpa on the CPU;
the native cuDNN / portable custom calls on the GPU) against the jnp reference
(kernels.attention.attention_reference), forward and gradients, over mask types, bshd/sbhd, GQA,
windows and odd lengths; the selection and its explanations (ROCm asked through assume_vendor),
which match the PyTorch frontend's; the Flax module's seq-first layout."""
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax_utils import ON_GPU, assert_close, rand  # noqa: E402
from transformer_engine.common import attention_selection as sel  # noqa: E402
from transformer_engine.jax import fused_attn  # noqa: E402
from transformer_engine.jax.kernels import attention as JA  # noqa: E402
from transformer_engine.jax.primitives import attention_selection as jsel  # noqa: E402

SWITCHES = {"cudnn": "NVTE_FUSED_ATTN", "portable": "NVTE_FLASH_ATTN", "unfused": "NVTE_UNFUSED_ATTN",
            "sdpa": "NVTE_SDPA_ATTN"}
GPU_ONLY = pytest.mark.skipif(not ON_GPU, reason="no GPU: the native attention custom calls run on a GPU")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in list(SWITCHES.values()) + ["NVTE_DEBUG", "NVTE_DEBUG_LEVEL", "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
                                          "NVTE_JAX_CUSTOM_CALLS"]:
        monkeypatch.delenv(var, raising=False)
    jsel.clear_backend_cache()
    yield
    jsel.clear_backend_cache()


def _force(monkeypatch, backend):
    for name, var in SWITCHES.items():
        monkeypatch.setenv(var, "1" if name == backend else "0")
    jsel.clear_backend_cache()


# (format, mask type, hq, hkv, sq, sk, head dim, window)
CASES = [
    ("bshd", "no_mask", 4, 4, 37, 37, 64, None),
    ("bshd", "causal", 4, 2, 29, 29, 64, None),
    ("sbhd", "causal", 6, 1, 13, 40, 128, None),          # top-left with sq < sk
    ("bshd", "causal_bottom_right", 4, 2, 23, 41, 64, None),
    ("sbhd", "no_mask", 4, 4, 33, 33, 64, (7, 3)),
    ("bshd", "causal", 4, 1, 45, 45, 128, (9, 0)),
]


def _inputs(case, dtype, seed=0):
    fmt, _, hq, hkv, sq, sk, d, _ = case
    b = 2
    shape = (lambda s, h: (b, s, h, d)) if fmt == "bshd" else (lambda s, h: (s, b, h, d))
    return (rand(shape(sq, hq), dtype, seed + 1), rand(shape(sk, hkv), dtype, seed + 2),
            rand(shape(sk, hkv), dtype, seed + 3))


def _reference(q, k, v, case):
    fmt, mask, *_, d, window = case
    return JA.attention_reference(q, k, v, qkv_format=fmt, mask_type=mask,
                                  window_size=window or (-1, -1), softmax_scale=1 / math.sqrt(d))


def _check_case(case, dtype, backend):
    fmt, mask, *_, window = case
    q, k, v = _inputs(case, dtype)
    fn = lambda q, k, v: fused_attn(q, k, v, attn_mask_type=mask, window_size=window, qkv_format=fmt)
    out, vjp = jax.vjp(jax.jit(fn), q, k, v)
    ref, ref_vjp = jax.vjp(lambda q, k, v: _reference(q, k, v, case), q, k, v)
    g = rand(out.shape, dtype, 9)
    _, _, hq, hkv, sq, sk, d, _ = case
    report = jsel.get_attention_backend(jsel.AttentionConfig(
        2, hq, hkv, sq, sk, d, d, jnp.dtype(dtype).name, fmt, mask, window or (-1, -1)))
    assert_close(out, ref, dtype, f"{backend} forward", scale=4, of_max=True)
    for name, a, b in zip("qkv", vjp(g), ref_vjp(g)):
        assert_close(a, b, dtype, f"{backend} d{name}", scale=8, of_max=True)
    return report


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-w{c[7]}" for c in CASES])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("backend", ["unfused", "sdpa"])
def test_forced_backend_matches_reference_cpu(backend, dtype, case, monkeypatch):
    with jax.default_device(jax.devices("cpu")[0]):
        _force(monkeypatch, backend)
        report = _check_case(case, dtype, backend)
    if backend == "sdpa" and not ON_GPU:
        # XLA's attention takes every case but those needing a dense mask
        dense = sel.needs_dense_mask(case[1], case[7] or (-1, -1), case[4], case[5])
        assert report.chosen == ("unfused" if dense else "sdpa"), str(report)


@GPU_ONLY
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-w{c[7]}" for c in CASES])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("backend", ["cudnn", "portable", "sdpa", "unfused"])
def test_forced_backend_matches_reference_gpu(backend, dtype, case, monkeypatch):
    _force(monkeypatch, backend)
    report = _check_case(case, dtype, backend)
    if backend in ("cudnn", "portable") and report.chosen != backend:
        assert report.reasons(backend), str(report)   # a refusal comes with its reason


@GPU_ONLY
def test_default_choice_is_the_native_custom_call():
    case = ("bshd", "causal", 16, 4, 256, 256, 128, None)
    q, k, v = _inputs(case, jnp.bfloat16)
    cfg = jsel.AttentionConfig(2, 16, 4, 256, 256, 128, 128, "bfloat16", "bshd", "causal")
    report = jsel.get_attention_backend(cfg)
    if jsel.vendor() == "cuda":
        assert report.chosen in ("cudnn", "sdpa", "portable"), str(report)
    else:
        assert report.chosen in ("sdpa", "unfused"), str(report)
    hlo = jax.jit(lambda q, k, v: fused_attn(q, k, v, attn_mask_type="causal")).lower(q, k, v).as_text()
    if report.chosen in ("cudnn", "portable"):
        assert "te_attention_fwd_ffi" in hlo


# ----- selection ----------------------------------------------------------------------------------

def _cfg(**kw):
    base = dict(batch=4, num_heads_q=32, num_heads_kv=8, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=128,
                head_dim_v=128, dtype_name="bfloat16", qkv_format="bshd", mask_type="causal")
    base.update(kw)
    return jsel.AttentionConfig(**base)


def test_cpu_runs_the_jnp_path_with_reasons():
    if ON_GPU:
        pytest.skip("the CPU's choice is asked on a machine whose JAX backend is the CPU")
    report = jsel.get_attention_backend(_cfg())
    assert report.chosen == "unfused" and report.vendor == "cpu"
    assert "custom call" in report.reasons("cudnn")[0] and "custom call" in report.reasons("portable")[0]


@pytest.mark.parametrize("xla_fused", [True, False])
def test_rocm_selection(xla_fused, monkeypatch):
    """ROCm: jax.nn.dot_product_attention where XLA has a fused path, else the jnp path; never the
    FMA portable kernel, whatever the kernels accept."""
    monkeypatch.setattr(jsel, "xla_fused_attention_reason", lambda v: "" if xla_fused else "no fused path")
    monkeypatch.setattr(jsel, "native_support", lambda call: (True, ""))
    monkeypatch.setattr(jsel, "why_reference", lambda op: "")
    with sel.assume_vendor("rocm"):
        for kw in (dict(), dict(num_heads_kv=32, dtype_name="float16"), dict(qkv_format="sbhd", mask_type="no_mask")):
            report = jsel.get_attention_backend(_cfg(**kw))
            assert report.chosen == ("sdpa" if xla_fused else "unfused"), str(report)
            assert "NVTE_FLASH_ATTN=1" in report.reasons("portable")[0]
        for kw in (dict(has_mask_tensor=True), dict(dropout_p=0.1), dict(has_bias=True),
                   dict(dtype_name="float32"), dict(window_size=(128, 0))):
            assert jsel.get_attention_backend(_cfg(**kw)).chosen == "unfused"


def test_nvidia_order(monkeypatch):
    monkeypatch.setattr(jsel, "xla_fused_attention_reason", lambda v: "")
    monkeypatch.setattr(jsel, "native_support", lambda call: (True, ""))
    monkeypatch.setattr(jsel, "why_reference", lambda op: "")
    with sel.assume_vendor("cuda"):
        assert jsel.get_attention_backend(_cfg()).chosen == "cudnn"
        monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
        assert jsel.get_attention_backend(_cfg()).chosen == "sdpa"
        assert jsel.get_attention_backend(_cfg(window_size=(64, 0))).chosen == "portable"
        monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
        report = jsel.get_attention_backend(_cfg(deterministic=True))
        assert report.chosen == "portable" and "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in report.reasons("sdpa")[0]


def test_explanations_match_pytorch():
    """The framework-neutral rules speak the same sentences in both frontends."""
    torch = pytest.importorskip("torch")
    from transformer_engine.pytorch.attention import backend_selection as bs
    from transformer_engine.pytorch.kernels.attention import AttentionConfig
    for kw_j, kw_t in ((dict(has_bias=True), dict(has_bias=True)),
                       (dict(head_dim_qk=76, head_dim_v=76), dict(head_dim_qk=76, head_dim_v=76)),
                       (dict(dtype_name="float32"), dict(dtype=torch.float32))):
        with sel.assume_vendor("rocm"):
            j = jsel.get_attention_backend(_cfg(**kw_j))
            base = dict(batch=4, num_heads_q=32, num_heads_kv=8, seqlen_q=2048, seqlen_kv=2048,
                        head_dim_qk=128, head_dim_v=128, dtype=torch.bfloat16, device=torch.device("cpu"),
                        qkv_format="bshd", mask_type="causal")
            base.update(kw_t)
            t = bs.get_attention_backend(AttentionConfig(**base))
        assert j.reasons("sdpa") == t.reasons("sdpa") and j.reasons("sdpa"), (str(j), str(t))
        assert j.reasons("portable") == t.reasons("portable")


def test_debug_log(capfd, monkeypatch):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    jsel.get_attention_backend(_cfg(dropout_p=0.2, seqlen_q=77))
    err = capfd.readouterr().err
    assert "attention backend: unfused" in err and "dropout is not implemented" in err


# ----- frontend behaviour -------------------------------------------------------------------------

def test_padding_mask_and_dropout_run_the_jnp_path():
    q = rand((2, 11, 4, 32), jnp.float32, 1)
    lengths = np.array([11, 6])
    pad = jnp.asarray(np.arange(11)[None, :] >= lengths[:, None])
    mask = pad[:, None, None, :] | pad[:, None, :, None]
    out = fused_attn(q, q, q, mask=mask, attn_mask_type="padding")
    cu = jnp.asarray([0, 11, 17], jnp.int32)
    ref = JA.attention_reference(q, q, q, qkv_format="bshd", mask_type="padding", softmax_scale=32 ** -0.5,
                                 cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert_close(out[0], ref[0], jnp.float32)
    assert_close(out[1, :6], ref[1, :6], jnp.float32)
    a = fused_attn(q, q, q, attn_mask_type="causal", dropout_probability=0.3, dropout_rng=jax.random.PRNGKey(0))
    b = fused_attn(q, q, q, attn_mask_type="causal")
    assert not np.allclose(np.asarray(a), np.asarray(b))


def test_bad_arguments():
    q = rand((2, 5, 4, 8), jnp.float32, 1)
    with pytest.raises(ValueError, match="fused_attn: qkv_format"):
        fused_attn(q, q, q, qkv_format="thd")
    with pytest.raises(ValueError, match="fused_attn: 4 query heads"):
        fused_attn(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="fused_attn: attn_mask_type"):
        fused_attn(q, q, q, attn_mask_type="diagonal")


def test_flax_seq_first_equals_batch_first():
    from transformer_engine.jax.flax import DotProductAttention
    q = rand((2, 9, 4, 16), jnp.float32, 1)
    k = rand((2, 9, 2, 16), jnp.float32, 2)
    mod = DotProductAttention(head_dim=16, num_attention_heads=4, num_gqa_groups=2, attn_mask_type="causal")
    seq = DotProductAttention(head_dim=16, num_attention_heads=4, num_gqa_groups=2, attn_mask_type="causal",
                              transpose_batch_sequence=True, qkv_layout="sbhd_sbhd_sbhd")
    a = mod.apply({}, q, k, k)
    b = seq.apply({}, *(jnp.swapaxes(t, 0, 1) for t in (q, k, k)))
    assert_close(jnp.swapaxes(b, 0, 1), a, jnp.float32)
    ref = JA.attention_reference(q, k, k, qkv_format="bshd", mask_type="causal", softmax_scale=0.25)
    assert_close(a, ref, jnp.float32)
