"""The ROCm build check: proves, without an AMD GPU, that the AMD build of this tree compiles,
links and imports, and that it contains what the NVIDIA build contains.

    python3 -m build_tools.rocm_check [--sysroot DIR] [--build-dir DIR]
                                      [--cuda-lib libtransformer_engine.so | --cuda-symbols FILE]

Steps (each failure is reported by name; the exit status is 1 if any failed):
  build      hipify on the host, hipcc in the Debian sid sysroot (build_tools.rocm_sysroot)
  twins      every csrc/common translation unit has a hipified twin listed in sources.txt
  no-cuda    no hipified file except the portability header names a CUDA runtime/library
             identifier or includes a CUDA header
  hip-macro  __HIP_PLATFORM_AMD__ appears only in csrc/common/util/arch.h and csrc/hip/
  fatbin     every offload bundle in .hip_fatbin has a code object for each requested arch
  kernels    for each kernel family of csrc/common (a folder holding .cu files), the code object
             of every arch has at least one kernel whose name the family's sources define
  needed     the library's NEEDED entries name libamdhip64, librocblas and libhipblaslt
  symbols    the exported nvte_* functions equal those of the CUDA build
  import     the pybind11 module imports in the sysroot; with no GPU the capability query
             says "rocm backend, no device" and `python -m transformer_engine info` runs

The pure functions (sources, twins, identifier scan, kernel families, bundle splitting) are
used by tests/buildsys as well, which run on any machine without the sysroot.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON_DIR = os.path.join(ROOT, "csrc", "common")
SOURCE_EXTS = (".cu", ".cpp")
# The portability header names both vendors inside #if branches; hipify renames it arch_hip.h.
PORTABILITY_HEADERS = ("util/arch.h", "util/arch_hip.h")
REQUIRED_NEEDED = ("libamdhip64", "librocblas", "libhipblaslt")

# ---------------------------------------------------------------------------------------------
# Sources and their hipified twins
# ---------------------------------------------------------------------------------------------


def common_sources(common_dir: str = COMMON_DIR) -> list:
    """Translation units of csrc/common, relative to it."""
    out = []
    for root, _, files in os.walk(common_dir):
        for f in files:
            if f.endswith(SOURCE_EXTS):
                out.append(os.path.relpath(os.path.join(root, f), common_dir))
    return sorted(out)


def twin_candidates(rel: str) -> list:
    """Where hipify puts a source: x.cu -> x.hip; a changed x.cpp -> x_hip.cpp; unchanged: x.cpp."""
    stem, ext = os.path.splitext(rel)
    if ext == ".cu":
        return [stem + ".hip", stem + "_hip.cu", rel]
    return [stem + "_hip" + ext, rel]


def check_twins(common_dir: str, hip_dir: str) -> list:
    """Problems (empty when fine): sources without a hipified twin listed in sources.txt."""
    listing = os.path.join(hip_dir, "sources.txt")
    if not os.path.isfile(listing):
        return [f"{listing} is missing: the hipify stage did not run"]
    with open(listing) as fh:
        listed = {line.strip() for line in fh if line.strip()}
    problems = []
    for rel in common_sources(common_dir):
        found = [c for c in twin_candidates(rel) if c in listed]
        if not found:
            problems.append(f"{rel}: no hipified twin in sources.txt (looked for "
                            f"{', '.join(twin_candidates(rel))})")
        elif not os.path.isfile(os.path.join(hip_dir, found[0])):
            problems.append(f"{rel}: twin {found[0]} is listed but missing from {hip_dir}")
        elif rel.endswith(".cu") and not found[0].endswith(".hip"):
            problems.append(f"{rel}: twin {found[0]} is not a .hip file "
                            "(it would not compile as HIP)")
    for entry in sorted(listed):
        if not os.path.isfile(os.path.join(hip_dir, entry)):
            problems.append(f"sources.txt lists {entry}, which does not exist")
    return problems


# ---------------------------------------------------------------------------------------------
# CUDA identifiers left after hipify
# ---------------------------------------------------------------------------------------------

# Identifiers of the CUDA runtime/driver and NVIDIA libraries. Comments and string literals are
# removed before matching, so prose ("cuBLASLt on NVIDIA") and messages do not count.
CUDA_IDENTIFIER = re.compile(
    r"\b(?:"
    r"cuda[A-Z_]\w*"            # cudaStream_t, cudaGetLastError, cuda_fp8
    r"|CUDA_\w+"                # CUDA_R_8F_E4M3, CUDA_VERSION
    r"|cu(?:blas|blasLt|dnn|rand|sparse|solver|fft)\w*"
    r"|CU(?:BLAS|BLASLT|DNN)_\w+"
    r"|cu[A-Z][a-z]\w*"         # driver API: cuLaunchKernel, cuMemAlloc, cuGetErrorString
    r"|__nv_\w+|__NV_\w+"       # __nv_fp8_e4m3, __nv_bfloat16, __NV_SATFINITE
    r"|nv_bfloat16\w*"
    r")\b")
CUDA_INCLUDE = re.compile(
    r'^\s*#\s*include\s*[<"]\s*((?:cuda|cublas|cudnn|curand|cusparse|cufft|nvrtc|cub/|thrust/|'
    r'nvtx|cooperative_groups|mma\.h|crt/)[^>"]*)[>"]', re.M)


def strip_comments_and_strings(text: str) -> str:
    """C/C++ text with comments and string/char literals blanked (line numbers preserved)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            i = n if j == -1 else j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j == -1 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            # Raw strings (R"(...)") are not used in this tree; plain literals with escapes are.
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cuda_leftovers(text: str) -> list:
    """(line, identifier) pairs of CUDA names in code, plus CUDA headers in #include lines."""
    found = []
    for m in CUDA_INCLUDE.finditer(text):
        found.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    code = strip_comments_and_strings(text)
    # #include lines were handled above (the header name is a string literal to the scanner).
    for lineno, line in enumerate(code.split("\n"), 1):
        if line.lstrip().startswith("#") and "include" in line:
            continue
        for m in CUDA_IDENTIFIER.finditer(line):
            found.append((lineno, m.group(0)))
    return found


