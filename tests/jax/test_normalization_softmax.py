"""The jnp references of LayerNorm / RMSNorm and the fused softmax: forward against float64 NumPy
and the torch references (the oracle of the native kernels), backward against jax.vjp of the
forward formula."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
torch = pytest.importorskip("torch")

from tolerances import tols  # noqa: E402
from transformer_engine.jax import kernels as jops  # noqa: E402
from transformer_engine.pytorch import kernels as tops  # noqa: E402

CPU = jax.devices("cpu")[0]
DTYPES = ["float32", "bfloat16", "float16"]
SHAPES = [(1, 37), (37, 23), (4, 3, 128), (8, 1000), (0, 16)]


def arr(x, dtype):
    return jax.device_put(jnp.asarray(x), CPU).astype(getattr(jnp, dtype))


def f64(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)


def assert_close(got, want, dtype, what):
    np.testing.assert_allclose(f64(got), want, err_msg=what, **tols(dtype))


def inputs(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2 + 0.5
    g = rng.standard_normal(shape[-1]) * 0.5 + 1.0
    b = rng.standard_normal(shape[-1]) * 0.5
    dz = rng.standard_normal(shape)
    return arr(x, dtype), arr(g, dtype), arr(b, dtype), arr(dz, dtype)


def numpy_norm(x, g, b, rms, zcg, eps=1e-5):
    x, g = f64(x), f64(g) + (1.0 if zcg else 0.0)
    mu = np.zeros(x.shape[:-1]) if rms else x.mean(-1)
    var = np.square(x - mu[..., None]).mean(-1) if x.size else np.zeros(x.shape[:-1])
    rs = 1.0 / np.sqrt(var + eps)
    z = (x - mu[..., None]) * rs[..., None] * g
    return (z if rms else z + f64(b)), mu, rs


@pytest.mark.parametrize("zcg", [False, True])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norm_forward_and_backward(zcg, rms, dtype, shape):
    x, g, b, dz = inputs(shape, dtype, seed=sum(shape))
    want_z, want_mu, want_rs = numpy_norm(x, g, b, rms, zcg)
    if rms:
        z, rs = jops.rmsnorm_fwd(x, g, 1e-5, zcg)
        dx, dg = jops.rmsnorm_bwd(dz, x, rs, g, zcg)
        db = None
    else:
        z, mu, rs = jops.layernorm_fwd(x, g, b, 1e-5, zcg)
        assert_close(mu, want_mu, "float32", "mu")
        dx, dg, db = jops.layernorm_bwd(dz, x, mu, rs, g, zcg)
    assert z.dtype == x.dtype
    assert_close(z, want_z, dtype, "z")
    assert_close(rs, want_rs, "float32", "rsigma")

    # Backward against jax.vjp of the float32 forward formula.
    def fwd(xf, gf, bf):
        gg = gf + 1.0 if zcg else gf
        mu = 0.0 if rms else jnp.mean(xf, -1, keepdims=True)
        r = 1.0 / jnp.sqrt(jnp.mean(jnp.square(xf - mu), -1, keepdims=True) + 1e-5)
        return (xf - mu) * r * gg + (0.0 if rms else bf)
    f32 = [t.astype(jnp.float32) for t in (x, g, b)]
    _, vjp = jax.vjp(fwd, *f32)
    want_dx, want_dg, want_db = vjp(dz.astype(jnp.float32))
    assert dx.dtype == x.dtype and dg.dtype == g.dtype
    assert_close(dx, f64(want_dx), dtype, "dx")
    # Column sums over rows: tolerance grows with the summed magnitudes.
    rows = max(x.size // shape[-1], 1)
    np.testing.assert_allclose(f64(dg), f64(want_dg), rtol=tols(dtype)["rtol"],
                               atol=1e-5 * 8 * rows, err_msg="dgamma")
    if not rms:
        np.testing.assert_allclose(f64(db), f64(want_db), rtol=tols(dtype)["rtol"],
                                   atol=1e-5 * 2 * rows, err_msg="dbeta")


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_norm_matches_torch_reference(rms, dtype):
    x, g, b, dz = inputs((16, 96), dtype, seed=4)
    def to_t(a, as_dtype=True):
        t = torch.from_numpy(np.array(a.astype(jnp.float32)))  # a writable copy
        return t.to(getattr(torch, dtype)) if as_dtype else t
    if rms:
        z, rs = jops.rmsnorm_fwd(x, g)
        tz = tops.rmsnorm_fwd(to_t(x), to_t(g)).out
        dx, dg = jops.rmsnorm_bwd(dz, x, rs, g)
        tdx, tdg = tops.rmsnorm_bwd(to_t(dz), to_t(x), to_t(rs, False), to_t(g))
    else:
        z, mu, rs = jops.layernorm_fwd(x, g, b)
        tz = tops.layernorm_fwd(to_t(x), to_t(g), to_t(b)).out
        dx, dg, _ = jops.layernorm_bwd(dz, x, mu, rs, g)
        tdx, tdg, _ = tops.layernorm_bwd(to_t(dz), to_t(x), to_t(mu, False),
                                         to_t(rs, False), to_t(g))
    for got, want, what in ((z, tz, "z"), (dx, tdx, "dx"), (dg, tdg, "dgamma")):
        assert_close(got, want.double().numpy(), dtype, what)


def test_norm_fp8_output_is_quantized_fp32_result():
    x, g, b, _ = inputs((8, 64), "bfloat16", seed=6)
    fp8 = jops.fp8_dtype("e4m3")
    data, mu, rs, scale_inv, amax = jops.layernorm_fwd_fp8(x, g, b, 16.0, fp8)
    z, _, _ = numpy_norm(x, g, b, False, False)
    assert data.dtype == fp8 and data.shape == x.shape
    np.testing.assert_allclose(float(amax[0]), np.abs(z).max(), rtol=1e-5)
    assert float(scale_inv[0]) == 1.0 / 16.0
    np.testing.assert_allclose(f64(data), np.clip(z * 16.0, -448, 448), **tols("float8_e4m3"))
    data_r, rs_r, _, _ = jops.rmsnorm_fwd_fp8(x, g, 16.0, fp8)
    assert data_r.dtype == fp8 and rs_r.shape == (8,)


def numpy_softmax(x, scale, mask):
    logits = np.where(mask, -np.inf, f64(x) * scale)
    m = logits.max(-1, keepdims=True) if logits.size else logits
    e = np.exp(logits - np.where(np.isfinite(m), m, 0.0))
    s = e.sum(-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


@pytest.mark.parametrize("kind", ["plain", "masked", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 37), (2, 2, 16, 16), (1, 2, 8, 1000),
                                   (0, 2, 4, 4)])
def test_softmax_forward_and_backward(kind, dtype, shape):
    rng = np.random.default_rng(sum(shape))
    x = arr(rng.standard_normal(shape) * 4, dtype)
    dy = arr(rng.standard_normal(shape), dtype)
    scale = 0.125
    if kind == "causal":
        shape = (shape[0], shape[1], shape[2], shape[2])
        x, dy = x[..., : shape[2]], dy[..., : shape[2]]
        mask = np.broadcast_to(np.triu(np.ones(shape[-2:], bool), 1), shape)
        y = jops.scaled_upper_triang_masked_softmax_forward(x, scale)
    elif kind == "masked":
        mask = rng.random((shape[0], 1) + shape[2:]) < 0.3
        if shape[2] > 1:
            mask[..., 1, :] = True  # fully masked row: zeros
        y = jops.scaled_masked_softmax_forward(x, jnp.asarray(mask), scale)
    else:
        mask = np.zeros(shape, bool)
        y = jops.scaled_softmax_forward(x, scale)
    want = numpy_softmax(x, scale, np.broadcast_to(mask, shape))
    assert y.dtype == x.dtype and not np.isnan(f64(y)).any()
    assert_close(y, want, dtype, "y")
    assert (f64(y)[np.broadcast_to(mask, shape)] == 0).all()
    dx = jops.scaled_softmax_backward(dy, y, scale)

    def fwd(xf):
        logits = jnp.where(jnp.asarray(np.broadcast_to(mask, shape)), -jnp.inf, xf * scale)
        return jax.nn.softmax(logits, -1)
    # vjp of the unmasked rows only (a fully masked row has no gradient and NaN softmax).
    live = ~np.broadcast_to(mask, shape).all(-1, keepdims=True)
    _, vjp = jax.vjp(fwd, x.astype(jnp.float32))
    (want_dx,) = vjp(jnp.where(jnp.asarray(live), dy.astype(jnp.float32), 0.0))
    want_dx = np.where(live, np.nan_to_num(f64(want_dx)), 0.0)
    tol = tols(dtype)
    dy_max = np.abs(f64(dy)).max() if dy.size else 0.0
    np.testing.assert_allclose(f64(dx), want_dx, rtol=4 * tol["rtol"],
                               atol=4 * tol["rtol"] * scale * dy_max + 1e-5)
