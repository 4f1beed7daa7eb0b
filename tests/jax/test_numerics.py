"""Each JAX primitive (a custom call on the GPU, the jnp reference on CPU) against the jnp
reference evaluated on the CPU device: quantizers bit for bit, the rest with the shared
tolerance table; gradients of the differentiable forms against jax.grad of plain jnp."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax_utils import assert_bits, assert_close, on_cpu, rand  # noqa: E402
from transformer_engine.jax import kernels  # noqa: E402
from transformer_engine.jax.primitives import activation as pact  # noqa: E402
from transformer_engine.jax.primitives import cast as pcast  # noqa: E402
from transformer_engine.jax.primitives import gemm as pgemm  # noqa: E402
from transformer_engine.jax.primitives import normalization as pnorm  # noqa: E402
from transformer_engine.jax.primitives import softmax as psoft  # noqa: E402

HP = ["float32", "bfloat16", "float16"]
FP8 = [jnp.float8_e4m3fn, jnp.float8_e5m2]
SHAPES = [(37, 23), (4, 3, 128), (0, 16)]


@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("shape", SHAPES)
def test_quantize_and_cast_transpose_bitwise(dtype, fp8, shape):
    x = rand(shape, dtype, 1, 3.0)
    scale = jnp.float32(7.5)
    got = jax.jit(lambda v: pcast.quantize(v, scale, fp8))(x)
    want = on_cpu(kernels.quantize, x, scale, fp8)
    for g, w, what in zip(got, want, ("data", "scale_inv", "amax")):
        assert_bits(g, w, what)
    got = jax.jit(lambda v: pcast.cast_transpose(v, scale, fp8))(x)
    want = on_cpu(kernels.cast_transpose, x, scale, fp8)
    for g, w, what in zip(got, want, ("data", "data_t", "scale_inv", "amax")):
        assert_bits(g, w, what)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_update(algo):
    hist = jnp.abs(rand((5, 7), "float32", 2, 3.0)).at[:, 3].set(0.0)
    hist = hist.at[0, 5].set(jnp.nan).at[0, 6].set(-jnp.inf)  # bad steps: skipped and counted
    scale = jnp.abs(rand((7,), "float32", 3)) + 0.5
    skipped = jnp.zeros((7,), jnp.int32)
    got = jax.jit(lambda h, s, k: pcast.delayed_scaling_update(h, s, 448.0, algo, 1.0, k))(
        hist, scale, skipped)
    want = on_cpu(kernels.delayed_scaling_update, hist, scale, 448.0, algo, 1.0, skipped)
    for g, w in zip(got, want):  # the custom call and the jnp reference: the same bits
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert np.asarray(got[3]).tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert np.isfinite(np.asarray(got[0])).all()


@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("shape", [(37, 23), (2, 5, 256), (0, 16)])
def test_norm_forward_backward(dtype, kind, zero_centered, shape):
    x = rand(shape, dtype, 4, 2.0, 0.5)
    g = rand(shape[-1:], dtype, 5, 0.3, 0.0 if zero_centered else 1.0)
    b = rand(shape[-1:], dtype, 6, 0.5)
    dz = rand(shape, dtype, 7)
    z, mu, rs, _, _ = jax.jit(lambda *a: pnorm.norm_fwd(*a, 1e-5, zero_centered, kind))(x, g, b)
    zr, mur, rsr, _, _ = on_cpu(pnorm.norm_fwd, x, g, b, 1e-5, zero_centered, kind)
    assert_close(z, zr, dtype, "z")
    assert_close(rs, rsr, "float32", "rsigma", scale=10)
    f = lambda x, g, b: pnorm.layernorm(x, g, b, 1e-5, zero_centered, kind)  # noqa: E731
    got = jax.jit(jax.vjp(f, x, g, b)[1])(dz) if x.size else jax.vjp(f, x, g, b)[1](dz)
    want = on_cpu(lambda *a: jax.vjp(f, *a[:3])[1](a[3]), x, g, b, dz)
    for gg, ww, what in zip(got, want, ("dx", "dgamma", "dbeta")):
        assert_close(gg, ww, dtype, what, scale=4 if dtype != "float32" else 10)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_fp8_output(fp8, kind):
    x, g, b = rand((64, 96), "bfloat16", 8), rand((96,), "bfloat16", 9, 0.2, 1.0), rand((96,), "bfloat16", 10)
    got = jax.jit(lambda *a: pnorm.norm_fwd(*a, 1e-5, False, kind, fp8, jnp.float32(4.0)))(x, g, b)
    want = on_cpu(pnorm.norm_fwd, x, g, b, 1e-5, False, kind, fp8, jnp.float32(4.0))
    assert_close(got[0].astype(jnp.float32), want[0].astype(jnp.float32), fp8, "z fp8")
    assert_close(got[4], want[4], "bfloat16", "amax")


ACTS = ["gelu", "relu", "qgelu", "srelu", "silu", "geglu", "swiglu", "reglu"]


@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", ACTS)
def test_activation_forward_backward(dtype, name):
    x = rand((37, 46), dtype, 11, 2.0)
    y = jax.jit(lambda v: pact.activation(v, name))(x)
    assert_close(y, on_cpu(kernels.activation_forward, x, name), dtype, "y")
    dy = rand(y.shape, dtype, 12)
    got = jax.jit(jax.vjp(lambda v: pact.activation(v, name), x)[1])(dy)[0]
    want = on_cpu(kernels.activation_backward, dy, x, name)
    assert_close(got, want, dtype, "dx", scale=2)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_activation_fp8_output(fp8, name):
    x = rand((64, 128), "bfloat16", 13)
    got = jax.jit(lambda v: pact.activation_forward(v, name, fp8, jnp.float32(2.0)))(x)
    want = on_cpu(kernels.activation_forward, x, name, fp8, jnp.float32(2.0))
    assert_close(got[0].astype(jnp.float32), want[0].astype(jnp.float32), fp8, "y fp8")
    assert_close(got[2], want[2], "bfloat16", "amax")


@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", ["gelu", "relu", "silu"])
def test_dbias_dactivation(dtype, name):
    x, dy = rand((77, 40), dtype, 14, 2.0), rand((77, 40), dtype, 15)
    got = jax.jit(lambda g, v: pact.dbias_dactivation(g, v, name))(dy, x)
    want = on_cpu(kernels.dbias_dactivation, dy, x, name)
    assert_close(got[0], want[0], dtype, "dx", scale=2)
    assert_close(got[1], want[1], dtype, "dbias", scale=8)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["scaled", "masked", "causal"])
def test_softmax(dtype, kind):
    x = rand((2, 3, 33, 33), dtype, 16, 3.0)
    mask = jnp.asarray(np.random.default_rng(17).random((2, 1, 33, 33)) < 0.3) if kind == "masked" else None
    f = lambda v: psoft.softmax(v, mask, 0.7, kind)  # noqa: E731
    y = jax.jit(f)(x)
    assert_close(y, on_cpu(psoft.softmax_forward, x, mask, 0.7, kind), dtype, "y")
    dy = rand(x.shape, dtype, 18)
    got = jax.jit(jax.vjp(f, x)[1])(dy)[0]
    assert_close(got, on_cpu(kernels.scaled_softmax_backward, dy, y, 0.7), dtype, "dx", scale=2)


@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "gelu", "bias_gelu"])
def test_gemm_high_precision(dtype, layout, epilogue):
    m, n, k = 48, 40, 72
    a = rand((m, k) if layout[0] == "T" else (k, m), dtype, 19, 0.2)
    b = rand((k, n) if layout[1] == "T" else (n, k), dtype, 20, 0.2)
    bias = rand((m,), dtype, 21) if "bias" in epilogue else None
    gelu = "gelu" in epilogue
    got = jax.jit(lambda a, b: pgemm.general_gemm(a, b, layout=layout, bias=bias, gelu=gelu))(a, b)
    want = on_cpu(lambda a, b: kernels.general_gemm(a, b, layout=layout, bias=bias, gelu=gelu), a, b)
    assert_close(got.out, want.out, dtype, "out", scale=4, of_max=True)
    if gelu:
        assert_close(got.gelu_input, want.gelu_input, dtype, "gelu_input", scale=4, of_max=True)


@pytest.mark.parametrize("fp8_a,fp8_b", [(jnp.float8_e4m3fn, jnp.float8_e4m3fn),
                                         (jnp.float8_e5m2, jnp.float8_e4m3fn)])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_gemm_fp8(fp8_a, fp8_b, out):
    a = rand((64, 96), "float32", 22).astype(fp8_a)
    b = rand((32, 96), "float32", 23).astype(fp8_b)
    sa, sb = jnp.float32(0.5), jnp.float32(0.25)
    bias = rand((64,), out, 24)
    f = lambda a, b: pgemm.general_gemm(a, b, out, layout="TN", A_scale_inv=sa, B_scale_inv=sb,  # noqa: E731
                                        bias=bias)
    got, want = jax.jit(f)(a, b), on_cpu(f, a, b)
    # FP8 GEMMs accumulate in the tensor cores' reduced precision (fast accumulation): a
    # float32 output is held to bfloat16's tolerance.
    assert_close(got.out, want.out, "bfloat16", "out", scale=1, of_max=True)


def test_gemm_dgelu_bias_grad():
    a, b = rand((48, 64), "bfloat16", 25, 0.2), rand((32, 64), "bfloat16", 26, 0.2)
    pre = rand((32, 48), "bfloat16", 27)
    f = lambda a, b, p: pgemm.general_gemm(a, b, layout="TN", gelu_input=p, bias_grad=True)  # noqa: E731
    got, want = jax.jit(f)(a, b, pre), on_cpu(f, a, b, pre)
    assert_close(got.out, want.out, "bfloat16", "out", scale=4, of_max=True)
    assert_close(got.bias_grad, want.bias_grad, "bfloat16", "bias_grad", scale=4, of_max=True)
