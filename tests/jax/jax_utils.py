"""Helpers of the JAX frontend suites: inputs drawn on the host, the reference computed on the
CPU device (the jnp oracle), results compared with the shared tolerance table."""
import numpy as np
import jax
import jax.numpy as jnp

from tolerances import tols

CPU = jax.devices("cpu")[0]
ON_GPU = jax.default_backend() == "gpu"


def rand(shape, dtype, seed, scale=1.0, shift=0.0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal(shape) * scale + shift).astype(dtype)


def on_cpu(fn, *args, **kwargs):
    """fn(*args) evaluated on the CPU device (the jnp reference path)."""
    with jax.default_device(CPU):
        args = jax.tree_util.tree_map(lambda a: jax.device_put(a, CPU) if isinstance(a, jax.Array) else a, args)
        return fn(*args, **kwargs)


def f64(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)


def assert_close(got, want, dtype, what="", scale=1.0, of_max=False):
    """of_max: the absolute tolerance is also rtol * max|want| (sums that cancel, e.g. GEMMs)."""
    t = tols(dtype if isinstance(dtype, str) else jnp.dtype(dtype).name)
    w = f64(want)
    atol = t["atol"] * scale + (t["rtol"] * scale * float(np.abs(w).max()) if of_max and w.size else 0.0)
    np.testing.assert_allclose(f64(got), w, rtol=t["rtol"] * scale, atol=atol + 1e-30, err_msg=what)


def assert_bits(got, want, what=""):
    g, w = np.asarray(got), np.asarray(want)
    assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, w.dtype, g.shape, w.shape)
    np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=what)
