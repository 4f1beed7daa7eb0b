"""The plain bias gradient (kernels.dbias: the column sums of a gradient, nvte_dbias natively)
against a float64 sum, its determinism and argument errors, and te.Linear's bias gradient against
torch.nn.Linear's where the modules take the column-sum kernels (high precision, a gradient too
large for the wgrad GEMM's bias-gradient epilogue)."""

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.library import dispatch
from transformer_engine.pytorch.library import gemm as gemm_steps
from transformer_engine.pytorch.library.activation import bias_grad_of
from utils import DEVICES, native_gpu_reason, randn, stable_seed, tols

HP = [torch.float32, torch.float16, torch.bfloat16]
# Odd widths (scalar path), aligned ones (16-byte vectors), whole strips and a part (1032), one row,
# no rows, 3-D, a single row block's edge (64/65 rows) and many row blocks.
SHAPES = [(37, 23), (128, 256), (2, 3, 40), (0, 24), (1, 8), (1, 4096), (64, 136), (65, 136),
          (4096, 96), (333, 1000), (5000, 1032), (3, 700, 48)]


def _check_sums(got, grad, dbias_dtype):
    """got vs the float64 column sums of grad: fp32 sums in another order differ by a few ulps of
    the column's absolute sum, then one rounding to dbias_dtype (a missing or repeated row is off
    by about one value, far outside this)."""
    g = grad.detach().cpu().double().reshape(-1, grad.shape[-1])
    want, abs_sum = g.sum(0), g.abs().sum(0)
    assert got.dtype == dbias_dtype and got.shape == (grad.shape[-1],)
    err = (got.cpu().double() - want).abs()
    tol = 1e-6 * abs_sum + tols(dbias_dtype)["rtol"] * want.abs()
    bad = ~(err <= tol)
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} columns off; worst error "
                           f"{float((err / tol.clamp_min(1e-30)).max()):.3g} x tolerance")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("dbias_dtype", [None, torch.float32], ids=["same", "fp32"])
@pytest.mark.parametrize("shape", SHAPES)
def test_dbias_matches_float64(device, dtype, dbias_dtype, shape):
    g = randn(shape, dtype, device, seed=stable_seed(shape, dtype, "dbias"))
    db = kernels.dbias(g, dbias_dtype)
    _check_sums(db, g, dbias_dtype or dtype)
    _check_sums(kernels.dbias_reference(g.cpu(), dbias_dtype), g, dbias_dtype or dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_dbias_no_rows_gives_zeros(device):
    g = torch.empty((0, 72), dtype=torch.bfloat16, device=device)
    db = kernels.dbias(g, torch.float32)
    assert db.shape == (72,) and torch.equal(db.cpu(), torch.zeros(72))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 8], ids=["unaligned", "aligned"])
