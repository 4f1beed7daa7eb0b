"""The one tolerance table of the test suites, keyed by dtype name so torch and jnp share it.

High precision: kernels vs the plain-framework reference computed in the same dtype. FP8: a
result that went through an FP8 cast, compared with the high-precision reference (one ulp of the
format at the value's magnitude). Quantizers themselves are compared bit for bit, not here.
"""

TOLERANCES = {
    "float32": dict(rtol=1.3e-6, atol=1e-5),
    "float16": dict(rtol=1e-3, atol=1e-5),
    "bfloat16": dict(rtol=1.6e-2, atol=1e-5),
    "float8_e4m3": dict(rtol=0.125, atol=0.0675),
    "float8_e5m2": dict(rtol=0.25, atol=0.125),
}


def dtype_key(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    for fp8 in ("float8_e4m3", "float8_e5m2"):
        if name.startswith(fp8):
            return fp8
    return name


def tols(dtype) -> dict:
    """rtol/atol for results computed in `dtype` (torch or jnp dtype, or its name)."""
    return TOLERANCES[dtype_key(dtype)]
