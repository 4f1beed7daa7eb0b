"""Fused FP8 cast+transpose ops: cast_transpose_dbias, act_cast_transpose (plain and gated) and
dact_dbias_cast_transpose (plain and gated, with and without dbias).

Each fused op is compared on the same device with the unfused sequence of existing ops
(activation or its backward with an FP8 output -> transpose; cast_transpose), FP8 data, the
transposed copy, scale_inv and amax bit for bit; dbias with the shared tolerance table against an
fp32 column sum computed on the CPU. The dequantized result is also checked against the fp32
reference maths, so the reference backend is tested against something it does not share.
"""
import math

import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels import activation as act
from transformer_engine.pytorch.kernels.cast import fp8_max_of
from utils import DEVICES, device_fp8_dtype, randn, tols

HP = [torch.float32, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
PLAIN = list(act.ACTIVATIONS)
GATED = list(act.GATED)
# Odd sizes (scalar path), aligned ones (vector path, several tiles), 3-D, empty, tiny; the
# last dims are even so that the gated forms can use them: 70 -> N = 35 (scalar path), 48 ->
# N = 24 (16-byte aligned rows whose halves do not fall on a 16-element segment boundary).
SHAPES = [(37, 70), (256, 384), (3, 5, 48), (0, 64), (1, 2), (64, 48), (130, 4096)]


def bits(t):
    return t.view(torch.uint8).cpu()


def _seed(*parts):
    return sum(ord(c) for c in repr(parts)) % 10007


def _scale_for(v, fp8_dtype, device):
    """A scale mapping max|v| to 0.7 of the format's range (1 for an empty v)."""
    amax = v.abs().max().item() if v.numel() else 1.0
    return torch.tensor([0.7 * fp8_max_of(fp8_dtype) / max(amax, 1e-6)], device=device)


def _dbias_tols(dtype, rows):
    # fp32 column sums in a different order: the error grows with the number of rows summed.
    t = dict(tols(dtype))
    t["rtol"] = max(t["rtol"], 1e-5)
    t["atol"] = max(t["atol"], 2e-6 * max(rows, 1))
    return t


def _assert_same_fp8(fused, unfused):
    """Fused (data, data_t, scale_inv, amax) equal the unfused ones bit for bit."""
    for name, a, b in zip(("data", "data_t", "scale_inv", "amax"), fused, unfused):
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dtype.itemsize == 1 and a.dtype.is_floating_point:  # FP8, either flavour
            differ = (bits(a) != bits(b)).sum()
            assert differ == 0, f"{name} differs in {differ} bytes"
        else:
            assert torch.equal(a.cpu(), b.cpu()), f"{name}: {a.cpu()} vs {b.cpu()}"


def _assert_dequantizes_to(data, data_t, scale_inv, v):
    """Independent of both paths: data * scale_inv is v to one FP8 ulp, data_t is data's
    transpose."""
    rows, cols = (math.prod(v.shape[:-1]), v.shape[-1])
    deq = data.float().cpu() * scale_inv.cpu()
    torch.testing.assert_close(deq, v.reshape(deq.shape), **tols(data.dtype))
    assert torch.equal(bits(data_t), bits(data).reshape(rows, cols).t())


# ----- cast_transpose_dbias --------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("shape", SHAPES + [(37, 69)])
def test_cast_transpose_dbias(device, dtype, fp8_dtype, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, "ctdb"), scale=2.0)
    scale = _scale_for(x.float(), fp8_dtype, device)
    amax, amax_ref = torch.zeros(1, device=device), torch.zeros(1, device=device)
    data, data_t, dbias, scale_inv = kernels.cast_transpose_dbias(x, scale, fp8_dtype, amax=amax)
    ref, ref_t, ref_si = kernels.cast_transpose(x, scale, fp8_dtype, amax=amax_ref)
    _assert_same_fp8((data, data_t, scale_inv, amax), (ref, ref_t, ref_si, amax_ref))
    rows, cols = math.prod(shape[:-1]), shape[-1]
    assert dbias.dtype == dtype and dbias.shape == (cols,)
    want = x.cpu().float().reshape(rows, cols).sum(0)
    torch.testing.assert_close(dbias.cpu().float(), want, **_dbias_tols(dtype, rows))
    _assert_dequantizes_to(data, data_t, scale_inv, x.cpu().float())


