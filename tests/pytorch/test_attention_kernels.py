"""Native attention backends ('portable', 'cudnn') against the plain-torch attention_reference:
forward output and lse, gradients of q/k/v, over dtypes x masks x layouts (thd included) x GQA x
sliding windows x head dims x odd sequence lengths; the two backends cross-checked; bad input.

Tolerances: the shared table's rtol for the dtype; atol is that rtol times the largest reference
magnitude (attention outputs are averages, so an element-wise atol of 1e-5 would judge rounding
of values near zero; gradients sum over the sequence and get twice that).
"""
import math

import pytest
import torch

from transformer_engine.pytorch.kernels import attention as A
from utils import native_gpu_reason, requires_native_gpu, seeded, tols

DTYPES = [torch.float16, torch.bfloat16]

# (name, qkv_format, mask_type, heads_q, heads_kv, seqlens_q, seqlens_kv, head_dim, window,
#  cuDNN must run it on Hopper). seqlens are per sequence; padded layouts take the max as extent.
CASES = [
    ("bshd_nomask", "bshd", "no_mask", 4, 4, [128, 128], [128, 128], 64, (-1, -1), True),
    ("bshd_causal_d128", "bshd", "causal", 4, 4, [77, 77], [77, 77], 128, (-1, -1), True),
    ("sbhd_causal_br_gqa", "sbhd", "causal_bottom_right", 4, 2, [61, 61], [93, 93], 64, (-1, -1), True),
    ("bshd_causal_tl_mqa", "bshd", "causal", 4, 1, [33, 33], [70, 70], 64, (-1, -1), True),
    ("sbhd_nomask_d128", "sbhd", "no_mask", 2, 2, [45, 45], [190, 190], 128, (-1, -1), True),
    ("bshd_padding_gqa", "bshd", "padding", 4, 2, [100, 37], [100, 71], 128, (-1, -1), True),
    ("bshd_padding_causal", "bshd", "padding_causal", 4, 4, [90, 13], [90, 13], 64, (-1, -1), True),
    ("bshd_padding_causal_br", "bshd", "padding_causal_bottom_right", 4, 2, [50, 7], [80, 33], 64, (-1, -1), True),
    ("thd_padding", "thd", "padding", 4, 4, [37, 1, 64], [37, 1, 64], 64, (-1, -1), True),
    ("thd_padding_causal_d128", "thd", "padding_causal", 4, 2, [70, 129, 5], [70, 129, 5], 128, (-1, -1), True),
    ("thd_padding_causal_br_mqa", "thd", "padding_causal_bottom_right", 4, 1, [20, 3, 60], [41, 3, 99], 64, (-1, -1), True),
    ("bshd_window_sym", "bshd", "no_mask", 4, 4, [150, 150], [150, 150], 64, (16, 16), False),
    ("bshd_causal_window", "bshd", "causal", 4, 2, [129, 129], [129, 129], 128, (32, 0), True),
    ("sbhd_causal_window_diag", "sbhd", "causal", 2, 2, [40, 40], [40, 40], 64, (0, 0), False),
    ("bshd_decode_br", "bshd", "causal_bottom_right", 4, 2, [1, 1], [300, 300], 128, (-1, -1), True),
    ("bshd_causal_long", "bshd", "causal", 2, 2, [515, 515], [515, 515], 128, (-1, -1), True),
    ("thd_causal_window", "thd", "padding_causal", 4, 4, [100, 33], [100, 33], 64, (20, 0), True),
    # several query and key tiles of the tensor-core kernels (forward: 128 queries x 64 keys at
    # d128, x 128 at d64; backward: 128 keys x 64 queries single pass, 64 x 64 deterministic)
    # with ragged ends; queries that see no key inside a tile row (bottom-right, lq > lk)
    ("bshd_nomask_tiles_gqa_d128", "bshd", "no_mask", 4, 2, [300, 300], [333, 333], 128, (-1, -1), True),
    ("bshd_causal_br_keyless_rows", "bshd", "causal_bottom_right", 2, 2, [200, 200], [77, 77], 64, (-1, -1), False),
]
CASE_IDS = [c[0] for c in CASES]


def _cu(lengths, device):
    return torch.tensor([0] + list(itertools_accumulate(lengths)), dtype=torch.int32, device=device)


