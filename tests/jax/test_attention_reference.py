"""The jnp attention reference against the torch one (the oracle of the native attention
kernels): every mask type, bshd/sbhd/thd, GQA, windows, odd lengths; gradients by jax.vjp against
torch autograd of the torch reference."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
torch = pytest.importorskip("torch")

from tolerances import tols  # noqa: E402
from transformer_engine.jax.kernels import attention as JA  # noqa: E402
from transformer_engine.pytorch.kernels import attention as TA  # noqa: E402

CASES = [
    ("bshd", "no_mask", 4, 4, [19, 19], [19, 19], (-1, -1)),
    ("bshd", "causal", 4, 2, [13, 13], [29, 29], (-1, -1)),
    ("sbhd", "causal_bottom_right", 4, 1, [13, 13], [29, 29], (5, 0)),
    ("bshd", "padding", 2, 2, [17, 4], [17, 9], (-1, -1)),
    ("bshd", "padding_causal_bottom_right", 4, 2, [7, 11], [20, 11], (-1, -1)),
    ("thd", "padding_causal", 4, 2, [9, 1, 14], [9, 1, 14], (3, 0)),
    ("thd", "padding", 2, 1, [5, 12], [8, 3], (2, 2)),
    ("bshd", "no_mask", 2, 2, [15, 15], [15, 15], (4, 4)),
]


def _inputs(case, seed=0):
    fmt, mask, hq, hkv, lq, lk, window = case
    g = torch.Generator().manual_seed(seed)
    d, b = 16, len(lq)
    if fmt == "thd":
        qs, ks = (sum(lq), hq, d), (sum(lk), hkv, d)
    elif fmt == "bshd":
        qs, ks = (b, max(lq), hq, d), (b, max(lk), hkv, d)
    else:
        qs, ks = (max(lq), b, hq, d), (max(lk), b, hkv, d)
    q, k, v, do = (torch.randn(s, generator=g) for s in (qs, ks, ks, qs))
    kw = dict(qkv_format=fmt, mask_type=mask, window_size=window, softmax_scale=0.3)
    if fmt == "thd" or mask.startswith("padding"):
        cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
        ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32)
        kw.update(cu_seqlens_q=cq, cu_seqlens_kv=ck, max_seqlen_q=max(lq), max_seqlen_kv=max(lk))
    return q, k, v, do, kw


def _jkw(kw):
    return {key: (jnp.asarray(val.numpy()) if isinstance(val, torch.Tensor) else val)
            for key, val in kw.items()}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[6]}" for c in CASES])
def test_jnp_matches_torch_reference(case):
    # the jnp oracle runs on the CPU device: on a GPU, XLA's float32 matmuls default to TF32
    with jax.default_device(jax.devices("cpu")[0]):
        _check_against_torch(case)


def _check_against_torch(case):
    q, k, v, do, kw = _inputs(case)
    qt, kt, vt = (t.clone().requires_grad_(True) for t in (q, k, v))
    out_t, lse_t = TA.attention_reference(qt, kt, vt, return_lse=True, **kw)
    out_t.backward(do)
    jkw = _jkw(kw)
    qj, kj, vj = (jnp.asarray(t.numpy()) for t in (q, k, v))
    out_j, lse_j = JA.attention_reference(qj, kj, vj, return_lse=True, **jkw)
    t = tols("float32")
    np.testing.assert_allclose(np.asarray(out_j), out_t.detach().numpy(), rtol=1e-5, atol=1e-5)
    finite = np.isfinite(lse_t.detach().numpy())
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse_j)), finite)
    np.testing.assert_allclose(np.asarray(lse_j)[finite], lse_t.detach().numpy()[finite], **t)

    def f(a, b_, c):
        return JA.attention_reference(a, b_, c, **jkw)
    _, vjp = jax.vjp(f, qj, kj, vj)
    grads = vjp(jnp.asarray(do.numpy()))
    for name, gj, gt in zip("qkv", grads, (qt.grad, kt.grad, vt.grad)):
        assert np.isfinite(np.asarray(gj)).all(), name
        np.testing.assert_allclose(np.asarray(gj), gt.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_bad_mask_type_raises():
    x = jnp.ones((1, 4, 1, 8))
    with pytest.raises(ValueError, match="mask_type"):
        JA.attention_reference(x, x, x, qkv_format="bshd", mask_type="tril", softmax_scale=1.0)