def check_no_cuda(hip_dir: str) -> list:
    problems = []
    for root, _, files in os.walk(hip_dir):
        for f in sorted(files):
            path = os.path.join(root, f)
            rel = os.path.relpath(path, hip_dir)
            if rel in PORTABILITY_HEADERS or rel == "sources.txt":
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                hits = cuda_leftovers(fh.read())
            for lineno, ident in hits:
                problems.append(f"{rel}:{lineno}: {ident}")
    return problems


def check_hip_macro(root: str = ROOT) -> list:
    """Files under csrc/ that name __HIP_PLATFORM_AMD__ outside the two allowed places."""
    allowed_file = os.path.join("csrc", "common", "util", "arch.h")
    allowed_dir = os.path.join("csrc", "hip") + os.sep
    problems = []
    for top in ("csrc", os.path.join("tests", "cpp")):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if rel == allowed_file or rel.startswith(allowed_dir):
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        if "__HIP_PLATFORM_AMD__" in line:
                            problems.append(f"{rel}:{lineno}: {line.strip()}")
    return problems


# ---------------------------------------------------------------------------------------------
# Kernel families and kernel names
# ---------------------------------------------------------------------------------------------

_ATTRIBUTE_CALLS = {"__launch_bounds__", "__attribute__", "alignas", "__declspec",
                    "__maxnreg__", "__cluster_dims__"}
_NAME_THEN_PAREN = re.compile(r"([A-Za-z_]\w*)\s*\(")
_LAUNCH = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^;{}]*?>)?\s*<<<")