def itertools_accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def _rand(shape, dtype, device, seed):
    return torch.randn(shape, generator=seeded(seed)).to(dtype).to(device)


def make_inputs(case, dtype, device, seed=0):
    """q, k, v, d_out and the keyword arguments of one case."""
    _, fmt, mask, hq, hkv, lq, lk, d, window, _ = case
    b = len(lq)
    uses_lengths = fmt == "thd" or A.is_padding(mask)
    if fmt == "thd":
        q_shape, kv_shape = (sum(lq), hq, d), (sum(lk), hkv, d)
    else:
        sq, skv = max(lq), max(lk)
        q_shape = (b, sq, hq, d) if fmt == "bshd" else (sq, b, hq, d)
        kv_shape = (b, skv, hkv, d) if fmt == "bshd" else (skv, b, hkv, d)
    q = _rand(q_shape, dtype, device, seed)
    k = _rand(kv_shape, dtype, device, seed + 1)
    v = _rand(kv_shape, dtype, device, seed + 2)
    d_out = _rand(q_shape, dtype, device, seed + 3)
    kw = dict(qkv_format=fmt, mask_type=mask, window_size=window,
              softmax_scale=1.0 / math.sqrt(d))
    if uses_lengths:
        kw.update(cu_seqlens_q=_cu(lq, device), cu_seqlens_kv=_cu(lk, device),
                  max_seqlen_q=max(lq), max_seqlen_kv=max(lk))
    return q, k, v, d_out, kw


def _valid_rows(case, device):
    """[b, hq, sq] bool: query rows that exist (not padding) and see at least one key."""
    _, fmt, mask, hq, hkv, lq, lk, d, window, _ = case
    b, sq, skv = len(lq), max(lq), max(lk)
    uses = fmt == "thd" or A.is_padding(mask)
    lqt = torch.tensor(lq if uses else [sq] * b, device=device)
    lkt = torch.tensor(lk if uses else [skv] * b, device=device)
    vis = A._visible_mask(b, sq, skv, lqt, lkt, mask, window, device)
    return vis.any(-1).expand(b, hq, sq)


def reference(q, k, v, d_out, kw):
    """Reference forward (fp32 maths) and its gradients by autograd."""
    qr, kr, vr = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    out, lse = A.attention_reference(qr, kr, vr, return_lse=True, **kw)
    out.backward(d_out.float())
    return out.detach(), lse.detach(), qr.grad, kr.grad, vr.grad


def assert_close(got, want, dtype, scale=1.0, what=""):
    t = tols(dtype)
    atol = scale * t["rtol"] * max(float(want.abs().max()), 1e-3)
    torch.testing.assert_close(got.float(), want.float(), rtol=t["rtol"] * scale, atol=atol,
                               msg=lambda m: f"{what}: {m}")


# 'portable_fma' is the portable backend with its FMA kernels: the kernels AMD builds run,
# checked here on NVIDIA too ('portable' takes the tensor cores: register-level mma.sync kernels
# on sm_80+, where the build maps them).
BACKENDS = ["cudnn", "portable", "portable_fma"]


def _backend_and_variant(backend):
    return ("portable", "fma") if backend == "portable_fma" else (backend, "auto")


def _run_backend(backend, case, dtype):
    backend, variant = _backend_and_variant(backend)
    q, k, v, d_out, kw = make_inputs(case, dtype, "cuda")
    with A.portable_kernel_variant(variant):
        out, lse, rng = A.fused_attention_forward(q, k, v, backend=backend, **kw)
        dq, dk, dv = A.fused_attention_backward(q, k, v, out, d_out, lse, rng, backend=backend,
                                                **kw)
    return (q, k, v, d_out, kw), (out, lse, dq, dk, dv)


def _support(backend, case, dtype):
    q, k, v, _, kw = make_inputs(case, dtype, "cuda")
    cfg = A.AttentionConfig.from_tensors(q, k, v, qkv_format=kw["qkv_format"],
                                         mask_type=kw["mask_type"], window_size=kw["window_size"],
                                         cu_seqlens_q=kw.get("cu_seqlens_q"),
                                         max_seqlen_q=kw.get("max_seqlen_q"),
                                         max_seqlen_kv=kw.get("max_seqlen_kv"))
    return A.native_attention_support(backend, cfg)


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 \
        and torch.version.hip is None


