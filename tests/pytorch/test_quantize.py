"""Quantize, dequantize, amax, transpose, cast+transpose and the delayed-scaling update.

On a GPU the native kernels are compared bit for bit with the plain-torch references; everywhere
the references are checked against properties and an independent Python model of the maths.
"""
import math

import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.cast import fp8_max_of
from utils import DEVICES, device_fp8_dtype, randn, requires_native_gpu, stable_seed

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
HP = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(37, 23), (128, 128), (2048, 1024), (0, 64), (3, 5, 48), (1, 1), (1000, 16), (16, 1000)]


def bits(t):
    return t.view(torch.uint8)


def scale_for(x, fp8_dtype):
    amax = x.float().abs().max().item() if x.numel() else 1.0
    return torch.tensor([0.7 * fp8_max_of(fp8_dtype) / max(amax, 1e-6)], device=x.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("shape", SHAPES)
def test_quantize_bit_exact(device, fp8_dtype, dtype, shape):
    x = randn(shape, dtype, device, seed=stable_seed(shape, dtype, modulo=1000), scale=3.0)
    scale = scale_for(x, fp8_dtype)
    amax = torch.zeros(1, device=device)
    data, scale_inv = kernels.quantize(x, scale, fp8_dtype, amax=amax)
    ref, ref_si, ref_amax = kernels.quantize_reference(x.cpu(), scale.cpu(), fp8_dtype)
    assert data.dtype == fp8_dtype and data.shape == x.shape
    assert torch.equal(bits(data).cpu(), bits(ref))
    assert torch.equal(scale_inv.cpu(), ref_si)
    assert torch.equal(amax.cpu(), ref_amax)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("shape", SHAPES)
def test_cast_transpose_bit_exact(device, fp8_dtype, dtype, shape):
    x = randn(shape, dtype, device, seed=7, scale=2.0)
    scale = scale_for(x, fp8_dtype)
    amax = torch.zeros(1, device=device)
    data, data_t, scale_inv = kernels.cast_transpose(x, scale, fp8_dtype, amax=amax)
    ref, ref_si, ref_amax = kernels.quantize_reference(x.cpu(), scale.cpu(), fp8_dtype)
    cols = shape[-1]
    assert torch.equal(bits(data).cpu(), bits(ref))
    assert tuple(data_t.shape) == (cols, math.prod(shape[:-1]))
    assert torch.equal(bits(data_t).cpu(), bits(ref).reshape(-1, cols).t())
    assert torch.equal(scale_inv.cpu(), ref_si)
    assert torch.equal(amax.cpu(), ref_amax)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,band", [((1024, 384), 256), ((1000, 272), 384), ((384, 4096), 128),
                                        ((200, 48), 64)])
def test_cast_transpose_in_bands_of_rows_gives_the_whole_casts_bits(device, shape, band):
    """nvte_cast_transpose_rows band by band (the last band shorter where the rows do not divide;
    unaligned shapes take the element-wise path) writes the bytes, scale_inv and amax of one
    nvte_cast_transpose of the whole tensor."""
    from transformer_engine.pytorch import native
    from transformer_engine.pytorch.native import describe
    if not native.use_native(torch.empty(1, device=device)):
        pytest.skip(f"the native library does not serve {device} tensors here (reference backend)")
    mod, stream = native.native_for_torch(), native.stream_handle(torch.device(device).index)
    fp8 = device_fp8_dtype(torch.float8_e4m3fn, device)
    x = randn(shape, torch.bfloat16, device, seed=11, scale=2.0)
    scale = scale_for(x, fp8)
    rows = shape[0]
    made = []
    for bands in (False, True):
        amax, scale_inv = torch.zeros(1, device=device), torch.zeros(1, device=device)
        data = torch.zeros(shape, dtype=fp8, device=device)
        data_t = torch.zeros(shape[::-1], dtype=fp8, device=device)
        out = describe(data, amax, scale, scale_inv)
        if bands:
            for begin in range(0, rows, band):
                mod.cast_transpose_rows(describe(x), out, describe(data_t), begin,
                                        min(begin + band, rows), stream)
        else:
            mod.cast_transpose(describe(x), out, describe(data_t), stream)
        made.append([bits(t).cpu() for t in (data, data_t)] + [amax.cpu(), scale_inv.cpu()])
    whole, banded = made
    for a, b in zip(whole, banded):
        assert torch.equal(a, b)
    assert float(whole[2]) == x.float().abs().max().item()
    # a band outside the rows is refused with a Python exception, before any launch
    with pytest.raises(ValueError, match="nvte_cast_transpose_rows: rows"):
        mod.cast_transpose_rows(describe(x), out, describe(data_t), rows - 16, rows + 16, stream)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_saturation_and_special_values(device, fp8_dtype):
    limit = fp8_max_of(fp8_dtype)
    vals = [0.0, -0.0, 1e-9, 1.06 * limit, -1.06 * limit, 1e30, float("inf"), -float("inf"), limit, 2.0]
    x = torch.tensor(vals * 5, device=device).reshape(1, 50)  # 48 vectorised + a scalar tail
    data, _ = kernels.quantize(x, torch.ones(1, device=device), fp8_dtype)
    f = data.float().cpu()[0, :10]
    assert f[3] == limit and f[4] == -limit and f[5] == limit  # beyond max saturates
    assert f[6] == limit and f[7] == -limit  # inf saturates, never NaN
    assert f[8] == limit and f[9] == 2.0 and f[0] == 0.0
    # OCP keeps negative zero; FNUZ has none (its 0x80 is NaN), so -0 becomes +0
    assert bool(torch.signbit(f[1])) == (fp8_dtype in (torch.float8_e4m3fn, torch.float8_e5m2))