def _skip_parens(text: str, i: int) -> int:
    """Index just past the parenthesised group that opens at text[i] == '('."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def kernel_names_in_source(text: str) -> set:
    """Names of the __global__ functions a source defines or declares, and of the kernels it
    launches with <<<...>>> (a family may launch kernels templated in a shared header)."""
    code = strip_comments_and_strings(text)
    names = set()
    for m in re.finditer(r"\b__global__\b", code):
        pos = m.end()
        while True:
            nm = _NAME_THEN_PAREN.search(code, pos)
            if nm is None:
                break
            if nm.group(1) in _ATTRIBUTE_CALLS:
                pos = _skip_parens(code, nm.end() - 1)
                continue
            names.add(nm.group(1))
            break
    for m in _LAUNCH.finditer(code):
        names.add(m.group(1))
    names.discard("__global__")
    return names


def kernel_families(common_dir: str = COMMON_DIR) -> dict:
    """{family folder: kernel names its files define or launch}, for every top-level folder of
    csrc/common that holds .cu files (the folder's .cu and .cuh files are read)."""
    families = {}
    for entry in sorted(os.listdir(common_dir)):
        folder = os.path.join(common_dir, entry)
        if not os.path.isdir(folder):
            continue
        files = []
        for dirpath, _, fs in os.walk(folder):
            files += [os.path.join(dirpath, f) for f in fs]
        if not any(f.endswith(".cu") for f in files):
            continue
        names = set()
        for path in files:
            if path.endswith((".cu", ".cuh", ".h")):
                with open(path, encoding="utf-8", errors="replace") as fh:
                    names |= kernel_names_in_source(fh.read())
        families[entry] = names
    return families


def unqualified_function_name(demangled: str) -> str:
    """'void te::(anonymous namespace)::convert_kernel<float, bool>(float const*, long)' ->
    'convert_kernel'."""
    s = demangled.strip()
    # Drop the parameter list: the parenthesised group that closes at the end (after it only
    # qualifiers such as 'const' may follow).
    s = re.sub(r"\s*(const|volatile|&|&&|noexcept)\s*$", "", s)
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            if s[i] == ")":
                depth += 1
            elif s[i] == "(":
                depth -= 1
                if depth == 0:
                    s = s[:i]
                    break
    # Drop trailing template arguments.
    if s.endswith(">"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            if s[i] == ">":
                depth += 1
            elif s[i] == "<":
                depth -= 1
                if depth == 0:
                    s = s[:i]
                    break
    # Last scope component at nesting depth 0 ('(anonymous namespace)' has no '::' inside).
    depth, start = 0, 0
    for i, c in enumerate(s):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif depth == 0 and s.startswith("::", i):
            start = i + 2
        elif depth == 0 and c == " ":
            start = i + 1  # return type or other leading words
    return s[start:]


def match_families(families: dict, kernel_names: list) -> dict:
    """{family: sorted kernel names (unqualified) found in the code object}."""
    present = {}
    for demangled in kernel_names:
        present.setdefault(unqualified_function_name(demangled), []).append(demangled)
    return {fam: sorted(n for n in names if n in present) for fam, names in families.items()}


# ---------------------------------------------------------------------------------------------
# Offload bundles
# ---------------------------------------------------------------------------------------------

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def split_bundles(data: bytes) -> list:
    """The offload bundles concatenated in a .hip_fatbin section (one per translation unit).
    Each bundle: magic, u64 entry count, then per entry u64 offset, u64 size, u64 id length and
    the id; the bundle ends with its last entry. Compressed bundles (CCOB) are kept whole."""
    bundles = []
    pos = data.find(BUNDLE_MAGIC)
    while pos != -1:
        p = pos + len(BUNDLE_MAGIC)
        (count,) = struct.unpack_from("<Q", data, p)
        p += 8
        end = p
        for _ in range(count):
            off, size, id_len = struct.unpack_from("<QQQ", data, p)
            p += 24 + id_len
            end = max(end, pos + off + size, p)
        bundles.append(data[pos:end])
        pos = data.find(BUNDLE_MAGIC, end)
    if not bundles and data.startswith(b"CCOB"):
        bundles.append(data)
    return bundles


def parse_kernel_notes(notes_text: str) -> list:
    """Kernel names (mangled) from `llvm-readelf --notes` of an AMDGPU code object."""
    return re.findall(r"^\s*\.name:\s+(\S+)\s*$", notes_text, re.M)


# ---------------------------------------------------------------------------------------------
# The check, step by step
# ---------------------------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.rows = []  # (step, ok, summary)

    def add(self, step: str, ok: bool, summary: str, details=()) -> bool:
        self.rows.append((step, ok, summary))
        mark = "ok  " if ok else "FAIL"
        print(f"[rocm_check] {mark} {step}: {summary}", flush=True)
        for line in list(details)[:40]:
            print(f"             {line}", flush=True)
        if len(list(details)) > 40:
            print(f"             ... {len(list(details)) - 40} more", flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.rows)

    def summary(self) -> str:
        lines = ["", "ROCm build check summary", "------------------------"]
        for step, ok, text in self.rows:
            lines.append(f"  {'PASS' if ok else 'FAIL'}  {step:10s} {text}")
        lines.append(f"  => {'PASSED' if self.ok else 'FAILED'}")
        return "\n".join(lines)


def declared_c_api(preprocessed: str) -> list:
    """nvte_* functions declared in preprocessed public headers (macros expanded, comments
    gone): every identifier nvte_* followed by '('."""
    return sorted(set(re.findall(r"\b(nvte_\w+)\s*\(", preprocessed)))


def _preprocess_public_headers(root, tools, work: str) -> str:
    """The public C headers, all included once and run through the sysroot's C preprocessor
    (some declare entry points through macros)."""
    inc = os.path.join(COMMON_DIR, "include")
    headers = sorted(f for f in os.listdir(os.path.join(inc, "transformer_engine"))
                     if f.endswith(".h"))
    probe = os.path.join(work, "all_headers.c")
    with open(probe, "w") as fh:
        fh.writelines(f'#include "transformer_engine/{h}"\n' for h in headers)
    return root.run([tools("clang"), "-E", "-P", "-x", "c", "-I", inc, probe],
                    capture=True).stdout


def parse_nvte_exports(nm_output: str) -> list:
    """Defined, exported nvte_* functions from `nm -D --defined-only` output."""
    names = set()
    for line in nm_output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "W") and parts[2].startswith("nvte_"):
            names.add(parts[2].split("@")[0])
    return sorted(names)


def _host_nm(lib: str) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", lib], check=True, text=True,
                          capture_output=True).stdout


