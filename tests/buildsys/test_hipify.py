"""The hipify stage and the portability rules, checked on CPU: csrc/common hipified into a
temporary folder must give a HIP twin for every translation unit with no CUDA runtime/library
names left (the portability header excepted), and the vendor macro stays in its two places.
The same functions back the full ROCm build check (.ci/rocm_check.sh)."""
import importlib.util
import os
import re

import pytest

from build_tools import rocm_check
from build_tools.rocm_check import (COMMON_DIR, check_hip_macro, check_no_cuda, check_twins,
                                    common_sources, cuda_leftovers, kernel_families,
                                    kernel_names_in_source, split_bundles,
                                    strip_comments_and_strings, unqualified_function_name)

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="the hipify stage uses torch.utils.hipify (pip install torch)")


@pytest.fixture(scope="module")
def hipified(tmp_path_factory):
    from build_tools.hipify_stage import hipify_tree
    out = str(tmp_path_factory.mktemp("hipified") / "common")
    hipify_tree(COMMON_DIR, out)
    return out


@needs_torch
def test_every_common_source_has_a_hip_twin(hipified):
    assert common_sources(), "csrc/common has no translation units"
    assert check_twins(COMMON_DIR, hipified) == []


@needs_torch
def test_cu_sources_become_hip_files(hipified):
    for rel in common_sources():
        if rel.endswith(".cu"):
            assert os.path.isfile(os.path.join(hipified, rel[:-3] + ".hip")), rel


@needs_torch
def test_no_cuda_identifiers_after_hipify(hipified):
    assert check_no_cuda(hipified) == []


@needs_torch
def test_hipify_leaves_the_source_tree_alone(hipified):
    for dirpath, _, files in os.walk(COMMON_DIR):
        for f in files:
            assert not f.endswith(".hip") and "_hip." not in f, os.path.join(dirpath, f)


def test_hip_platform_macro_only_in_portability_header_and_csrc_hip():
    assert check_hip_macro() == []


def test_no_preprocessor_branch_inside_kernel_bodies():
    """Vendor differences go into helpers (util/arch.h), never into a kernel body."""
    offenders = []
    for dirpath, _, files in os.walk(COMMON_DIR):
        for f in files:
            if not f.endswith((".cu", ".cuh", ".h")):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                code = strip_comments_and_strings(fh.read())
            for body_start, body in _kernel_bodies(code):
                for line in body.splitlines():
                    if re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else)\b", line):
                        lineno = code.count("\n", 0, body_start) + 1
                        offenders.append(f"{os.path.relpath(path, COMMON_DIR)} (kernel at line "
                                         f"{lineno}): {line.strip()}")
    assert offenders == []


def _kernel_bodies(code):
    """(offset, text) of each __global__ function body (definitions only)."""
    for m in re.finditer(r"\b__global__\b", code):
        i = m.end()
        # The body opens at the first '{' after the parameter list; a ';' first is a declaration.
        depth, j = 0, i
        while j < len(code):
            c = code[j]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif depth == 0 and c == ";":
                j = -1
                break
            elif depth == 0 and c == "{":
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        level, k = 0, j
        while k < len(code):
            if code[k] == "{":
                level += 1
            elif code[k] == "}":
                level -= 1
                if level == 0:
                    break
            k += 1
        yield j, code[j:k + 1]


# ----- the scanners themselves -----------------------------------------------------------------

def test_scanner_finds_cuda_names_in_code_but_not_in_prose():
    text = ('#include <cuda_fp8.h>\n'
            '// cuBLASLt on NVIDIA, hipBLASLt on AMD: cudaStream_t is fine in a comment\n'
            'const char* s = "cudaMalloc failed";\n'
            'hipStream_t ok; cudaStream_t bad;\n'
            'auto x = __nv_cvt_float_to_fp8(1.f, __NV_SATFINITE, __NV_E4M3);\n'
            'cublasLtHandle_t h; cuLaunchKernel(f);\n')
    found = {name for _, name in cuda_leftovers(text)}
    assert found == {"cuda_fp8.h", "cudaStream_t", "__nv_cvt_float_to_fp8", "__NV_SATFINITE",
                     "__NV_E4M3", "cublasLtHandle_t", "cuLaunchKernel"}
    assert [line for line, name in cuda_leftovers(text) if name == "cudaStream_t"] == [4]


def test_kernel_names_are_read_from_definitions_and_launches():
    src = """
    template <typename T, int N>
    __global__ void __launch_bounds__(256) scale_kernel(const T* in, T* out) {}
    __global__ __launch_bounds__(128, 2) void
    reduce_kernel(float* p);
    void launch(cudaStream_t s) {
      helper_kernel<float, 4><<<grid, 256, 0, s>>>(a, b);
      other<<<1, 1>>>();
    }
    """
    assert kernel_names_in_source(src) == {"scale_kernel", "reduce_kernel", "helper_kernel",
                                           "other"}


@pytest.mark.parametrize("demangled, name", [
    ("void te::(anonymous namespace)::convert_kernel<float, te::fp8e4m3, true, true>"
     "(float const*, te::fp8e4m3*, long, float const*, float*, float*)", "convert_kernel"),
    ("void te::act::(anonymous namespace)::dbias_reduce_kernel<__hip_bfloat16>(float const*, "
     "__hip_bfloat16*, long, long)", "dbias_reduce_kernel"),
    ("void simple(int)", "simple"),
    ("void ns::k<(anonymous namespace)::Op<2> >(int (*)(int))", "k"),
])
def test_unqualified_function_name(demangled, name):
    assert unqualified_function_name(demangled) == name


def test_every_kernel_family_defines_kernels():
    families = kernel_families()
    assert families, "no csrc/common folder holds .cu files"
    for must in ("cast", "transpose", "recipe"):
        assert must in families and families[must], (must, families.get(must))


def _bundle(entries):
    """An uncompressed clang offload bundle in the documented layout."""
    import struct
    header = rocm_check.BUNDLE_MAGIC + struct.pack("<Q", len(entries))
    size_of_table = sum(24 + len(t) for t, _ in entries)
    offset = len(header) + size_of_table
    table, payload = b"", b""
    for triple, blob in entries:
        table += struct.pack("<QQQ", offset + len(payload), len(blob), len(triple)) + triple
        payload += blob
    return header + table + payload


def test_split_bundles_finds_each_translation_unit():
    a = _bundle([(b"host-x86_64-unknown-linux-gnu-", b""),
                 (b"hipv4-amdgcn-amd-amdhsa--gfx942", b"X" * 100)])
    b = _bundle([(b"hipv4-amdgcn-amd-amdhsa--gfx90a", b"Y" * 10)])
    pad = b"\0" * (4096 - len(a))
    parts = split_bundles(a + pad + b + b"\0" * 17)
    assert parts == [a, b]
