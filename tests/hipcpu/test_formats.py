"""The number formats of the emulated AMD build against torch's dtypes, bit for bit, and the AMD
arch refusals of util/arch.h. Runs on any host with a C++ compiler (no GPU, no ROCm).

Checked for gfx942 (FNUZ: float8_e4m3fnuz / float8_e5m2fnuz) and gfx950 (OCP: float8_e4m3fn /
float8_e5m2), through the conversions the kernels call (arch.h: HIP's conversion on gfx942, the
compiler's conversion builtins on gfx950, as modelled by the runtime from the format definition):
all 256 codes decoded; every representable value, every midpoint between neighbours (ties to
even), values just off the midpoints, subnormals and random values encoded; and the rule for
special inputs (+-Inf -> +-max, NaN -> NaN, out of range -> +-max, FNUZ: no negative zero).
"""
import ctypes
import os
import shutil
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")

FLAVOURS = {
    "gfx942": (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz),
    "gfx950": (torch.float8_e4m3fn, torch.float8_e5m2),
}


def _flags(arch):
    return ["-std=c++17", "-x", "c++", "-D__HIP_PLATFORM_AMD__", f"-D__{arch}__",
            f"-DHIPCPU_{arch.upper()}", f"-I{os.path.join(HERE, 'include')}",
            f"-I{os.path.join(ROOT, 'csrc', 'common')}",
            f"-I{os.path.join(ROOT, 'csrc', 'common', 'include')}"]


@pytest.fixture(scope="module", params=sorted(FLAVOURS))
def probe(request, tmp_path_factory):
    arch = request.param
    lib = tmp_path_factory.mktemp(arch) / "probe.so"
    subprocess.run([CXX, *_flags(arch), "-O1", "-fPIC", "-shared",
                    os.path.join(HERE, "format_probe.cpp"), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))
    for name, res, arg in (("probe_to_e4m3", ctypes.c_ubyte, ctypes.c_float),
                           ("probe_to_e5m2", ctypes.c_ubyte, ctypes.c_float),
                           ("probe_from_e4m3", ctypes.c_float, ctypes.c_ubyte),
                           ("probe_from_e5m2", ctypes.c_float, ctypes.c_ubyte),
                           ("probe_to_fp16", ctypes.c_ushort, ctypes.c_float),
                           ("probe_to_bf16", ctypes.c_ushort, ctypes.c_float),
                           ("probe_from_fp16", ctypes.c_float, ctypes.c_ushort)):
        getattr(so, name).restype = res
        getattr(so, name).argtypes = [arg]
    return arch, so


def _fmt(probe, which):
    arch, so = probe
    dtype = FLAVOURS[arch][0 if which == "e4m3" else 1]
    return dtype, getattr(so, f"probe_to_{which}"), getattr(so, f"probe_from_{which}")


def _same_float(a, b):
    return (a != a and b != b) or (a == b and str(a)[0] == str(b)[0])  # NaN == NaN, sign of zero


@pytest.mark.parametrize("which", ["e4m3", "e5m2"])
def test_all_256_codes_decode_like_torch(probe, which):
    dtype, _, from_bits = _fmt(probe, which)
    want = torch.arange(256, dtype=torch.uint8).view(dtype).float().tolist()
    got = [from_bits(c) for c in range(256)]
    bad = [(c, got[c], want[c]) for c in range(256) if not _same_float(got[c], want[c])]
    assert not bad, f"{dtype}: codes decoded differently (code, emulation, torch): {bad[:8]}"


def _encode_cases(dtype):
    finite = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    finite = torch.unique(finite[torch.isfinite(finite)])  # sorted
    mids = (finite[1:] + finite[:-1]) / 2
    off = torch.cat([mids * (1 + 2.0 ** -12), mids * (1 - 2.0 ** -12)])
    rnd = torch.randn(4000, generator=torch.Generator().manual_seed(7)) * finite.max() / 3
    tiny = torch.randn(500, generator=torch.Generator().manual_seed(8)) * finite[finite > 0].min() * 4
    return torch.cat([finite, mids, off, rnd, tiny])


@pytest.mark.parametrize("which", ["e4m3", "e5m2"])
def test_encode_rounds_and_saturates_like_torch(probe, which):
    dtype, to_bits, _ = _fmt(probe, which)
    xs = _encode_cases(dtype)
    fmax = torch.finfo(dtype).max
    # torch's cast does not saturate; the kernels' conversion does (SATFINITE): clamp first.
    want = xs.clamp(-fmax, fmax).to(dtype).view(torch.uint8).tolist()
    got = [to_bits(float(x)) for x in xs.tolist()]
    bad = [(x, g, w) for x, g, w in zip(xs.tolist(), got, want) if g != w]
    assert not bad, f"{dtype}: {len(bad)} values encoded differently (x, emulation, torch): {bad[:8]}"


@pytest.mark.parametrize("which", ["e4m3", "e5m2"])
def test_special_inputs_follow_the_saturation_rule(probe, which):
    dtype, to_bits, _ = _fmt(probe, which)
    fmax = torch.finfo(dtype).max
    code = lambda v: torch.tensor([v]).to(dtype).view(torch.uint8).item()  # noqa: E731
    assert to_bits(float("inf")) == code(fmax)
    assert to_bits(float("-inf")) == code(-fmax)
    assert to_bits(fmax * 1.5) == code(fmax) and to_bits(-fmax * 1e6) == code(-fmax)
    nan = torch.tensor([to_bits(float("nan"))], dtype=torch.uint8).view(dtype).float()
    assert torch.isnan(nan).all()
    if dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        assert to_bits(float("nan")) == 0x80 and to_bits(-float("nan")) == 0x80
        assert to_bits(-0.0) == 0 and to_bits(-1e-30) == 0  # no negative zero: never NaN
    else:
        assert to_bits(-0.0) == 0x80  # OCP keeps negative zero


def test_fp16_and_bf16_round_like_torch(probe):
    _, so = probe
    xs = torch.cat([torch.randn(5000, generator=torch.Generator().manual_seed(3)) * 100,
                    torch.tensor([0.0, -0.0, 65504.0, 65520.0, 1e-8, -6e-8, float("inf"),
                                  -float("inf"), 3.0e38, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11])])
    want16 = xs.to(torch.float16).view(torch.int16).tolist()
    want_bf = xs.to(torch.bfloat16).view(torch.int16).tolist()
    got16 = [ctypes.c_short(so.probe_to_fp16(x)).value for x in xs.tolist()]
    got_bf = [ctypes.c_short(so.probe_to_bf16(x)).value for x in xs.tolist()]
    assert got16 == want16
    assert got_bf == want_bf
    codes = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    want = codes.view(torch.float16).float().tolist()
    got = [so.probe_from_fp16(c & 0xFFFF) for c in codes.tolist()]
    assert all(_same_float(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("arch_macros", [["-D__gfx1100__", "-D__GFX11__"],
                                         ["-D__gfx1030__", "-D__GFX10__"],
                                         ["-D__gfx1201__", "-D__GFX12__"]])
def test_wave32_targets_are_refused(arch_macros, tmp_path):
    """RDNA runs 32-lane wavefronts: arch.h stops the build with a message naming the problem."""
    src = tmp_path / "unit.cpp"
    src.write_text('#include "util/arch.h"\n')
    flags = [f for f in _flags("gfx942") if not f.startswith("-D__gfx942__")]
    res = subprocess.run([CXX, *flags, *arch_macros, "-fsyntax-only", str(src)],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "wave32 AMD targets" in res.stderr and "64-lane wavefronts" in res.stderr
