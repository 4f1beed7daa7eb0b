"""FP8 on both vendors without a GPU: which encoding each arch uses, and an independent decoder
of the four FP8 encodings checked byte for byte against torch and jnp.

OCP (NVIDIA sm_89+, AMD gfx950): E4M3 bias 7, no infinities, NaN = S.1111.111, max 448;
  E5M2 bias 15, IEEE-like (infinities and NaNs at exponent 31), max 57344.
FNUZ (AMD gfx942): bias one larger (E4M3 8, E5M2 16), no infinities, no negative zero: the one
  NaN is 0x80; every other pattern is finite. E4M3 max 240, E5M2 max 57344.
"""
import importlib.util
import math

import pytest

from transformer_engine.common.fp8_formats import (E4M3, E5M2, FNUZ, OCP, fp8_dtype_name,
                                                   fp8_for_arch, fp8_max, format_of_dtype_name)

# ----- arch -> flavour ---------------------------------------------------------------------------

ARCH_CASES = [
    # arch,                     flavour, FP8 GEMM
    ("sm_80", OCP, False),
    ("sm_89", OCP, True),
    ("sm_90", OCP, True),
    ("sm_90a", OCP, True),
    ("gfx90a", None, False),
    ("gfx942", FNUZ, True),
    ("gfx942:sramecc+:xnack-", FNUZ, True),
    ("gfx950", OCP, True),
    ("gfx950:sramecc+:xnack-", OCP, True),
]


@pytest.mark.parametrize("arch, flavor, fp8_gemm", ARCH_CASES)
def test_arch_maps_to_flavor(arch, flavor, fp8_gemm):
    info = fp8_for_arch(arch)
    assert info.flavor == flavor, info.reason
    assert info.fp8_gemm == fp8_gemm, info.reason
    assert info.reason


@pytest.mark.parametrize("arch, e4m3, e5m2, e4m3_max", [
    ("sm_90", "float8_e4m3fn", "float8_e5m2", 448.0),
    ("gfx950", "float8_e4m3fn", "float8_e5m2", 448.0),
    ("gfx942", "float8_e4m3fnuz", "float8_e5m2fnuz", 240.0),
    ("gfx942:sramecc+:xnack-", "float8_e4m3fnuz", "float8_e5m2fnuz", 240.0),
])
def test_arch_dtypes_and_max(arch, e4m3, e5m2, e4m3_max):
    flavor = fp8_for_arch(arch).flavor
    assert fp8_dtype_name(E4M3, flavor) == e4m3
    assert fp8_dtype_name(E5M2, flavor) == e5m2
    assert fp8_max(E4M3, flavor) == e4m3_max
    assert fp8_max(E5M2, flavor) == 57344.0
    assert format_of_dtype_name(e4m3) == (E4M3, flavor)


def test_unknown_flavor_is_an_error():
    with pytest.raises(ValueError):
        fp8_max(E4M3, "ieee")
    with pytest.raises(ValueError):
        format_of_dtype_name("float16")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.parametrize("arch, e4m3, e5m2", [
    ("sm_90", "float8_e4m3fn", "float8_e5m2"),
    ("gfx942:sramecc+:xnack-", "float8_e4m3fnuz", "float8_e5m2fnuz"),
    ("gfx950", "float8_e4m3fn", "float8_e5m2"),
])
def test_torch_dtype_follows_the_device_arch(monkeypatch, arch, e4m3, e5m2):
    import torch
    from transformer_engine.common import capabilities
    from transformer_engine.pytorch import native
    backend = "cuda" if arch.startswith("sm_") else "rocm"
    cap = capabilities.capability_for(backend, arch, "test device")
    monkeypatch.setattr(native, "capability", lambda device=None: cap)
    assert native.fp8_dtype(E4M3) is getattr(torch, e4m3)
    assert native.fp8_dtype(E5M2) is getattr(torch, e5m2)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_dtype_refused_without_fp8(monkeypatch):
    from transformer_engine.common import capabilities
    from transformer_engine.pytorch import native
    monkeypatch.setattr(native, "capability",
                        lambda device=None: capabilities.capability_for("rocm", "gfx90a", "MI250X"))
    with pytest.raises(NotImplementedError, match="gfx90a"):
        native.fp8_dtype(E4M3)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
@pytest.mark.parametrize("arch, e4m3, e5m2", [
    ("gfx942", "float8_e4m3fnuz", "float8_e5m2fnuz"),
    ("gfx950", "float8_e4m3fn", "float8_e5m2"),
])
def test_jnp_dtype_follows_the_arch_flavor(arch, e4m3, e5m2):
    import jax.numpy as jnp
    from transformer_engine.jax.kernels.cast import fp8_dtype
    flavor = fp8_for_arch(arch).flavor
    assert fp8_dtype(E4M3, flavor) == jnp.dtype(getattr(jnp, e4m3))
    assert fp8_dtype(E5M2, flavor) == jnp.dtype(getattr(jnp, e5m2))