@pytest.mark.parametrize("device", DEVICES)
def test_cast_transpose_dbias_fp32_dbias_and_amax_accumulates(device):
    x = randn((300, 136), torch.bfloat16, device, seed=3)
    scale = torch.tensor([4.0], device=device)
    amax = torch.full((1,), 1e4, device=device)
    _, _, dbias, _ = kernels.cast_transpose_dbias(x, scale, device_fp8_dtype(torch.float8_e4m3fn, device), amax=amax,
                                              dbias_dtype=torch.float32)
    assert dbias.dtype == torch.float32
    torch.testing.assert_close(dbias.cpu(), x.cpu().float().sum(0),
                               **_dbias_tols(torch.float32, 300))
    assert amax.item() == 1e4  # max(previous, current)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
def test_cast_transpose_dbias_short_input_same_bits(device, dtype):
    """An input of at most one row of tiles gets its bias gradient straight from the cast kernel
    (no reduce launch); one zero row more makes it two rows of tiles, summed by the reduce
    kernel. The added row changes no sum, so both ways must give the same bits. (A tile of an
    FP8 result has 128 rows.)"""
    x = randn((128, 200), dtype, device, seed=11, scale=3.0)
    longer = torch.cat([x, torch.zeros(1, 200, dtype=dtype, device=device)])
    scale = torch.tensor([2.0], device=device)
    for dbias_dtype in (dtype, torch.float32):
        _, _, short_db, _ = kernels.cast_transpose_dbias(x, scale, device_fp8_dtype(torch.float8_e4m3fn, device),
                                                     dbias_dtype=dbias_dtype)
        _, _, long_db, _ = kernels.cast_transpose_dbias(longer, scale, device_fp8_dtype(torch.float8_e4m3fn, device),
                                                    dbias_dtype=dbias_dtype)
        assert torch.equal(bits(short_db), bits(long_db)), dbias_dtype


# ----- act_cast_transpose ----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN + GATED)
@pytest.mark.parametrize("shape", SHAPES)
def test_act_cast_transpose(device, name, dtype, fp8_dtype, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "act"), scale=2.0)
    v = act.activation_fp32_reference(x.cpu(), name)
    scale = _scale_for(v, fp8_dtype, device)
    amax, amax_ref = torch.zeros(1, device=device), torch.zeros(1, device=device)
    data, data_t, scale_inv = kernels.act_cast_transpose(x, name, scale, fp8_dtype, amax=amax)
    y8, ref_si = kernels.activation_forward(x, name, fp8_dtype=fp8_dtype, scale=scale, amax=amax_ref)
    _assert_same_fp8((data, data_t, scale_inv, amax), (y8, kernels.transpose(y8), ref_si, amax_ref))
    _assert_dequantizes_to(data, data_t, scale_inv, v)


