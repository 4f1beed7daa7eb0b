"""The compute-sanitizer log summary of .ci/gpu_verify.sh: a finding counts as ours when the
kernel it names is in the library's namespace, or, without a kernel, when a host frame is."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _summary():
    spec = importlib.util.spec_from_file_location("sanitizer_summary",
                                                  os.path.join(ROOT, ".ci", "sanitizer_summary.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOG = """========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in block.
=========     at cudnn_generated_fort_native_sdpa_sm90_flash_bprop_kernel0+0x3cf0
=========     by thread (32,0,0) in block (4,0,0)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: te::attention::vendor_backward(te::attention::AttnArgs const&) [0x28afc6] in libtransformer_engine.so
=========
========= Invalid __shared__ write of size 4 bytes
=========     at void te::attention::portable_fwd<128>(te::attention::Params)+0x1a0
=========     by thread (1,0,0) in block (0,0,0)
=========
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpyAsync.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: te::cast::run(te::cast::Args const&) [0x1234] in libtransformer_engine.so
=========
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMalloc.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: at::native::empty_cuda [0x99] in libtorch_cuda.so
=========
========= ERROR SUMMARY: 4 errors
"""


def test_cudnn_kernel_launched_by_us_is_not_ours(tmp_path):
    path = tmp_path / "sanitize_synccheck_cpp.log"
    path.write_text(LOG)
    ours, others, summary = _summary().summarize(str(path))
    # ours: the portable kernel's race and the API error in our host code
    assert ours == 2
    assert sum(others.values()) == 2
    assert any("cudnn_generated" in where for where in others)
    assert summary == ["ERROR SUMMARY: 4 errors"]


def test_unfinished_log_fails(tmp_path):
    path = tmp_path / "sanitize_memcheck_py.log"
    path.write_text("========= COMPUTE-SANITIZER\n")
    assert _summary().main([str(path)]) == 1
