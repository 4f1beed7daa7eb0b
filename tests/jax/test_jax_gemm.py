"""The jnp general_gemm against the torch reference (the oracle of the native GEMM): layouts,
epilogues, accumulation and FP8 operands/outputs, on the CPU."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
torch = pytest.importorskip("torch")

from transformer_engine.jax import kernels as jops  # noqa: E402
from transformer_engine.pytorch import kernels as tops  # noqa: E402

CPU = jax.devices("cpu")[0]


def _pair(shape, seed, scale=1.0):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    return jax.device_put(jnp.asarray(x), CPU), torch.from_numpy(x)


def _np(x):
    return np.asarray(jnp.asarray(x, jnp.float32)) if not isinstance(x, torch.Tensor) else x.float().numpy()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "gelu", "dgelu_bgrad"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_matches_torch_reference(layout, epilogue, accumulate):
    m, n, k = 24, 7, 19
    Aj, At = _pair((m, k) if layout[0] == "T" else (k, m), 1)
    Bj, Bt = _pair((k, n) if layout[1] == "T" else (n, k), 2)
    jkw, tkw = {"layout": layout}, {"layout": layout}
    if epilogue == "bias":
        jkw["bias"], tkw["bias"] = _pair((m,), 3)
    if epilogue == "gelu":
        jkw["gelu"] = tkw["gelu"] = True
    if epilogue == "dgelu_bgrad":
        jkw["gelu_input"], tkw["gelu_input"] = _pair((n, m), 4, 2.0)
        jkw["bias_grad"] = tkw["bias_grad"] = True
    if accumulate:
        jkw["accumulate_into"], acc = _pair((n, m), 5)
        tkw["out"], tkw["accumulate"] = acc.clone(), True
    j = jops.general_gemm(Aj, Bj, **jkw)
    t = tops.general_gemm(At, Bt, **tkw)
    np.testing.assert_allclose(_np(j.out), _np(t.out), rtol=1e-5, atol=1e-5)
    for name in ("bias_grad", "gelu_input"):
        assert (getattr(j, name) is None) == (getattr(t, name) is None)
        if getattr(t, name) is not None:
            np.testing.assert_allclose(_np(getattr(j, name)), _np(getattr(t, name)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_fp8", [False, True])
def test_gemm_fp8_matches_torch_reference(out_fp8):
    m, n, k = 32, 16, 48
    Aj, At = _pair((m, k), 6, 8.0)
    Bj, Bt = _pair((n, k), 7, 8.0)
    Aj8, At8 = Aj.astype(jnp.float8_e4m3fn), At.to(torch.float8_e4m3fn)
    Bj8, Bt8 = Bj.astype(jnp.float8_e5m2), Bt.to(torch.float8_e5m2)
    si = np.float32(0.125)
    out_dtype = (jnp.float8_e4m3fn, torch.float8_e4m3fn) if out_fp8 else (jnp.bfloat16, torch.bfloat16)
    scale = np.float32(2.0)
    j = jops.general_gemm(Aj8, Bj8, out_dtype[0], A_scale_inv=si, B_scale_inv=si,
                          out_scale=scale if out_fp8 else None)
    amax = torch.zeros(1)
    t = tops.general_gemm(At8, Bt8, out_dtype[1], A_scale_inv=torch.tensor([si]),
                          B_scale_inv=torch.tensor([si]),
                          out_scale=torch.tensor([scale]) if out_fp8 else None,
                          out_amax=amax if out_fp8 else None)
    np.testing.assert_array_equal(_np(j.out), _np(t.out))
    if out_fp8:
        np.testing.assert_allclose(_np(j.amax), amax.numpy(), rtol=1e-6)