# ----- dact_dbias_cast_transpose ---------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", PLAIN + GATED)
@pytest.mark.parametrize("shape", SHAPES)
def test_dact_dbias_cast_transpose(device, name, dtype, fp8_dtype, shape):
    x = randn(shape, dtype, device, seed=_seed(shape, dtype, name, "dx"), scale=2.0)
    gshape = shape[:-1] + (shape[-1] // 2,) if name in GATED else shape
    g = randn(gshape, dtype, device, seed=_seed(shape, dtype, name, "dg"))
    v = act.dactivation_fp32_reference(g.cpu(), x.cpu(), name)
    scale = _scale_for(v, fp8_dtype, device)
    amax, amax_ref = torch.zeros(1, device=device), torch.zeros(1, device=device)
    data, data_t, dbias, scale_inv = kernels.dact_dbias_cast_transpose(
        g, x, name, scale, fp8_dtype, amax=amax, dbias_dtype=torch.float32)
    dx8, ref_si = kernels.activation_backward(g, x, name, fp8_dtype=fp8_dtype, scale=scale,
                                          amax=amax_ref)
    _assert_same_fp8((data, data_t, scale_inv, amax), (dx8, kernels.transpose(dx8), ref_si, amax_ref))
    _assert_dequantizes_to(data, data_t, scale_inv, v)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    assert dbias.dtype == torch.float32 and dbias.shape == (cols,)
    torch.testing.assert_close(dbias.cpu(), v.reshape(rows, cols).sum(0),
                               **_dbias_tols(torch.float32, rows))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP)
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_dact_dbias_in_input_dtype_and_without_dbias(device, dtype, name):
    shape = (333, 256)
    x = randn(shape, dtype, device, seed=_seed(name, dtype, "nb"), scale=2.0)
    gshape = (333, 128) if name in GATED else shape
    g = randn(gshape, dtype, device, seed=_seed(name, dtype, "nbg"))
    v = act.dactivation_fp32_reference(g.cpu(), x.cpu(), name)
    scale = _scale_for(v, device_fp8_dtype(torch.float8_e5m2, device), device)
    with_b = kernels.dact_dbias_cast_transpose(g, x, name, scale, device_fp8_dtype(torch.float8_e5m2, device))
    without = kernels.dact_dbias_cast_transpose(g, x, name, scale, device_fp8_dtype(torch.float8_e5m2, device), with_dbias=False)
    assert without[2] is None
    assert torch.equal(bits(with_b[0]), bits(without[0]))
    assert torch.equal(bits(with_b[1]), bits(without[1]))
    assert with_b[2].dtype == dtype
    torch.testing.assert_close(with_b[2].cpu().float(), v.sum(0).to(dtype).float(),
                               **_dbias_tols(dtype, shape[0]))


# ----- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_raise_clear_errors(device):
    x = randn((8, 16), torch.bfloat16, device, seed=1)
    s = torch.ones(1, device=device)
    e4 = device_fp8_dtype(torch.float8_e4m3fn, device)
    with pytest.raises(ValueError, match=r"act_cast_transpose\(tanh\): activation is 'tanh'"):
        kernels.act_cast_transpose(x, "tanh", s, e4)
    with pytest.raises(ValueError, match=r"act_cast_transpose\(gelu\): fp8_dtype"):
        kernels.act_cast_transpose(x, "gelu", s, torch.float16)
    with pytest.raises(ValueError, match=r"act_cast_transpose\(swiglu\): x has shape \(8, 15\)"):
        kernels.act_cast_transpose(randn((8, 15), torch.bfloat16, device, seed=2), "swiglu", s, e4)
    with pytest.raises(ValueError, match=r"dact_dbias_cast_transpose\(gelu\): grad has shape"):
        kernels.dact_dbias_cast_transpose(x[:, :8].contiguous(), x, "gelu", s, e4)
    with pytest.raises(ValueError, match=r"dact_dbias_cast_transpose\(swiglu\): grad has shape"):
        kernels.dact_dbias_cast_transpose(x, x, "swiglu", s, e4)
    with pytest.raises(ValueError, match=r"dact_dbias_cast_transpose\(relu\): grad has dtype"):
        kernels.dact_dbias_cast_transpose(x.float(), x, "relu", s, e4)
    with pytest.raises(ValueError, match=r"cast_transpose_dbias: x of shape \(16, 8\) is not"):
        kernels.cast_transpose_dbias(x.t(), s, e4)
    with pytest.raises(ValueError, match=r"cast_transpose_dbias: dbias_dtype"):
        kernels.cast_transpose_dbias(x, s, e4, dbias_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cast_transpose_dbias: scale must hold one float32"):
        kernels.cast_transpose_dbias(x, torch.ones(2, device=device), e4)
