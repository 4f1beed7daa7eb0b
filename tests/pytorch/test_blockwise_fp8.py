"""Float8BlockScaling: the block-wise quantiser (native vs reference bit for bit, and the reference
vs an independent per-block model), the block-scaled GEMM vs dequantise-then-matmul, the recipe's
fields, and Linear / LayerNormLinear / LayerNormMLP under the recipe vs high precision."""
import copy
import math

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.kernels import blockwise as B
from transformer_engine.pytorch.kernels.cast import fp8_max_of
from utils import DEVICES, randn, requires_native_gpu, stable_seed, tols

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
HP = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(37, 23), (128, 128), (130, 300), (256, 1024), (1, 1), (0, 64), (300, 129), (3, 257)]
FLT_MAX = torch.finfo(torch.float32).max


def bits(t):
    return t.view(torch.uint8)


def hopper_reason() -> str:
    if not torch.cuda.is_available():
        return "no GPU: the block-scaled GEMM runs natively on sm_90"
    if torch.cuda.get_device_capability() != (9, 0):
        return "the block-scaled GEMM needs sm_90 (tested for its refusal elsewhere)"
    return ""


requires_hopper = pytest.mark.skipif(bool(hopper_reason()), reason=hopper_reason() or "ok")
GEMM_DEVICES = ["cpu", pytest.param("cuda", marks=[requires_native_gpu, requires_hopper])]


def model_block(values: torch.Tensor, fp8_dtype, pow2: bool):
    """(fp8 bits, scale_inv) of one block, computed scalar by scalar with Python floats."""
    fmax = fp8_max_of(fp8_dtype)
    flat = values.float().flatten()
    amax = float("nan") if torch.isnan(flat).any() else float(flat.abs().max()) if flat.numel() else 0.0
    if amax > 0 and amax <= FLT_MAX:
        s = torch.tensor(fmax, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)
        s = float(s)
    else:
        s = 1.0
    if math.isinf(s):
        s = FLT_MAX
    if pow2:
        s = 2.0 ** math.floor(math.log2(s))
    s32 = torch.tensor(s, dtype=torch.float32)
    data = (values.float() * s32).clamp(-fmax, fmax).to(fp8_dtype)
    return data, float(1.0 / s32)