# ----- an independent decoder --------------------------------------------------------------------

FORMATS = {
    # dtype name:       (exponent bits, mantissa bits, bias, flavour)
    "float8_e4m3fn": (4, 3, 7, OCP),
    "float8_e5m2": (5, 2, 15, OCP),
    "float8_e4m3fnuz": (4, 3, 8, FNUZ),
    "float8_e5m2fnuz": (5, 2, 16, FNUZ),
}


def decode_fp8(byte: int, exp_bits: int, man_bits: int, bias: int, flavor: str) -> float:
    """Value of one FP8 byte, from the format definition alone."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent = (byte >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = byte & ((1 << man_bits) - 1)
    top_exponent = (1 << exp_bits) - 1
    if flavor == FNUZ:
        if byte == 0x80:          # the "negative zero" pattern is the only NaN
            return math.nan
    elif exp_bits == 5:           # OCP E5M2 follows IEEE 754
        if exponent == top_exponent:
            return sign * math.inf if mantissa == 0 else math.nan
    elif exponent == top_exponent and mantissa == (1 << man_bits) - 1:
        return math.nan           # OCP E4M3: S.1111.111 only; no infinities
    if exponent == 0:             # subnormal: 0.m * 2^(1 - bias)
        return sign * math.ldexp(mantissa, 1 - bias - man_bits)
    return sign * math.ldexp((1 << man_bits) + mantissa, exponent - bias - man_bits)


def reference_table(name):
    return [decode_fp8(b, *FORMATS[name]) for b in range(256)]


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_decoder_agrees_with_the_format_constants(name):
    table = reference_table(name)
    finite = [v for v in table if math.isfinite(v)]
    fmt, flavor = format_of_dtype_name(name)
    assert max(finite) == fp8_max(fmt, flavor)
    assert min(finite) == -fp8_max(fmt, flavor)
    nans = sum(math.isnan(v) for v in table)
    infs = sum(math.isinf(v) for v in table)
    assert (nans, infs) == {"float8_e4m3fn": (2, 0), "float8_e5m2": (6, 2),
                            "float8_e4m3fnuz": (1, 0), "float8_e5m2fnuz": (1, 0)}[name]
    # FNUZ has no negative zero; OCP has both zeros.
    zeros = [b for b, v in enumerate(table) if v == 0.0]
    assert zeros == ([0] if flavor == FNUZ else [0, 0x80])


def _nonnan_bytes(table):
    return [b for b, v in enumerate(table) if not math.isnan(v)]


# ----- torch -------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_torch_fp8_bytes_round_trip(name):
    import torch
    dtype = getattr(torch, name)
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = raw.view(dtype).to(torch.float32).tolist()
    table = reference_table(name)
    bad = [(hex(b), v, ref) for b, (v, ref) in enumerate(zip(values, table)) if not _same(v, ref)]
    assert bad == [], f"{name}: torch decodes differently from the format definition"
    # Encoding each decoded value gives the byte back (NaN: some NaN pattern of the format).
    back = torch.tensor(values, dtype=torch.float32).to(dtype).view(torch.uint8).tolist()
    for b in range(256):
        if math.isnan(table[b]):
            assert math.isnan(table[back[b]]), (name, hex(b), hex(back[b]))
        else:
            assert back[b] == b, (name, hex(b), hex(back[b]))
    assert torch.finfo(dtype).max == fp8_max(*format_of_dtype_name(name))


# ----- jax ---------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_jnp_fp8_bytes_round_trip(name):
    import jax
    import jax.numpy as jnp
    import numpy as np
    dtype = getattr(jnp, name)
    raw = jnp.arange(256, dtype=jnp.uint32).astype(jnp.uint8)
    values = np.asarray(jax.lax.bitcast_convert_type(raw, dtype).astype(jnp.float32)).tolist()
    table = reference_table(name)
    bad = [(hex(b), v, ref) for b, (v, ref) in enumerate(zip(values, table)) if not _same(v, ref)]
    assert bad == [], f"{name}: jnp decodes differently from the format definition"
    back = np.asarray(jax.lax.bitcast_convert_type(
        jnp.asarray(values, dtype=jnp.float32).astype(dtype), jnp.uint8)).tolist()
    for b in range(256):
        if math.isnan(table[b]):
            assert math.isnan(table[back[b]]), (name, hex(b), hex(back[b]))
        else:
            assert back[b] == b, (name, hex(b), hex(back[b]))
    assert float(jnp.finfo(dtype).max) == fp8_max(*format_of_dtype_name(name))