@pytest.mark.parametrize("device", DEVICES)
def test_amax_propagates_nan_and_accumulates(device):
    x = randn((64, 32), torch.float32, device, seed=3)
    amax = torch.full((1,), 1e6, device=device)
    kernels.compute_amax(x, amax)
    assert amax.item() == 1e6  # max(previous, current)
    amax.zero_()
    kernels.compute_amax(x, amax)
    assert amax.item() == x.abs().max().item()
    x[5, 7] = float("nan")
    kernels.compute_amax(x, amax)
    assert math.isnan(amax.item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("out_dtype", HP)
def test_dequantize_inverts_quantize(device, fp8_dtype, out_dtype):
    x = randn((37, 48), torch.float32, device, seed=11)
    scale = scale_for(x, fp8_dtype)
    data, scale_inv = kernels.quantize(x, scale, fp8_dtype)
    back = kernels.dequantize(data, scale_inv, out_dtype)
    ref = kernels.dequantize_reference(data.cpu(), scale_inv.cpu(), out_dtype)
    assert back.dtype == out_dtype
    assert torch.equal(back.cpu(), ref)
    # one FP8 ulp relative: 2^-3 (E4M3) or 2^-2 (E5M2)
    rel = 2.0 ** -3 if fp8_dtype == torch.float8_e4m3fn else 2.0 ** -2
    assert torch.allclose(back.float().cpu(), x.cpu(), rtol=rel, atol=rel / scale.item() * 2 ** -6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint8])
@pytest.mark.parametrize("shape", [(37, 23), (256, 512), (0, 8), (4, 6, 40)])
def test_transpose(device, dtype, shape):
    x = randn(shape, torch.float32, device, seed=5, scale=50.0)
    x = x.to(dtype) if dtype != torch.uint8 else (x.abs() % 255).to(torch.uint8)
    out = kernels.transpose(x)
    ref = x.cpu().reshape(-1, shape[-1]).t()
    assert torch.equal(out.cpu().view(torch.uint8) if dtype.itemsize == 1 else out.cpu(),
                       ref.view(torch.uint8) if dtype.itemsize == 1 else ref)


# ----- delayed scaling -----------------------------------------------------------------------

def python_model_update(history, scale, fp8_max, algo, margin):
    """Scalar Python model of the recipe maths (independent of both implementations). Returns
    (history, scale, skipped): a tensor whose current amax (row 0) is not finite is skipped."""
    L, n = len(history), len(history[0])
    new_hist = [[0.0] * n for _ in range(L)]
    new_scale = list(scale)
    skipped = [0] * n
    for j in range(n):
        col = [history[l][j] for l in range(L)]
        if not math.isfinite(col[0]):
            skipped[j] = 1
            for l in range(1, L):
                new_hist[l][j] = col[l]
            continue
        amax = col[0] if algo == "most_recent" else (float("nan") if any(math.isnan(v) for v in col) else max(col))
        for l in range(L):
            new_hist[l][j] = col[(l + 1) % L]
        new_hist[0][j] = 0.0
        if amax > 0 and math.isfinite(amax):
            cand = torch.tensor(fp8_max, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)
            cand = (cand / torch.tensor(2.0 ** margin, dtype=torch.float32)).item()
            if math.isfinite(cand):
                new_scale[j] = cand
    return new_hist, new_scale, skipped


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 1, 3])
@pytest.mark.parametrize("history_len", [1, 4, 1024])
def test_delayed_scaling_update(device, algo, margin, history_len):
    groups, expected = [], []
    for g, (n, fp8_max) in enumerate([(3, 448.0), (5, 57344.0), (1, 240.0)]):
        hist = randn((history_len, n), torch.float32, "cpu", seed=g + history_len, scale=20.0).abs()
        hist[:, 0] = 0.0  # amax 0: scale kept
        if n > 1:
            hist[0, 1] = float("inf")  # non-finite current amax: skipped, scale kept
        if n > 3:
            hist[0, 3] = float("nan")  # a NaN step: skipped, never enters the history
        if n > 2:
            hist[-1, 2] = 1e-42  # tiny amax: fp8_max / amax overflows for 'max' when it's the max
        scale = torch.rand(n, generator=torch.Generator().manual_seed(g)) + 0.5
        expected.append(python_model_update(hist.tolist(), scale.tolist(), fp8_max, algo, margin))
        skipped = torch.full((n,), 2, dtype=torch.int32, device=device)
        groups.append((hist.to(device), scale.to(device), torch.empty(n, device=device), fp8_max, skipped))
    kernels.delayed_scaling_update(groups, algo=algo, margin=margin)
    for (hist, scale, scale_inv, _, skipped), (want_hist, want_scale, want_skipped) in zip(groups, expected):
        assert torch.equal(skipped.cpu(), 2 + torch.tensor(want_skipped, dtype=torch.int32))
        assert torch.equal(hist.cpu(), torch.tensor(want_hist, dtype=torch.float32))
        assert torch.equal(scale.cpu(), torch.tensor(want_scale, dtype=torch.float32))
        assert torch.equal(scale_inv.cpu(), 1.0 / torch.tensor(want_scale, dtype=torch.float32))