def _not_built(reason):
    """A build without cuDNN (its headers absent at build time) legitimately refuses it."""
    return reason.startswith("not built") and "cuDNN" in reason


# ----- numerics of each backend -----------------------------------------------------------------

@requires_native_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_reference(backend, case, dtype):
    ok, reason = _support(_backend_and_variant(backend)[0], case, dtype)
    must = backend.startswith("portable") or (case[-1] and _hopper())
    if not ok:
        # a refusal is legitimate only where the case does not require the backend, and the call
        # itself must then refuse with the same reason
        assert not must or (backend == "cudnn" and _not_built(reason)), \
            f"{backend} refused {case[0]}: {reason}"
        assert reason, "a refusal carries a reason"
        q, k, v, _, kw = make_inputs(case, dtype, "cuda")
        with pytest.raises(NotImplementedError, match=backend):
            A.fused_attention_forward(q, k, v, backend=_backend_and_variant(backend)[0], **kw)
        return
    (q, k, v, d_out, kw), (out, lse, dq, dk, dv) = _run_backend(backend, case, dtype)
    r_out, r_lse, r_dq, r_dk, r_dv = reference(q, k, v, d_out, kw)
    assert torch.isfinite(out.float()).all() and torch.isfinite(dq.float()).all()
    assert_close(out, r_out, dtype, what="out")
    rows = _valid_rows(case, q.device)
    torch.testing.assert_close(lse[rows], r_lse[rows], rtol=1e-3, atol=1e-3)
    assert_close(dq, r_dq, dtype, 2.0, "dq")
    assert_close(dk, r_dk, dtype, 2.0, "dk")
    assert_close(dv, r_dv, dtype, 2.0, "dv")


@requires_native_gpu
@pytest.mark.parametrize("case", [c for c in CASES if c[-1]], ids=[c[0] for c in CASES if c[-1]])
def test_backends_agree(case):
    """cuDNN and the portable kernel on the same inputs (bf16)."""
    dtype = torch.bfloat16
    ok, reason = _support("cudnn", case, dtype)
    if not ok:  # on Hopper only a build without cuDNN may refuse these cases
        assert reason and (not _hopper() or _not_built(reason)), reason
        return
    _, a = _run_backend("portable", case, dtype)
    _, b = _run_backend("cudnn", case, dtype)
    _, c = _run_backend("portable_fma", case, dtype)
    pairs = [(n, x, y) for n, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b)]
    pairs += [(n, x, y) for n, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, c)]
    for name, x, y in pairs:
        scale = 1.0 if name in ("out", "lse") else 2.0
        if name == "lse":
            rows = _valid_rows(case, x.device)
            torch.testing.assert_close(x[rows], y[rows], rtol=1e-3, atol=1e-3)
        else:
            assert_close(x, y, dtype, 2 * scale, name)


@requires_native_gpu
def test_autograd_function_and_determinism():
    case = CASES[5]  # padding, GQA
    q, k, v, d_out, kw = make_inputs(case, torch.bfloat16, "cuda", seed=7)
    grads = []
    for _ in range(2):
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = A.FusedAttention.apply(qg, kg, vg, "portable", kw["qkv_format"], kw["mask_type"],
                                     kw["window_size"], kw["softmax_scale"], 0.0,
                                     kw["cu_seqlens_q"], kw["cu_seqlens_kv"], kw["max_seqlen_q"],
                                     kw["max_seqlen_kv"], True)
        out.backward(d_out)
        grads.append((qg.grad, kg.grad, vg.grad))
    for g1, g2 in zip(*grads):
        assert torch.equal(g1, g2), "the portable backward is deterministic"
    r = reference(q, k, v, d_out, kw)
    assert_close(grads[0][0], r[2], torch.bfloat16, 2.0, "dq")