def test_dbias_storage_offset(device, offset):
    # A contiguous tensor starting one element into its storage defeats 16-byte loads.
    rows, cols = 300, 64
    base = randn((rows * cols + offset,), torch.bfloat16, device, seed=3)
    g = base[offset:].view(rows, cols)
    _check_sums(kernels.dbias(g, torch.float32), g, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(8192, 1024), (4096, 12288 // 8 + 8), (333, 1000)])
def test_dbias_deterministic(device, shape):
    g = randn(shape, torch.bfloat16, device, seed=11, scale=3.0)
    a = kernels.dbias(g, torch.float32)
    torch.ones(1 << 20, device=device).sum()  # other work in between
    b = kernels.dbias(g, torch.float32)
    c = bias_grad_of(g, torch.float32)  # the modules' (eager) path: the same kernels
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_dbias_errors_name_op_and_argument(device):
    g = randn((4, 6), torch.bfloat16, device, seed=1)
    with pytest.raises(ValueError, match=r"dbias: grad has dtype int32; expected one of float32"):
        kernels.dbias(g.to(torch.int32))
    with pytest.raises(ValueError, match=r"dbias: grad has dtype float8_e4m3fn"):
        kernels.dbias(g.to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"dbias: grad has shape \(6,\); expected at least 2 dims"):
        kernels.dbias(g[0])
    with pytest.raises(ValueError, match=r"dbias: grad of shape \(6, 4\) is not contiguous"):
        kernels.dbias(g.t())
    with pytest.raises(ValueError, match=r"dbias: dbias_dtype is torch.int64; expected float32"):
        kernels.dbias(g, torch.int64)


@pytest.mark.skipif(bool(native_gpu_reason()), reason=native_gpu_reason() or "ok")
def test_dbias_native_errors_name_op_and_argument():
    """The C API's own checks, reached through the binding with bad descriptors."""
    from transformer_engine.pytorch import native
    mod = native.native_for_torch()
    g = randn((4, 6), torch.bfloat16, "cuda", seed=1)
    db = torch.empty(6, dtype=torch.float32, device="cuda")
    ws = (0, (0, 6), 0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"nvte_dbias: dbias has shape \[5\]; expected \[6\]"):
        mod.dbias(native.describe(g), native.describe(db[:5]), ws, 0)
    with pytest.raises(ValueError, match=r"nvte_dbias: grad has shape \[2, 2, 6\]; expected a 2-D"):
        mod.dbias(native.describe(g, shape=(2, 2, 6)), native.describe(db), ws, 0)
    g8 = g.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"nvte_dbias: grad has dtype float8_e4m3; expected float32"):
        mod.dbias(native.describe(g8), native.describe(db), ws, 0)
    with pytest.raises(ValueError, match=r"nvte_dbias: dbias has dtype int32; expected float32"):
        mod.dbias(native.describe(g), native.describe(db.view(torch.int32)), ws, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_dbias_under_compile_matches_eager(device):
    """The registered op (te::dbias) traces without a graph break and gives the eager bits."""
    torch._dynamo.reset()
    g = randn((300, 136), torch.bfloat16, device, seed=5)
    fn = torch.compile(lambda t: dispatch.dbias(t, torch.float32), fullgraph=True,
                       backend="aot_eager")
    assert torch.equal(fn(g), kernels.dbias(g, torch.float32))


# ----- te.Linear vs torch.nn.Linear where the column-sum kernels make the bias gradient ----------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fuse_wgrad", [False, True], ids=["plain", "main_grad"])
def test_linear_bias_grad_matches_torch(device, dtype, fuse_wgrad):
    # tokens * out_features above gemm_steps.EPILOGUE_BIAS_GRAD_MAX_ELEMENTS: not the GEMM epilogue
    tokens, in_features, out_features = 4112, 32, 1040
    assert tokens * out_features > gemm_steps.EPILOGUE_BIAS_GRAD_MAX_ELEMENTS
    torch.manual_seed(0)
    m = te.Linear(in_features, out_features, params_dtype=dtype, device=device,
                  fuse_wgrad_accumulation=fuse_wgrad)
    ref = torch.nn.Linear(in_features, out_features, dtype=dtype, device=device)
    with torch.no_grad():
        ref.weight.copy_(m.weight)
        ref.bias.copy_(m.bias)
    if fuse_wgrad:
        m.weight.main_grad = torch.zeros(out_features, in_features, dtype=torch.float32,
                                         device=device)
    x = randn((2, tokens // 2, in_features), dtype, device, seed=21)
    dy = randn((2, tokens // 2, out_features), dtype, device, seed=22)
    m(x).backward(dy)
    ref(x).backward(dy)
    # both within a few fp32 ulps of the column's absolute sum of the float64 result (their own
    # summation orders differ), and for bf16 within the dtype's tolerance of each other
    _check_sums(m.bias.grad, dy, dtype)
    _check_sums(ref.bias.grad, dy, dtype)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(m.bias.grad, ref.bias.grad, **tols(dtype))
    # and bit for bit the op's result (the direct path runs the same kernels)
    assert torch.equal(m.bias.grad, kernels.dbias(dy.reshape(-1, out_features), dtype))