@pytest.mark.parametrize("shape", [(37, 23), (130, 300), (3, 257)])
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_reference_matches_block_model(shape, block_dim, pow2, fp8_dtype):
    x = randn(shape, torch.float32, "cpu", seed=stable_seed(shape, block_dim), scale=5.0)
    q, q_t = B.quantize_blockwise_reference(x, fp8_dtype, block_dim, pow2, True)
    rows, cols = shape
    assert q.scale_inv.shape == B.scale_inv_shape(rows, cols, block_dim)
    assert q_t.data.shape == (cols, rows)
    for i0 in range(0, rows, 128 if block_dim == 2 else 1):
        for j0 in range(0, cols, 128):
            i1 = min(i0 + (128 if block_dim == 2 else 1), rows)
            j1 = min(j0 + 128, cols)
            data, sinv = model_block(x[i0:i1, j0:j1], fp8_dtype, pow2)
            assert torch.equal(bits(q.data[i0:i1, j0:j1]), bits(data))
            got = q.scale_inv[i0 // 128, j0 // 128] if block_dim == 2 else q.scale_inv[j0 // 128, i0]
            assert got.item() == sinv
    if block_dim == 1:  # the transpose: 128 rows of one column of x per block
        for j in range(cols):
            for i0 in range(0, rows, 128):
                data, sinv = model_block(x[i0:i0 + 128, j], fp8_dtype, pow2)
                assert torch.equal(bits(q_t.data[j, i0:i0 + 128]), bits(data))
                assert q_t.scale_inv[i0 // 128, j].item() == sinv
    else:
        assert torch.equal(bits(q_t.data), bits(q.data.t().contiguous()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("pow2", [True, False])
def test_quantize_bit_exact(device, shape, block_dim, dtype, fp8_dtype, pow2):
    x = randn(shape, dtype, device, seed=stable_seed(shape, dtype, block_dim), scale=4.0)
    q, q_t = B.quantize_blockwise(x, fp8_dtype, block_dim, pow2, with_transpose=True)
    ref, ref_t = B.quantize_blockwise_reference(x.cpu(), fp8_dtype, block_dim, pow2, True)
    assert q.data.dtype == fp8_dtype and q.data.shape == shape
    assert torch.equal(bits(q.data).cpu(), bits(ref.data))
    assert torch.equal(q.scale_inv.cpu(), ref.scale_inv)
    assert torch.equal(bits(q_t.data).cpu(), bits(ref_t.data))
    assert torch.equal(q_t.scale_inv.cpu(), ref_t.scale_inv)
    if x.numel():
        # half an ulp of the format, plus half its smallest subnormal step near zero
        xf = x.float().cpu()
        err = (B.dequantize_blockwise(q).cpu() - xf).abs()
        assert torch.all(err <= xf.abs() * tols(fp8_dtype)["rtol"] / 2 + xf.abs().max() * 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_dim", [1, 2])
def test_quantize_nan_inf(device, block_dim):
    x = randn((130, 260), torch.float32, device, seed=11, scale=2.0)
    x[3, 5] = float("nan")
    x[129, 200] = float("inf")
    x[0, 259] = -float("inf")
    q, q_t = B.quantize_blockwise(x, torch.float8_e4m3fn, block_dim, True, with_transpose=True)
    ref, ref_t = B.quantize_blockwise_reference(x.cpu(), torch.float8_e4m3fn, block_dim, True, True)
    for got, want in ((q, ref), (q_t, ref_t)):
        nan = torch.isnan(want.data.float())
        assert torch.equal(torch.isnan(got.data.float()).cpu(), nan)
        assert torch.equal(bits(got.data).cpu()[~nan], bits(want.data)[~nan])
        assert torch.equal(got.scale_inv.cpu(), want.scale_inv)
    # a block holding NaN or an infinity casts unscaled: infinities saturate, NaN stays NaN
    assert math.isnan(q.data[3, 5].float().item())
    assert q.data[129, 200].float().item() == fp8_max_of(torch.float8_e4m3fn)
    assert q.data[0, 259].float().item() == -fp8_max_of(torch.float8_e4m3fn)
    blk = (1, 1) if block_dim == 2 else (200 // 128, 129)
    assert q.scale_inv[blk].item() == 1.0


@pytest.mark.parametrize("pow2", [True, False])
def test_scale_rules(pow2):
    amax = torch.tensor([0.0, 1e-38, 3.0, 448.0, 1e30, float("inf"), float("nan")])
    s = B.block_scale_reference(amax, 448.0, pow2)
    assert s[0] == 1 and s[5] == 1 and s[6] == 1
    finite = s[1:5]
    assert torch.all(finite * amax[1:5] <= 448.0 * (1 + 1e-7))
    if pow2:
        m, _ = torch.frexp(s)
        assert torch.all(m == 0.5)
    else:
        assert s[2].item() == pytest.approx(448.0 / 3.0, rel=1e-7)


def test_quantize_bad_input():
    with pytest.raises(ValueError, match="quantize_blockwise: block_dim"):
        B.quantize_blockwise(torch.randn(4, 4), torch.float8_e4m3fn, 3)
    with pytest.raises(ValueError, match="quantize_blockwise: x must be a 2-D"):
        B.quantize_blockwise(torch.randn(4), torch.float8_e4m3fn, 1)
    with pytest.raises(ValueError, match="quantize_blockwise: x has dtype"):
        B.quantize_blockwise(torch.ones(4, 4, dtype=torch.int32), torch.float8_e4m3fn, 1)


GEMM_SHAPES = [(256, 128, 512), (144, 272, 384), (128, 512, 1024), (64, 48, 256)]


@pytest.mark.parametrize("device", GEMM_DEVICES)
@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("a_dim,b_dim", [(2, 1), (1, 1), (1, 2)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm_vs_dequantized_matmul(device, m, n, k, a_dim, b_dim, out_dtype):
    seed = stable_seed(m, n, k, a_dim, b_dim)
    a = randn((m, k), torch.bfloat16, device, seed=seed, scale=0.5)
    b = randn((n, k), torch.bfloat16, device, seed=seed + 1, scale=2.0)
    bias = randn((m,), out_dtype, device, seed=seed + 2)
    aq, _ = B.quantize_blockwise(a, torch.float8_e4m3fn, a_dim)
    bq, _ = B.quantize_blockwise(b, torch.float8_e4m3fn, b_dim)
    d = B.gemm_blockwise(aq, bq, out_dtype, bias)
    cpu = lambda q: B.BlockQuantized(q.data.cpu(), q.scale_inv.cpu(), q.block_dim)  # noqa: E731
    ref = B.gemm_blockwise_reference(cpu(aq), cpu(bq), torch.float32, bias.cpu())
    assert d.shape == (n, m) and d.dtype == out_dtype
    # the products are exact; the error is the accumulation's, judged against the sum of the
    # products' magnitudes: Hopper's FP8 tensor cores accumulate with fewer bits than fp32
    # (about 2^-13 relative to that sum was measured on an H100), plus the output's rounding
    mag = (B.dequantize_blockwise(cpu(bq)).abs() @ B.dequantize_blockwise(cpu(aq)).abs().t()
           + bias.cpu().float().abs())
    rounding = 2 ** -8 if out_dtype == torch.bfloat16 else 0.0
    err = (d.float().cpu() - ref).abs()
    bound = 5e-4 * mag + rounding * ref.abs() + 1e-6
    assert (err <= bound).all(), f"{int((err > bound).sum())} of {err.numel()} results off"
    # and the blocks really matter: the per-tensor product of the same FP8 bytes differs
    assert not torch.allclose(ref, (bq.data.float().cpu() @ aq.data.float().cpu().t()), rtol=0.1)


def test_gemm_bad_input():
    a, _ = B.quantize_blockwise(torch.randn(32, 64), torch.float8_e4m3fn, 2)
    b, _ = B.quantize_blockwise(torch.randn(16, 64), torch.float8_e4m3fn, 2)
    with pytest.raises(ValueError, match="gemm_blockwise: a and b are both 128x128"):
        B.gemm_blockwise(a, b, torch.bfloat16)
    c, _ = B.quantize_blockwise(torch.randn(16, 48), torch.float8_e4m3fn, 1)
    with pytest.raises(ValueError, match="gemm_blockwise: .* disagree on the reduction"):
        B.gemm_blockwise(a, c, torch.bfloat16)
    with pytest.raises(TypeError, match="gemm_blockwise: a must be a BlockQuantized"):
        B.gemm_blockwise(torch.randn(4, 4), c, torch.bfloat16)


@requires_native_gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
                    reason="sm_90 serves the block-scaled GEMM; its refusal is for other GPUs")
def test_gemm_refused_off_hopper():
    a, _ = B.quantize_blockwise(torch.randn(128, 128, device="cuda"), torch.float8_e4m3fn, 2)
    b, _ = B.quantize_blockwise(torch.randn(64, 128, device="cuda"), torch.float8_e4m3fn, 1)
    with pytest.raises(NotImplementedError, match="Float8BlockScaling needs cuBLASLt >= 12.9 on sm_90"):
        B.gemm_blockwise(a, b, torch.bfloat16)


# ----- the recipe ------------------------------------------------------------------------------

def test_recipe_defaults_and_fields(monkeypatch):
    monkeypatch.delenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", raising=False)
    r = recipe.Float8BlockScaling()
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (1, 2, 1)
    assert r.fp8_format is recipe.Format.E4M3 and r.use_f32_scales is False
    assert r.fp8_quant_fwd_inp.power_2_scale and r.fp8_quant_fwd_weight.power_2_scale
    assert r.fp8_quant_bwd_grad.power_2_scale and r.fp8_quant_fwd_inp.amax_epsilon == 0.0
    assert r.fp8_gemm_fprop.use_split_accumulator and r.fp8_gemm_wgrad.use_split_accumulator
    assert r.float8_block_scaling() and not r.delayed() and not r.float8_per_tensor_scaling()
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    r = recipe.Float8BlockScaling()
    assert r.use_f32_scales and not r.fp8_quant_fwd_weight.power_2_scale


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(x_block_scaling_dim=2), ValueError, "x_block_scaling_dim and w_block_scaling_dim"),
    (dict(w_block_scaling_dim=1, grad_block_scaling_dim=2, x_block_scaling_dim=2), ValueError,
     "x_block_scaling_dim and grad_block_scaling_dim"),
    (dict(w_block_scaling_dim=3), ValueError, "w_block_scaling_dim=3"),
    (dict(fp8_format=recipe.Format.E5M2), ValueError, "E5M2"),
    (dict(fp8_gemm_dgrad=recipe.MMParams(use_split_accumulator=False)), ValueError, "fp8_gemm_dgrad"),
    (dict(fp8_dpa=True), NotImplementedError, "fp8_dpa"),
    (dict(backward_override="fast"), ValueError, "backward_override='fast'"),
    (dict(fp8_quant_fwd_inp=recipe.QParams(amax_epsilon=1e-3)), NotImplementedError, "amax_epsilon"),
])
def test_recipe_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        recipe.Float8BlockScaling(**kwargs)


# ----- modules ---------------------------------------------------------------------------------

def _module(name, hidden, ffn, device, dtype):
    if name == "Linear":
        return te.Linear(hidden, ffn, params_dtype=dtype, device=device)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(hidden, ffn, params_dtype=dtype, device=device)
    if name == "LayerNormMLPgelu":
        return te.LayerNormMLP(hidden, ffn, params_dtype=dtype, device=device)
    return te.LayerNormMLP(hidden, ffn, params_dtype=dtype, device=device, activation="swiglu",
                           normalization="RMSNorm")


MODULES = ["Linear", "LayerNormLinear", "LayerNormMLPgelu", "LayerNormMLPswiglu"]


@pytest.mark.parametrize("device", GEMM_DEVICES)
@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("block_recipe", [
    recipe.Float8BlockScaling(),
    recipe.Float8BlockScaling(fp8_format=recipe.Format.HYBRID, use_f32_scales=True,
                              x_block_scaling_dim=2, w_block_scaling_dim=1)],
    ids=["default", "hybrid_f32_x2d"])
def test_module_vs_high_precision(device, name, block_recipe):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(stable_seed(name))
    mod = _module(name, 256, 384, device, dtype)
    x = randn((3, 48, 256), dtype, device, seed=stable_seed(name, 1)).requires_grad_(True)
    dy = randn((3, 48, 256 if name.startswith("LayerNormMLP") else 384), dtype, device,
               seed=stable_seed(name, 2))
    y_ref = mod(x)
    y_ref.backward(dy)
    g_ref = [x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
    x.grad = None
    for p in mod.parameters():
        p.grad = None
    with te.fp8_autocast(enabled=True, fp8_recipe=block_recipe):
        y = mod(x)
    y.backward(dy)
    grads = [x.grad] + [p.grad for p in mod.parameters()]
    tol = tols(torch.float8_e4m3fn)

    grad_tol = tols(torch.float8_e5m2 if block_recipe.fp8_format is recipe.Format.HYBRID
                    else torch.float8_e4m3fn)

    def close(got, want, tol=tol):
        # errors of a few FP8 ulps relative to the tensor's scale (sums over k of rounded terms)
        scale = want.float().abs().max().clamp_min(1e-6)
        torch.testing.assert_close(got.float() / scale, want.float() / scale, **tol)

    close(y, y_ref)
    for got, want in zip(grads, g_ref):
        close(got, want, grad_tol)
    # FP8 really ran: the outputs differ from high precision
    assert not torch.equal(y, y_ref)


@pytest.mark.parametrize("device", GEMM_DEVICES)
def test_linear_return_bias_and_shapes(device):
    mod = te.Linear(128, 64, return_bias=True, device=device)
    x = randn((32, 128), torch.float32, device, seed=5)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8BlockScaling()):
        y, b = mod(x)
    assert y.shape == (32, 64) and torch.equal(b, mod.bias)
    y_hp, b_hp = mod(x)
    torch.testing.assert_close(y + b, y_hp + b_hp, **tols(torch.float8_e4m3fn))


def test_module_refusals():
    # each input on its module's (default) device: the refusal under test is the shape's
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8BlockScaling()):
        linear = te.Linear(40, 64)
        with pytest.raises(ValueError, match="Linear: FP8 GEMMs need"):
            linear(torch.randn(16, 40, device=linear.weight.device))
        grouped = te.GroupedLinear(2, 40, 64)
        with pytest.raises(ValueError, match="GroupedLinear: FP8 GEMMs need"):
            grouped(torch.randn(32, 40, device=grouped.weight0.device), [16, 16])


# ----- FP8 weights in 128x128 tiles (quantized_model_init under Float8BlockScaling) -----------

def test_weight_tiles_bit_exact():
    """Float8BlockwiseQTensor holds the tile quantization of the value and of its transpose,
    each equal bit for bit to the reference quantizer's."""
    w = randn((200, 136), torch.float32, "cpu", seed=11, scale=0.05)
    t = te.Float8BlockwiseQTensor.quantize_tiles(w, torch.float8_e4m3fn, torch.float32)
    q, q_t = B.quantize_blockwise_reference(w, torch.float8_e4m3fn, 2, True, True)
    rows, cols = t.blocks()
    for got, want in ((rows, q), (cols, q_t)):
        assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
        assert torch.equal(got.scale_inv, want.scale_inv)
    torch.testing.assert_close(t.dequantize(), B.dequantize_blockwise(q), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"])
def test_fp8_weights_match_high_precision_weights(device, module):
    """A module built under quantized_model_init(Float8BlockScaling) trains like one holding the
    dequantized weights in high precision, under the same recipe; an optimizer step re-quantizes
    the tiles; the weights stay tiles through deepcopy and .to()."""
    r = recipe.Float8BlockScaling()
    build = {"Linear": lambda: te.Linear(256, 128, device=device),
             "LayerNormLinear": lambda: te.LayerNormLinear(256, 128, device=device),
             "LayerNormMLP": lambda: te.LayerNormMLP(256, 384, device=device),
             "GroupedLinear": lambda: te.GroupedLinear(2, 256, 128, device=device)}[module]
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=r):
        fp8 = build()
    hp = build()
    with torch.no_grad():
        for p, q in zip(hp.parameters(), fp8.parameters()):
            p.copy_(q.dequantize() if isinstance(q, te.QuantizedTensor) else q)
    tiles = [n for n, p in fp8.named_parameters() if isinstance(p, te.Float8BlockwiseQTensor)]
    assert tiles and all("weight" in n for n in tiles)
    x = randn((64, 256), torch.float32, device, seed=12)
    outs = []
    for m in (fp8, hp):
        xi = x.clone().requires_grad_(True)
        with te.autocast(recipe=r):
            y = m(xi, [32, 32]) if module == "GroupedLinear" else m(xi)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), xi.grad))
    fp8_tol = tols(torch.float8_e4m3fn)
    torch.testing.assert_close(outs[0][0], outs[1][0], **fp8_tol)
    torch.testing.assert_close(outs[0][1], outs[1][1], **fp8_tol)
    w = getattr(fp8, tiles[0])
    before = w.dequantize().clone()
    torch.optim.SGD(fp8.parameters(), lr=0.5).step()
    w = getattr(fp8, tiles[0])
    assert isinstance(w, te.Float8BlockwiseQTensor) and not torch.equal(w.dequantize(), before)
    rows, cols = w.blocks()
    # the transposed tiles follow the update
    torch.testing.assert_close(B.dequantize_blockwise(cols).t(), w.dequantize(torch.float32), **fp8_tol)
    assert isinstance(getattr(copy.deepcopy(fp8).to(torch.float32), tiles[0]), te.Float8BlockwiseQTensor)


def test_fp8_tile_weights_refused_under_per_tensor_recipes():
    with te.quantized_model_init(recipe=recipe.Float8BlockScaling()):
        m = te.Linear(128, 128, device="cpu")
    with te.autocast(recipe=recipe.DelayedScaling()):
        with pytest.raises(NotImplementedError, match="Linear: weights quantized in 128x128 tiles"):
            m(torch.randn(16, 128))
    y = m(torch.randn(16, 128))  # outside FP8: the dequantized weights
    assert y.shape == (16, 128)