@requires_native_gpu
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_portable_backward_both_schemes(case):
    """The portable backward's two schemes on the same forward: deterministic=True (dK/dV and dQ
    passes, no atomics; bit for bit reproducible) and the default single pass (dQ summed with
    fp32 atomics on the tensor cores), each against the reference."""
    dtype = torch.bfloat16
    q, k, v, d_out, kw = make_inputs(case, dtype, "cuda", seed=3)
    out, lse, rng = A.fused_attention_forward(q, k, v, backend="portable", **kw)
    want = reference(q, k, v, d_out, kw)[2:]
    first = {}
    for deterministic in (True, False, True, False):
        grads = A.fused_attention_backward(q, k, v, out, d_out, lse, rng, backend="portable",
                                           deterministic=deterministic, **kw)
        for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
            assert torch.isfinite(got.float()).all(), f"{name}: not finite"
            assert_close(got, ref, dtype, 2.0, f"{name} (deterministic={deterministic})")
        if deterministic and deterministic in first:
            for name, a, b in zip(("dq", "dk", "dv"), first[deterministic], grads):
                assert torch.equal(a, b), f"{name}: the deterministic backward changed"
        first.setdefault(deterministic, grads)
    for name, a, b in zip(("dq", "dk", "dv"), first[True], first[False]):
        assert_close(b, a, dtype, 2.0, f"{name}: single pass vs deterministic")


@requires_native_gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_rows_are_zero(backend):
    """Padded positions of a bshd padding layout: zero outputs and gradients."""
    case = CASES[6]
    _, (out, _, dq, dk, dv) = _run_backend(backend, case, torch.float16)
    lq, lk = case[5], case[6]
    for bi in range(len(lq)):
        for t, length in ((out, lq[bi]), (dq, lq[bi]), (dk, lk[bi]), (dv, lk[bi])):
            assert torch.count_nonzero(t[bi, length:]) == 0


# ----- support answers and bad input ---------------------------------------------------------

def test_support_reports_reasons():
    q = torch.randn(2, 16, 4, 64)
    cfg = A.AttentionConfig.from_tensors(q, q, q, qkv_format="bshd", mask_type="causal")
    for backend in A.NATIVE_BACKENDS:
        ok, reason = A.native_attention_support(backend, cfg)
        assert not ok and reason  # CPU tensors: never native
    with pytest.raises(ValueError, match="backend"):
        A.native_attention_support("flash", cfg)
    if native_gpu_reason():
        return
    dev = torch.device("cuda")
    base = dict(batch=2, num_heads_q=4, num_heads_kv=4, seqlen_q=64, seqlen_kv=64,
                head_dim_qk=64, head_dim_v=64, dtype=torch.bfloat16, device=dev)
    ok, reason = A.native_attention_support("portable", A.AttentionConfig(**base))
    assert ok and reason == ""
    for change, word in ((dict(dtype=torch.float32), "float32"), (dict(head_dim_qk=80, head_dim_v=80), "80"),
                         (dict(head_dim_v=128), "differ"), (dict(mask_type="arbitrary"), "arbitrary"),
                         (dict(dropout_p=0.1), "dropout"), (dict(num_heads_kv=3), "multiple"),
                         (dict(has_bias=True), "bias")):
        ok, reason = A.native_attention_support("portable", A.AttentionConfig(**{**base, **change}))
        assert not ok and word in reason, (change, reason)


BAD_INPUTS = [
    ("dtype", lambda q, k, v, kw: (q.float(), k.float(), v.float(), kw), ValueError, "dtype"),
    ("kv_heads", lambda q, k, v, kw: (q[:, :, :3].contiguous(), k, v, kw), ValueError, "multiple"),
    ("head_dim", lambda q, k, v, kw: (q, k[..., :32].contiguous(), v, kw), ValueError, "head dim"),
    # strided q/k/v are valid input (cuDNN reads them in place, the rest copies them):
    # test_attention.py::test_fused_attention_strided_views
    ("format", lambda q, k, v, kw: (q, k, v, {**kw, "qkv_format": "bhsd"}), ValueError, "qkv_format"),
    ("mask", lambda q, k, v, kw: (q, k, v, {**kw, "mask_type": "tril"}), ValueError, "mask_type"),
    ("thd_no_cu", lambda q, k, v, kw: (q[0], k[0], v[0], {**kw, "qkv_format": "thd"}), ValueError, "cu_seqlens"),
    ("padding_cu_dtype", lambda q, k, v, kw: (q, k, v, {**kw, "mask_type": "padding",
     "cu_seqlens_q": torch.tensor([0, 3, 6], device=q.device), "cu_seqlens_kv": torch.tensor([0, 3, 6], device=q.device)}),
     ValueError, "int32"),
    ("scale", lambda q, k, v, kw: (q, k, v, {**kw, "softmax_scale": float("nan")}), ValueError, "softmax_scale"),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_native_gpu)])
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises(bad, device):
    _, mutate, exc, word = bad
    q = _rand((2, 24, 4, 64), torch.bfloat16, device, 0)
    k = _rand((2, 24, 2, 64), torch.bfloat16, device, 1)
    v = _rand((2, 24, 2, 64), torch.bfloat16, device, 2)
    kw = dict(qkv_format="bshd", mask_type="causal", softmax_scale=0.125)
    q, k, v, kw = mutate(q, k, v, kw)
    with pytest.raises(exc, match=word):
        A.fused_attention_forward(q, k, v, backend="portable", **kw)


