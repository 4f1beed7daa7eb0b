"""Float8Tensor under FSDP2 without a process group: the shape ops fully_shard shards and pads a
parameter with stay in FP8, fsdp_pre_all_gather / fsdp_post_all_gather rebuild the weight from
its shards (FP8 bytes and one scale per shard, or the nominal-dtype fallback of an uneven split)
and in-place updates of several tensors at once (a _foreach_ optimizer step) re-quantise each.
The gather between the two hooks is played by concatenation; the two-rank runs are in
test_fsdp.py and tests/distributed."""
import pytest
import torch

import transformer_engine.pytorch as te

from utils import DEVICES, randn, tols


class _Mesh:
    """What the hooks read of a DeviceMesh: its size, rank and (absent here) process group."""
    ndim = 1

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size

    def get_group(self, dim=0):
        return None


def _gather(shards, mesh, orig_size, dtype):
    ins = [s.fsdp_pre_all_gather(mesh, orig_size, None, None, None) for s in shards]
    meta = ins[0][1]
    outs = tuple(torch.cat([i[0][k] for i in ins]) for k in range(len(ins[0][0])))
    return shards[0].fsdp_post_all_gather(outs, meta, dtype), ins


@pytest.mark.parametrize("device", DEVICES)
def test_shape_ops_keep_fp8_and_share_the_scale(device):
    x = randn((38, 23), torch.bfloat16, device, seed=1)
    t = te.Float8Tensor.quantize(x, te.fp8_dtype("e4m3", device))
    for part, want in zip(t.chunk(2), t._data.chunk(2)):
        assert isinstance(part, te.Float8Tensor) and part._scale_inv is t._scale_inv
        assert torch.equal(part._data.view(torch.uint8), want.view(torch.uint8))
    flat = t.view(-1)
    assert isinstance(flat, te.Float8Tensor) and flat.shape == (38 * 23,)
    padded = t.new_zeros((20, 23))
    assert isinstance(padded, te.Float8Tensor) and padded._data.dtype == t._data.dtype
    padded.narrow(0, 0, 19).copy_(t.chunk(2)[1])
    # the copy into a slice sets the scale of the whole padded tensor (shared with the slice)
    assert torch.equal(padded._scale_inv, t._scale_inv)
    assert torch.equal(padded.dequantize()[:19], t.dequantize()[19:])
    assert not padded.dequantize()[19:].any()


@pytest.mark.parametrize("device", DEVICES)
def test_even_split_gathers_fp8_bytes_on_the_largest_scale(device):
    x = randn((38, 23), torch.float32, device, seed=2, scale=2.0)
    fp8 = te.fp8_dtype("e4m3", device)
    shards = [te.Float8Tensor.quantize(p, fp8) for p in x.chunk(2)]
    (full, inner), ins = _gather(shards, _Mesh(2), x.shape, torch.bfloat16)
    # what travels: one byte per element and a float32 inverse scale
    for (data, scale_inv), _ in ins:
        assert data.dtype == torch.uint8 and data.shape == (19, 23) and scale_inv.shape == (1,)
    assert isinstance(full, te.Float8Tensor) and full.shape == x.shape and full.dtype == torch.bfloat16
    # FSDP frees the data and the FP8 transpose (made with them) between gathers
    assert inner[0] is full._data and inner[1] is full._transpose_cache
    assert torch.equal(inner[1].view(torch.uint8), te.kernels.transpose(full._data).view(torch.uint8))
    # the parameter FSDP makes of it (an identity as_strided, then detach) keeps the transpose
    param = torch.nn.Parameter(torch.as_strided(full, full.shape, full.stride(), 0))
    assert isinstance(param, te.Float8Tensor) and param._transpose_cache is inner[1]
    big = max(range(2), key=lambda i: float(shards[i]._scale_inv))
    assert torch.equal(full._scale_inv, shards[big]._scale_inv)
    # the shard already on the common scale is copied bit for bit; the other is rounded again
    rows = slice(19 * big, 19 * (big + 1))
    assert torch.equal(full._data[rows].view(torch.uint8), shards[big]._data.view(torch.uint8))
    torch.testing.assert_close(full.dequantize().float(), x, **tols("float8_e4m3"))


@pytest.mark.parametrize("device", DEVICES)
def test_equal_scales_gather_bit_for_bit_and_refill_in_place(device):
    x = randn((32, 48), torch.bfloat16, device, seed=3)
    whole = te.Float8Tensor.quantize(x, te.fp8_dtype("e4m3", device))
    shards = list(whole.chunk(2))
    (full, _), _ = _gather(shards, _Mesh(2), x.shape, torch.bfloat16)
    assert torch.equal(full._data.view(torch.uint8), whole._data.view(torch.uint8))
    assert torch.equal(full._scale_inv, whole._scale_inv)
    # a later gather refills the same tensors without bumping the version autograd checks
    cached = full.transpose_fp8()
    version, t_version = full._data._version, cached._version
    shards[0].mul_(0.5)
    ins = [s.fsdp_pre_all_gather(_Mesh(2), x.shape, None, None, None) for s in shards]
    outs = tuple(torch.cat([i[0][k] for i in ins]) for k in range(2))
    assert shards[0].fsdp_post_all_gather(outs, ins[0][1], torch.bfloat16, out=full) is None
    assert full._data._version == version and cached._version == t_version
    assert full._transpose_cache is cached
    assert torch.equal(cached.view(torch.uint8), te.kernels.transpose(full._data).view(torch.uint8))
    want = torch.cat([shards[0].dequantize(), shards[1].dequantize()])
    torch.testing.assert_close(full.dequantize().float(), want.float(), **tols("float8_e4m3"))


@pytest.mark.parametrize("device", DEVICES)
def test_uneven_split_falls_back_to_the_nominal_dtype(device):
    x = randn((37, 23), torch.float32, device, seed=4)
    fp8 = te.fp8_dtype("e4m3", device)
    whole = te.Float8Tensor.quantize(x, fp8)
    shards = list(whole.chunk(2))  # 19 and 18 rows
    (full, _), ins = _gather(shards, _Mesh(2), x.shape, torch.float32)
    for (padded,), _ in ins:
        assert padded.dtype == torch.float32 and padded.shape == (19, 23)
    assert torch.equal(full.dequantize(), te.Float8Tensor.quantize(whole.dequantize(), fp8).dequantize())


@pytest.mark.parametrize("device", DEVICES)
def test_foreach_inplace_requantizes_every_float8_tensor(device):
    fp8 = te.fp8_dtype("e4m3", device)
    a = te.Float8Tensor.quantize(randn((16, 32), torch.float32, device, seed=5), fp8)
    b = te.Float8Tensor.quantize(randn((7, 3), torch.float32, device, seed=6, scale=5.0), fp8)
    plain = randn((5,), torch.float32, device, seed=7)
    before = [a.dequantize(), b.dequantize(), plain.clone()]
    torch._foreach_mul_([a, b, plain], 0.375)
    assert isinstance(a, te.Float8Tensor) and isinstance(b, te.Float8Tensor)
    for got, old in zip((a.dequantize(), b.dequantize(), plain), before):
        torch.testing.assert_close(got, old * 0.375, **tols("float8_e4m3"))
    assert torch.equal(plain, before[2] * 0.375)
