"""The jnp twins of the cast and scaling ops: bit for bit against the torch references (the
oracle of the native kernels) and against the Python model of the recipe maths."""
import math
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
torch = pytest.importorskip("torch")

from transformer_engine.jax import kernels as jops  # noqa: E402
from transformer_engine.pytorch import kernels as tops  # noqa: E402

# The jnp ops are the reference backend: run them on the CPU. (XLA's float32 division on a GPU is
# not correctly rounded, an ulp away from the kernel and from torch; the native JAX path calls
# the kernel instead.)
CPU = jax.devices("cpu")[0]

FLAVORS = [("e4m3", "ocp", torch.float8_e4m3fn), ("e5m2", "ocp", torch.float8_e5m2),
           ("e4m3", "fnuz", torch.float8_e4m3fnuz), ("e5m2", "fnuz", torch.float8_e5m2fnuz)]


@pytest.mark.parametrize("fmt,flavor,torch_dtype", FLAVORS)
@pytest.mark.parametrize("shape", [(37, 23), (0, 16), (4, 8, 32)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_matches_torch_reference(fmt, flavor, torch_dtype, shape, dtype):
    rng = np.random.default_rng(zlib.crc32(repr((shape, str(dtype), fmt)).encode()))  # same in every process
    x32 = (rng.standard_normal(shape) * 50).astype(np.float32)
    xt = torch.from_numpy(x32).to(getattr(torch, dtype))
    xj = jax.device_put(jnp.asarray(x32), CPU).astype(getattr(jnp, dtype))
    scale = 1.75
    data, scale_inv, amax = jops.quantize(xj, scale, jops.fp8_dtype(fmt, flavor))
    ref, ref_si, ref_amax = tops.quantize_reference(xt, torch.tensor([scale]), torch_dtype)
    assert np.array_equal(np.asarray(data).view(np.uint8), ref.view(torch.uint8).numpy())
    assert np.asarray(scale_inv)[0] == ref_si.item()
    assert np.asarray(amax)[0] == ref_amax.item()
    d, dt, _, _ = jops.cast_transpose(xj, scale, jops.fp8_dtype(fmt, flavor))
    assert np.array_equal(np.asarray(dt).view(np.uint8), np.asarray(d).reshape(-1, shape[-1]).T.view(np.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_compiled_quantize_dequantize_keeps_fp8_rounding(fmt):
    # on the default device (the GPU where there is one), compiled as one program: the compiler
    # must not fold the FP8 cast and the dequantizing cast away
    dtype = jops.fp8_dtype(fmt, "ocp")
    x = jnp.asarray(np.random.default_rng(3).standard_normal(4096).astype(np.float32) * 7)
    qdq = jax.jit(lambda v: jops.dequantize(*jops.quantize(v, 2.0, dtype)[:2]))
    want = np.asarray(jax.device_put(x, CPU)).astype(np.float32) * 2.0
    limit = 448.0 if fmt == "e4m3" else 57344.0
    want = np.clip(want, -limit, limit).astype(dtype).astype(np.float32) * 0.5
    got = np.asarray(qdq(x))
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} of {x.size} values not FP8-rounded"
    assert np.count_nonzero(want != np.asarray(x)) > x.size // 2  # the rounding is visible


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_scaling_matches_torch_reference(algo, margin):
    rng = np.random.default_rng(0)
    hist = np.abs(rng.standard_normal((16, 6)).astype(np.float32)) * 30
    hist[:, 0] = 0.0
    hist[0, 1] = np.inf
    hist[0, 4] = np.nan  # a bad step: skipped by both, counted
    scale = (rng.random(6).astype(np.float32) + 0.5)
    skipped = np.arange(6, dtype=np.int32)
    update = jax.jit(lambda h, s, k: jops.delayed_scaling_update(h, s, 448.0, algo, margin, k))
    nh, ns, nsi, nk = update(jax.device_put(hist, CPU), jax.device_put(scale, CPU),
                             jax.device_put(skipped, CPU))
    th, ts, tsi = torch.from_numpy(hist.copy()), torch.from_numpy(scale.copy()), torch.empty(6)
    tk = torch.from_numpy(skipped.copy())
    tops.delayed_scaling_update_reference(th, ts, tsi, 448.0, algo, margin, tk)
    assert np.array_equal(np.asarray(nk), tk.numpy())
    assert np.asarray(nk).tolist() == [0, 2, 2, 3, 5, 5]
    assert np.isfinite(np.asarray(nh)).all() and ns[4] == scale[4]
    assert np.array_equal(np.asarray(nh[1:, 4]), hist[1:, 4])  # not rolled
    assert np.array_equal(np.asarray(nh), th.numpy())
    assert np.array_equal(np.asarray(ns), ts.numpy())
    assert np.array_equal(np.asarray(nsi), tsi.numpy())
    assert ns[0] == scale[0] and (algo == "most_recent" or ns[1] == scale[1])
    assert math.isfinite(float(ns.max()))


def test_bad_dtype_raises():
    with pytest.raises(ValueError, match="quantize: x has dtype int32"):
        jops.quantize(jnp.ones((4, 4), jnp.int32), 1.0, jops.fp8_dtype("e4m3"))