def test_delayed_scaling_callable_algo():
    hist = torch.tensor([[1.0, 2.0], [3.0, 0.5]])
    scale, scale_inv = torch.ones(2), torch.empty(2)
    kernels.delayed_scaling_update([(hist, scale, scale_inv, 448.0)], algo=lambda h: h.mean(dim=0))
    assert torch.allclose(scale, torch.tensor([448.0 / 2.0, 448.0 / 1.25]))


# ----- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_clear_errors(device):
    x = randn((16, 32), torch.bfloat16, device)
    one = torch.ones(1, device=device)
    with pytest.raises(ValueError, match="quantize: x .* not contiguous"):
        kernels.quantize(x.t(), one, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="quantize: x has dtype int32"):
        kernels.quantize(x.to(torch.int32), one, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="quantize: fp8_dtype"):
        kernels.quantize(x, one, torch.bfloat16)
    with pytest.raises(ValueError, match="quantize: scale must hold one float32"):
        kernels.quantize(x, torch.ones(2, device=device), torch.float8_e4m3fn)
    e4m3 = device_fp8_dtype(torch.float8_e4m3fn, device)  # (an FNUZ device refuses OCP first)
    with pytest.raises(ValueError, match="quantize: out has shape"):
        kernels.quantize(x, one, e4m3, out=torch.empty(3, 3, dtype=e4m3, device=device))
    with pytest.raises(ValueError, match="delayed_scaling_update: groups\\[0\\].scale"):
        kernels.delayed_scaling_update([(torch.zeros(4, 3, device=device), torch.ones(2, device=device),
                                     torch.ones(3, device=device), 448.0)])
    with pytest.raises(ValueError, match="algo"):
        kernels.delayed_scaling_update([], algo="mean")


@requires_native_gpu
def test_fnuz_dtype_rejected_on_ocp_device():
    x = randn((16, 32), torch.bfloat16, "cuda")
    from transformer_engine.pytorch import capability
    wrong = torch.float8_e4m3fnuz if capability().fp8_flavor == "ocp" else torch.float8_e4m3fn
    with pytest.raises(ValueError, match="does not match"):
        kernels.quantize(x, torch.ones(1, device="cuda"), wrong)


@requires_native_gpu
def test_native_errors_are_python_exceptions():
    """A check only the C core makes (the bindings' view of shapes) comes back as ValueError."""
    from transformer_engine.pytorch.native import describe, native_for_torch
    x = randn((16, 32), torch.bfloat16, "cuda")
    out = torch.empty(8, dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.ones(1, device="cuda")
    with pytest.raises(ValueError, match="nvte_quantize: input shape \\[16, 32\\] and output shape \\[8\\]"):
        native_for_torch().quantize(describe(x), describe(out, scale=s), 0)


@requires_native_gpu
def test_runs_on_side_stream_and_in_graph():
    x = randn((256, 512), torch.bfloat16, "cuda", seed=2)
    scale = torch.tensor([4.0], device="cuda")
    amax = torch.zeros(1, device="cuda")
    ref, _, _ = kernels.quantize_reference(x.cpu(), scale.cpu(), torch.float8_e4m3fn)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kernels.cast_transpose(x, scale, torch.float8_e4m3fn, amax=amax)  # warm-up on a side stream
        with torch.cuda.graph(g):
            data, data_t, _ = kernels.cast_transpose(x, scale, torch.float8_e4m3fn, amax=amax)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(data).cpu(), bits(ref))
    assert torch.equal(bits(data_t).cpu(), bits(ref).t())
