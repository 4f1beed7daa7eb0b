"""Block-wise FP8 (the Float8BlockScaling recipe): quantisation with one fp32 scale per 1x128 row
segment or per 128x128 tile, and the GEMM of two such operands.

    quantize_blockwise(x, fp8_dtype, block_dim, pow2_scales, with_transpose)
        x [rows, cols] -> BlockQuantized(data [rows, cols], scale_inv, block_dim) and, with
        with_transpose, the transpose [cols, rows] quantised along its own rows (what the
        dgrad / wgrad GEMMs read: every GEMM operand is blocked along its reduction dimension).
    gemm_blockwise(a, b, out_dtype, bias=None)
        D [n, m] = dequant(b) [n, k] @ dequant(a)[m, k].T (+ bias): the TN layout of gemm.py.

Per block: amax = max|x| (NaN if the block holds NaN); scale = fp8_max / amax, 1 where amax is 0,
NaN or infinite, FLT_MAX where the quotient overflows, rounded down to a power of two with
pow2_scales; data = saturate_fp8(x * scale); scale_inv = 1 / scale. The scale_inv tensors have
the layout cuBLASLt's block-scaled GEMM reads (transformer_engine/cast.h), padding zero:
    block_dim 1: [ceil(cols / 128), round_up(rows, 4)]        (element [j, i]: row i, block j)
    block_dim 2: [ceil(rows / 128), round_up(ceil(cols / 128), 4)]

On a GPU with the native core both run natively (the GEMM needs cuBLASLt >= 12.9 on sm_90 and
raises NotImplementedError saying so elsewhere); otherwise the plain-torch references below run.
The native quantiser equals the reference bit for bit.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .. import native
from .cast import fp8_max_of

BLOCK = 128
# NVTEGemmScaleMode values (transformer_engine/gemm.h), by block_dim.
SCALE_MODE = {1: 1, 2: 2}
_FLT_MAX = torch.finfo(torch.float32).max
_POW2_MASK = -8388608  # 0xFF800000 as int32: sign and exponent bits


class BlockQuantized(NamedTuple):
    data: torch.Tensor       # FP8 [rows, cols]
    scale_inv: torch.Tensor  # float32, the GEMM layout above
    block_dim: int           # 1: 1x128 blocks along cols, 2: 128x128 tiles


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _round_up4(a: int) -> int:
    return (a + 3) // 4 * 4


def scale_inv_shape(rows: int, cols: int, block_dim: int) -> Tuple[int, int]:
    if block_dim == 2:
        return _ceil_div(rows, BLOCK), _round_up4(_ceil_div(cols, BLOCK))
    return _ceil_div(cols, BLOCK), _round_up4(rows)


def _check(op: str, x: torch.Tensor, fp8_dtype, block_dim: int):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{op}: x must be a 2-D tensor; got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if fp8_dtype not in native.FP8_DTYPES:
        raise ValueError(f"{op}: fp8_dtype is {fp8_dtype}; expected a torch float8 dtype")
    if block_dim not in (1, 2):
        raise ValueError(f"{op}: block_dim is {block_dim!r}; expected 1 (1x128) or 2 (128x128)")


# ----- references ----------------------------------------------------------------------------

def block_scale_reference(amax: torch.Tensor, fp8_max: float, pow2_scales: bool) -> torch.Tensor:
    """The scale of each block from its amax (float32), as the native kernel computes it."""
    amax = amax.float()
    s = torch.full_like(amax, fp8_max) / amax
    s = torch.where((amax > 0) & (amax <= _FLT_MAX), s, torch.ones_like(s))
    s = torch.where(torch.isinf(s), torch.full_like(s, _FLT_MAX), s)
    if pow2_scales:
        s = (s.view(torch.int32) & _POW2_MASK).view(torch.float32)
    return s


def _cast(xf: torch.Tensor, s: torch.Tensor, fp8_dtype) -> torch.Tensor:
    limit = fp8_max_of(fp8_dtype)
    return (xf * s).clamp(-limit, limit).to(fp8_dtype)


def _quantize_1d_reference(x, fp8_dtype, pow2_scales) -> BlockQuantized:
    rows, cols = x.shape
    nb = _ceil_div(cols, BLOCK)
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, nb * BLOCK - cols)).view(rows, nb, BLOCK)
    s = block_scale_reference(padded.abs().amax(-1), fp8_max_of(fp8_dtype), pow2_scales)
    data = _cast(xf, s.repeat_interleave(BLOCK, dim=1)[:, :cols], fp8_dtype)
    sinv = torch.zeros(scale_inv_shape(rows, cols, 1), dtype=torch.float32, device=x.device)
    sinv[:, :rows] = (1.0 / s).t()
    return BlockQuantized(data, sinv, 1)


def _quantize_2d_reference(x, fp8_dtype, pow2_scales):
    rows, cols = x.shape
    nr, nc = _ceil_div(rows, BLOCK), _ceil_div(cols, BLOCK)
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, nc * BLOCK - cols, 0, nr * BLOCK - rows))
    amax = padded.view(nr, BLOCK, nc, BLOCK).abs().amax(dim=(1, 3))
    s = block_scale_reference(amax, fp8_max_of(fp8_dtype), pow2_scales)
    full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    data = _cast(xf, full, fp8_dtype)
    sinv = torch.zeros(scale_inv_shape(rows, cols, 2), dtype=torch.float32, device=x.device)
    sinv[:, :nc] = 1.0 / s
    sinv_t = torch.zeros(scale_inv_shape(cols, rows, 2), dtype=torch.float32, device=x.device)
    sinv_t[:, :nr] = (1.0 / s).t()
    return BlockQuantized(data, sinv, 2), BlockQuantized(data.t().contiguous(), sinv_t, 2)


def quantize_blockwise_reference(x: torch.Tensor, fp8_dtype: torch.dtype, block_dim: int,
                                 pow2_scales: bool = True, with_transpose: bool = False):
    """(rowwise BlockQuantized, transposed BlockQuantized or None) with plain torch ops."""
    if block_dim == 2:
        q, q_t = _quantize_2d_reference(x, fp8_dtype, pow2_scales)
        return q, (q_t if with_transpose else None)
    q = _quantize_1d_reference(x, fp8_dtype, pow2_scales)
    q_t = _quantize_1d_reference(x.t(), fp8_dtype, pow2_scales) if with_transpose else None
    return q, q_t


def dequantize_blockwise(q: BlockQuantized, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """data * scale_inv of its block (plain torch; the GEMM reference's first step)."""
    rows, cols = q.data.shape
    if q.block_dim == 2:
        nc = _ceil_div(cols, BLOCK)
        sinv = q.scale_inv[:, :nc].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    else:
        sinv = q.scale_inv[:, :rows].t().repeat_interleave(BLOCK, 1)
    return (q.data.float() * sinv[:rows, :cols]).to(out_dtype)


def gemm_blockwise_reference(a: BlockQuantized, b: BlockQuantized, out_dtype: torch.dtype,
                             bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    d = dequantize_blockwise(b) @ dequantize_blockwise(a).t()
    if bias is not None:
        d = d + bias.float()
    return d.to(out_dtype)


# ----- ops -----------------------------------------------------------------------------------

def quantize_blockwise(x: torch.Tensor, fp8_dtype: torch.dtype, block_dim: int,
                       pow2_scales: bool = True, with_transpose: bool = False):
    """(rowwise, transposed or None) BlockQuantized of a 2-D x (see the module docstring)."""
    op = "quantize_blockwise"
    _check(op, x, fp8_dtype, block_dim)
    if not native.use_native(x) or x.numel() == 0:
        # (an empty x has empty scale tensors: nothing for the kernel to do)
        return quantize_blockwise_reference(x, fp8_dtype, block_dim, pow2_scales, with_transpose)
    x = x.contiguous()
    rows, cols = x.shape
    data = torch.empty(rows, cols, dtype=fp8_dtype, device=x.device)
    sinv = torch.zeros(scale_inv_shape(rows, cols, block_dim), dtype=torch.float32, device=x.device)
    out_t = None
    if with_transpose:
        data_t = torch.empty(cols, rows, dtype=fp8_dtype, device=x.device)
        sinv_t = torch.zeros(scale_inv_shape(cols, rows, block_dim), dtype=torch.float32,
                             device=x.device)
        out_t = BlockQuantized(data_t, sinv_t, block_dim)
    native.native_for_torch().quantize_blockwise(
        native.describe(x), native.describe(data, scale_inv=sinv),
        native.describe(out_t.data, scale_inv=out_t.scale_inv) if out_t is not None else None,
        block_dim, bool(pow2_scales), native.stream_of(x))
    return BlockQuantized(data, sinv, block_dim), out_t


def gemm_blockwise(a: BlockQuantized, b: BlockQuantized, out_dtype: torch.dtype,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """D [n, m] = dequant(b) @ dequant(a).T (+ bias [m]) in out_dtype; a [m, k], b [n, k]."""
    op = "gemm_blockwise"
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, BlockQuantized):
            raise TypeError(f"{op}: {name} must be a BlockQuantized (from quantize_blockwise); got "
                            f"{type(t).__name__}")
    if a.data.shape[1] != b.data.shape[1]:
        raise ValueError(f"{op}: a {tuple(a.data.shape)} and b {tuple(b.data.shape)} disagree on "
                         f"the reduction dimension (their last)")
    if a.block_dim == 2 and b.block_dim == 2:
        raise ValueError(f"{op}: a and b are both 128x128-blocked; one must be 1x128-blocked")
    if out_dtype not in native.HP_DTYPES:
        raise ValueError(f"{op}: out_dtype is {out_dtype}; expected float32, float16 or bfloat16")
    m, n = a.data.shape[0], b.data.shape[0]
    if not native.use_native(b.data):
        return gemm_blockwise_reference(a, b, out_dtype, bias)
    from .gemm import gemm_workspace_raw
    out = torch.empty(n, m, dtype=out_dtype, device=b.data.device)
    if bias is not None and bias.dtype != out_dtype:
        bias = bias.to(out_dtype)
    index = b.data.device.index if b.data.device.index is not None else torch.cuda.current_device()
    stream = native.stream_of(b.data)
    _, ws_addr, ws_bytes = gemm_workspace_raw(index, stream)
    native.native_for_torch().gemm_block_scaled(
        native.describe(a.data, scale_inv=a.scale_inv), SCALE_MODE[a.block_dim],
        native.describe(b.data, scale_inv=b.scale_inv), SCALE_MODE[b.block_dim],
        native.describe(out), native.describe(bias.contiguous()) if bias is not None else None,
        ws_addr, ws_bytes, stream)
    return out
