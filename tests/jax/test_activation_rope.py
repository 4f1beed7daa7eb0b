"""The jnp twins of the activation and RoPE ops against the torch references (the oracle of the
native kernels): forward values, autodiff gradients, FP8 outputs bit for bit, dbias sums."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
torch = pytest.importorskip("torch")

from tolerances import tols  # noqa: E402
from transformer_engine.jax import kernels as jops  # noqa: E402
from transformer_engine.jax.kernels import cast as jcast  # noqa: E402
from transformer_engine.pytorch.kernels import activation as tact  # noqa: E402
from transformer_engine.pytorch.kernels import rope as trope  # noqa: E402
from transformer_engine.pytorch.kernels.cast import quantize_reference  # noqa: E402

NAMES = list(tact.ACTIVATIONS) + list(tact.GATED)


def _pair(shape, dtype, seed, scale=2.0):
    x32 = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    return jnp.asarray(x32).astype(getattr(jnp, dtype)), torch.from_numpy(x32).to(getattr(torch, dtype))


def _np(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(37, 46), (2, 3, 64), (0, 8)])
def test_activation_matches_torch(dtype, name, shape):
    xj, xt = _pair(shape, dtype, seed=len(name) * 7 + shape[-1])
    y = jops.activation_forward(xj, name)
    want = tact.activation_reference(xt, name)
    np.testing.assert_allclose(_np(y), want.float().numpy(), **tols(dtype))
    gj, gt = _pair(want.shape, dtype, seed=3)
    dx = jops.activation_backward(gj, xj, name)
    xr = xt.clone().requires_grad_(True)
    tact.activation_reference(xr, name).backward(gt)
    np.testing.assert_allclose(_np(dx), xr.grad.float().numpy(), **tols(dtype))


@pytest.mark.parametrize("name", NAMES)
def test_activation_fp8_matches_torch(name):
    xj, xt = _pair((64, 96), "bfloat16", seed=11)
    y, scale_inv, amax = jops.activation_forward(xj, name, jcast.fp8_dtype("e4m3"), 20.0)
    want, want_si, want_amax = quantize_reference(tact.activation_fp32_reference(xt, name),
                                                  torch.tensor([20.0]), torch.float8_e4m3fn)
    # Transcendentals differ between XLA and torch by an fp32 ulp: FP8 codes may differ by one.
    diff = np.abs(np.asarray(y).view(np.uint8).astype(int) - want.view(torch.uint8).numpy().astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.01
    assert float(scale_inv[0]) == want_si.item()
    np.testing.assert_allclose(float(amax[0]), want_amax.item(), rtol=1e-5)


@pytest.mark.parametrize("name", list(tact.ACTIVATIONS))
def test_dbias_dactivation_matches_torch(name):
    xj, xt = _pair((300, 40), "float32", seed=5)
    gj, gt = _pair((300, 40), "float32", seed=6)
    dx, dbias = jops.dbias_dactivation(gj, xj, name)
    want_dx, want_dbias = tact.dbias_dactivation_reference(gt, xt, name)
    np.testing.assert_allclose(_np(dx), want_dx.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(dbias), want_dbias.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_matches_torch(fmt, interleaved, dtype):
    s, b, h, d, rot = 11, 3, 2, 24, 16
    shape = {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (s * b, h, d)}[fmt]
    xj, xt = _pair(shape, dtype, seed=9, scale=1.0)
    freqs = np.random.default_rng(1).uniform(-8, 8, (s * b, 1, 1, rot)).astype(np.float32)
    cu = np.array([0, 4, 4, 20, s * b], dtype=np.int32) if fmt == "thd" else None
    y = jops.rope_forward(xj, jnp.asarray(freqs), fmt, interleaved, None if cu is None else jnp.asarray(cu))
    cut = None if cu is None else torch.from_numpy(cu)
    xr = xt.clone().requires_grad_(True)
    want = trope.rope_reference(xr, torch.from_numpy(freqs), fmt, interleaved, cut)
    np.testing.assert_allclose(_np(y), want.detach().float().numpy(), **tols(dtype))
    gj, gt = _pair(shape, dtype, seed=10, scale=1.0)
    dx = jops.rope_backward(gj, jnp.asarray(freqs), fmt, interleaved, None if cu is None else jnp.asarray(cu))
    want.backward(gt)
    np.testing.assert_allclose(_np(dx), xr.grad.float().numpy(), **tols(dtype))