def test_cpu_tensors_refused_with_reason():
    q = _rand((2, 24, 4, 64), torch.bfloat16, "cpu", 0)
    with pytest.raises(NotImplementedError, match="GPU|not built"):
        A.fused_attention_forward(q, q, q, backend="portable", qkv_format="bshd",
                                  mask_type="no_mask", softmax_scale=0.125)


# ----- the reference itself (runs everywhere) --------------------------------------------------

@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
def test_reference_matches_sdpa(mask):
    q = _rand((2, 37, 4, 32), torch.float32, "cpu", 0)
    k = _rand((2, 53, 2, 32), torch.float32, "cpu", 1)
    v = _rand((2, 53, 2, 32), torch.float32, "cpu", 2)
    out = A.attention_reference(q, k, v, qkv_format="bshd", mask_type=mask, softmax_scale=0.2)
    i = torch.arange(37).view(-1, 1)
    j = torch.arange(53).view(1, -1)
    allowed = {"no_mask": torch.ones(37, 53, dtype=torch.bool), "causal": j <= i,
               "causal_bottom_right": j <= i + 16}[mask]
    # SDPA in float64: its fp32 CPU kernels differ from the exact result by up to ~2e-5 on some
    # CPUs (blocked online softmax), more than the fp32 tolerance; the reference must be within
    # that tolerance of the exact value
    q64, k64, v64 = (t.double() for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(
        q64.transpose(1, 2), k64.repeat_interleave(2, 2).transpose(1, 2),
        v64.repeat_interleave(2, 2).transpose(1, 2), attn_mask=allowed, scale=0.2).transpose(1, 2)
    torch.testing.assert_close(out, want.float(), **tols(torch.float32))


def test_reference_thd_equals_per_sequence():
    lq, lk = [5, 17, 1], [9, 17, 30]
    case = ("x", "thd", "padding_causal_bottom_right", 4, 2, lq, lk, 32, (6, 0), False)
    q, k, v, _, kw = make_inputs(case, torch.float32, "cpu")
    out = A.attention_reference(q, k, v, **kw)
    cq, ck = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_kv"].tolist()
    for bi in range(3):
        one = A.attention_reference(q[None, cq[bi]:cq[bi + 1]], k[None, ck[bi]:ck[bi + 1]],
                                    v[None, ck[bi]:ck[bi + 1]], qkv_format="bshd",
                                    mask_type="causal_bottom_right", window_size=(6, 0),
                                    softmax_scale=kw["softmax_scale"])
        torch.testing.assert_close(out[cq[bi]:cq[bi + 1]], one[0], **tols(torch.float32))


def test_reference_window_and_empty_rows():
    q = _rand((1, 8, 1, 16), torch.float32, "cpu", 0)
    out, lse = A.attention_reference(q, q, q, qkv_format="bshd", mask_type="no_mask",
                                     window_size=(1, 1), softmax_scale=1.0, return_lse=True)
    scores = (q[0, :, 0] @ q[0, :, 0].T)
    band = (torch.arange(8).view(-1, 1) - torch.arange(8).view(1, -1)).abs() <= 1
    want = torch.softmax(scores.masked_fill(~band, float("-inf")), -1) @ q[0, :, 0]
    torch.testing.assert_close(out[0, :, 0], want, **tols(torch.float32))
    # padding: a sequence of length 0 gives zero output rows, never NaN
    cu = torch.tensor([0, 0], dtype=torch.int32)
    out = A.attention_reference(q, q, q, qkv_format="bshd", mask_type="padding", softmax_scale=1.0,
                                cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert torch.equal(out, torch.zeros_like(out))