def _cuda_symbols(args, report: Report) -> list | None:
    if args.cuda_symbols:
        with open(args.cuda_symbols) as fh:
            return sorted({line.strip() for line in fh if line.strip()})
    lib = args.cuda_lib
    if not lib:
        from .backend import plan_build
        from .native_build import build as native_build
        env = dict(os.environ, NVTE_BACKEND="cuda", NVTE_FRAMEWORK="none")
        try:
            plan = plan_build(env)
        except RuntimeError as exc:
            report.add("symbols", False, f"no CUDA build to compare with: {exc}; "
                       "pass --cuda-lib or --cuda-symbols")
            return None
        t0 = time.time()
        cuda_dir = os.path.join(args.build_dir, "cuda")
        native_build(cuda_dir, plan=plan)
        print(f"[rocm_check] CUDA reference build in {time.time() - t0:.0f} s", flush=True)
        lib = os.path.join(cuda_dir, "libtransformer_engine.so")
    if not shutil.which("nm"):
        report.add("symbols", False, "nm (binutils) is not installed on the host: "
                   "pass --cuda-symbols instead of --cuda-lib")
        return None
    return parse_nvte_exports(_host_nm(lib))


def _stage_package(pkg_root: str, outputs: dict) -> None:
    """A throwaway install: the Python package plus the two built libraries, for the import
    check inside the sysroot (which has neither torch nor the checkout on its path)."""
    shutil.rmtree(pkg_root, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "transformer_engine"),
                    os.path.join(pkg_root, "transformer_engine"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for key in ("library", "module"):
        shutil.copy2(outputs[key], os.path.join(pkg_root, "transformer_engine"))


IMPORT_PROBE = r"""
import sys
import transformer_engine._native as n
from transformer_engine.common import capabilities
count, why = n.device_count()
cap = capabilities.native_device_capability()
lib, lib_why = capabilities.gemm_library()
print(f"build_backend={n.build_backend()} archs={n.build_archs()}")
print(f"device_count={count} reason={why!r}")
print(f"default_hipblaslt={n.default_hipblaslt()} default_gemm_library={n.default_gemm_library()}")
print(f"capability backend={cap.backend} reason={cap.reason!r}")
print(f"gemm_library={lib} ({lib_why})")
assert n.build_backend() == "rocm", n.build_backend()
assert count == 0 and why, (count, why)
assert cap.backend == "reference" and "rocm backend, no device" in cap.reason, cap
"""


def _gemm_choice(root, pkg_root: str, value: str | None) -> str:
    env = {"PYTHONPATH": pkg_root}
    if value is not None:
        env["NVTE_USE_HIPBLASLT"] = value
    code = ("from transformer_engine.common import capabilities as c; "
            "print('%s (%s)' % c.gemm_library())")
    res = root.run(["/usr/bin/python3", "-c", code], cwd=pkg_root, env=env, check=False,
                   capture=True)
    return res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() \
        else f"error: {res.stdout.strip()[-300:]}"


def existing_outputs(build_dir: str) -> dict:
    cmake_dir = os.path.join(build_dir, "cmake")
    lib = os.path.join(cmake_dir, "libtransformer_engine.so")
    mods = [f for f in os.listdir(cmake_dir) if f.startswith("_native.") and f.endswith(".so")] \
        if os.path.isdir(cmake_dir) else []
    if not os.path.isfile(lib) or not mods:
        raise RuntimeError(f"--no-build: no earlier build in {cmake_dir}")
    return {"library": lib, "module": os.path.join(cmake_dir, mods[0]),
            "hipified": os.path.join(build_dir, "hipified", "common"), "cmake_dir": cmake_dir}


class LlvmTools:
    """The LLVM tools of the sysroot's HIP compiler (hipconfig --hipclangpath, e.g.
    /usr/lib/llvm-21/bin), by plain name, so a newer LLVM in sid needs no edit here."""

    def __init__(self, root):
        res = root.run(["hipconfig", "--hipclangpath"], capture=True)
        self.bin_dir = res.stdout.strip().splitlines()[-1]
        # clang-offload-bundler runs llvm-objcopy by its plain name, found only in this folder.
        self.env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin"}

    def __call__(self, tool: str) -> str:
        return os.path.join(self.bin_dir, tool)


def step_hipify(report: Report, hip_dir: str) -> None:
    problems = check_twins(COMMON_DIR, hip_dir)
    report.add("twins", not problems, f"{len(common_sources())} csrc/common translation units, "
               f"{len(problems)} without a hipified twin", problems)
    problems = check_no_cuda(hip_dir)
    report.add("no-cuda", not problems, f"{len(problems)} CUDA identifiers/includes left in "
               "hipified files (portability header excepted)", problems)
    problems = check_hip_macro()
    report.add("hip-macro", not problems, "__HIP_PLATFORM_AMD__ only in util/arch.h and csrc/hip/"
               if not problems else f"{len(problems)} uses outside util/arch.h and csrc/hip/",
               problems)


def step_fatbin(report: Report, root, tools, lib: str, work: str, archs: list) -> dict:
    """Lists every offload bundle of .hip_fatbin; returns {arch: mangled kernel names}."""
    fatbin = os.path.join(work, "hip_fatbin.bin")
    root.run([tools("llvm-objcopy"), f"--dump-section=.hip_fatbin={fatbin}", lib,
              os.path.join(work, "discard.so")])
    with open(fatbin, "rb") as fh:
        bundles = split_bundles(fh.read())
    per_arch = {a: [] for a in archs}
    problems, listed = [], set()
    for i, blob in enumerate(bundles):
        path = os.path.join(work, f"bundle{i}.o")
        with open(path, "wb") as fh:
            fh.write(blob)
        res = root.run([tools("clang-offload-bundler"), "--list", "--type=o", f"--input={path}"],
                       env=tools.env, capture=True, check=False)
        if res.returncode != 0:
            problems.append(f"bundle {i}: clang-offload-bundler --list failed: {res.stdout[-300:]}")
            continue
        targets = res.stdout.split()
        listed.update(targets)
        for arch in archs:
            target = next((t for t in targets if t.endswith(f"--{arch}")), None)
            if target is None:
                problems.append(f"bundle {i}: no code object for {arch} (has {targets})")
                continue
            co = os.path.join(work, f"bundle{i}-{arch}.co")
            root.run([tools("clang-offload-bundler"), "--unbundle", "--type=o",
                      f"--targets={target}", f"--input={path}", f"--output={co}"], env=tools.env)
            notes = root.run([tools("llvm-readelf"), "--notes", co], capture=True).stdout
            per_arch[arch] += parse_kernel_notes(notes)
    gpu_targets = sorted(t.split("--")[-1] for t in listed if t.startswith("hip"))
    report.add("fatbin", bool(bundles) and not problems,
               f".hip_fatbin holds {len(bundles)} offload bundles; "
               f"targets {', '.join(gpu_targets)}",
               problems)
    return per_arch


def step_kernels(report: Report, root, tools, per_arch: dict, archs: list) -> None:
    families = kernel_families()
    problems, lines = [], []
    for arch in archs:
        mangled = sorted(set(per_arch[arch]))
        demangled = root.run([tools("llvm-cxxfilt")] + mangled, capture=True).stdout.splitlines() \
            if mangled else []
        found = match_families(families, demangled)
        for fam, names in sorted(families.items()):
            if not names:
                lines.append(f"{arch} {fam}: defines/launches no kernel in its sources (skipped)")
            elif not found[fam]:
                problems.append(f"{arch} {fam}: none of {sorted(names)} in the code object")
        if arch == archs[0]:
            lines += [f"{fam}: {', '.join(found[fam])}" for fam in sorted(families) if found[fam]]
            lines.append(f"{len(mangled)} kernels in the {arch} code objects")
    report.add("kernels", not problems,
               f"{len(families)} kernel families ({', '.join(sorted(families))}) present for "
               f"{', '.join(archs)}" if not problems else f"{len(problems)} family/arch gaps",
               problems + lines)


def step_needed(report: Report, root, lib: str) -> None:
    dyn = root.run(["readelf", "-d", lib], capture=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    missing = [n for n in REQUIRED_NEEDED if not any(x.startswith(n + ".so") for x in needed)]
    report.add("needed", not missing, "NEEDED: " + ", ".join(needed),
               [f"missing {m}" for m in missing])


def step_symbols(report: Report, root, tools, lib: str, work: str, cuda_syms,
                 out_file: str) -> None:
    rocm_syms = parse_nvte_exports(
        root.run([tools("llvm-nm"), "-D", "--defined-only", lib], capture=True).stdout)
    with open(out_file, "w") as fh:
        fh.write("\n".join(rocm_syms) + "\n")
    declared = declared_c_api(_preprocess_public_headers(root, tools, work))
    details = [f"declared in the headers, not exported by ROCm: {s}"
               for s in sorted(set(declared) - set(rocm_syms))]
    details += [f"exported by ROCm, declared in no header: {s}"
                for s in sorted(set(rocm_syms) - set(declared))]
    if cuda_syms is not None:
        details += [f"only ROCm: {s}" for s in sorted(set(rocm_syms) - set(cuda_syms))]
        details += [f"only CUDA: {s}" for s in sorted(set(cuda_syms) - set(rocm_syms))]
        versus = f"{len(cuda_syms)} by the CUDA build"
    else:
        details.append("no CUDA build to compare with (see above)")
        versus = "no CUDA build"
    report.add("symbols", not details and bool(rocm_syms),
               f"{len(rocm_syms)} nvte_* exported by the ROCm build, {versus}, "
               f"{len(declared)} declared in the headers", details)


def step_import(report: Report, root, outputs: dict, pkg_root: str) -> None:
    _stage_package(pkg_root, outputs)
    env = {"PYTHONPATH": pkg_root}
    res = root.run(["/usr/bin/python3", "-c", IMPORT_PROBE], cwd=pkg_root, env=env,
                   capture=True, check=False)
    details = res.stdout.strip().splitlines()
    info = root.run(["/usr/bin/python3", "-m", "transformer_engine", "info"], cwd=pkg_root,
                    env=env, capture=True, check=False)
    details += ["python -m transformer_engine info:"]
    details += ["  " + line for line in info.stdout.strip().splitlines()]
    choices = {v: _gemm_choice(root, pkg_root, v) for v in (None, "0", "1")}
    details += [f"NVTE_USE_HIPBLASLT={v if v is not None else '<unset>'}: {c}"
                for v, c in choices.items()]
    switch_ok = choices["0"].startswith("rocBLAS") and choices["1"].startswith("hipBLASLt")
    ok = res.returncode == 0 and info.returncode == 0 and switch_ok
    report.add("import", ok, "module imports in the sysroot: rocm backend, no device; "
               "NVTE_USE_HIPBLASLT=0/1 selects rocBLAS/hipBLASLt" if ok else
               f"import probe failed (exit {res.returncode}/{info.returncode})", details)


def run_checks(args) -> Report:
    from .rocm_sysroot import Sysroot, build as sysroot_build

    report = Report()
    archs = [a for a in args.archs.replace(",", ";").split(";") if a]
    t_start = time.time()
    try:
        if args.no_build:
            outputs = existing_outputs(args.build_dir)
        else:
            outputs = sysroot_build(args.sysroot, args.build_dir, ";".join(archs))
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        why = f"exit status {exc.returncode}" if isinstance(exc, subprocess.CalledProcessError) \
            else str(exc)
        report.add("build", False, f"the sysroot build failed ({why}); compiler output above")
        hip_dir = os.path.join(args.build_dir, "hipified", "common")
        if os.path.isfile(os.path.join(hip_dir, "sources.txt")):
            step_hipify(report, hip_dir)  # these need no build, only the hipify stage
        return report
    report.add("build", True,
               f"hipify + hipcc for {';'.join(archs)} in {time.time() - t_start:.0f} s"
               if not args.no_build else "reused the outputs of an earlier build (--no-build)")
    step_hipify(report, outputs["hipified"])
    cuda_syms = _cuda_symbols(args, report)  # built here unless given

    work = os.path.join(args.build_dir, "inspect")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with Sysroot(args.sysroot) as root:
        root.bind(ROOT, read_only=True)  # first: build_dir may lie inside the checkout
        root.bind(args.build_dir, read_only=False)
        tools = LlvmTools(root)
        per_arch = step_fatbin(report, root, tools, outputs["library"], work, archs)
        step_kernels(report, root, tools, per_arch, archs)
        step_needed(report, root, outputs["library"])
        step_symbols(report, root, tools, outputs["library"], work, cuda_syms,
                     os.path.join(args.build_dir, "nvte_symbols_rocm.txt"))
        step_import(report, root, outputs, os.path.join(args.build_dir, "pkg"))
    report.rows.append(("total", report.ok, f"{time.time() - t_start:.0f} s"))
    return report


def main(argv=None) -> int:
    import argparse
    from .rocm_sysroot import DEFAULT_ARCHS, DEFAULT_SYSROOT

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sysroot", default=DEFAULT_SYSROOT)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "rocm"))
    ap.add_argument("--archs", default=DEFAULT_ARCHS)
    ap.add_argument("--cuda-lib", help="libtransformer_engine.so of a CUDA build to compare with")
    ap.add_argument("--cuda-symbols", help="file with the CUDA build's nvte_* names, one a line")
    ap.add_argument("--no-build", action="store_true",
                    help="check the outputs of an earlier build in --build-dir (no rebuild)")
    args = ap.parse_args(argv)
    args.build_dir = os.path.abspath(args.build_dir)
    report = run_checks(args)
    print(report.summary(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
