// rocBLAS behind the GEMM vendor interface (selected with NVTE_USE_HIPBLASLT=0).
//
// rocblas_gemm_ex multiplies fp32/fp16/bf16 with fp32 accumulation; it has no FP8 path that
// takes per-tensor scales and no epilogues, so FP8 is refused with a pointer to hipBLASLt and
// the epilogues run in the portable kernel after the GEMM (on D = alpha op(A) op(B) + beta C, so
// C comes before the bias and the activation, as in cuBLASLt's fused epilogues). rocblas_gemm_ex
// takes C and D separately: C is the distinct addend (GemmArgs::c) when there is one, else D.
// The caller's workspace is handed to rocBLAS (rocblas_set_workspace), which stops it from
// allocating device memory itself -- that allocation would break stream capture and the
// no-allocation rule of the core.
#include <hip/hip_runtime.h>
#include <rocblas/rocblas.h>

#include <climits>
#include <vector>

#include "hip_gemm_backends.h"
#include "util/error.h"

namespace te {
namespace gemm {
namespace {

void check_rocblas(rocblas_status status, const char* what) {
  if (status == rocblas_status_success) return;
  throw Error(status == rocblas_status_not_implemented ? kNVTEUnsupported : kNVTEDeviceError,
              concat("rocBLAS ", what, " failed: ", rocblas_status_to_string(status)));
}

void check_hip(hipError_t err, const char* what) {
  if (err != hipSuccess) {
    (void)hipGetLastError();
    throw Error(kNVTEDeviceError, concat(what, " failed: ", hipGetErrorString(err)));
  }
}

rocblas_datatype rocblas_type(NVTEDType t) {
  switch (t) {
    case kNVTEFloat32: return rocblas_datatype_f32_r;
    case kNVTEFloat16: return rocblas_datatype_f16_r;
    case kNVTEBFloat16: return rocblas_datatype_bf16_r;
    default:
      throw Error(kNVTEUnsupported, concat("rocBLAS GEMM has no ", nvte_dtype_name(t), " path"));
  }
}

// One handle per device and thread, created on first use and kept (see gemm_cublaslt.cpp for
// why handles are not destroyed at thread exit). The workspace last given to the handle is
// remembered so that it is set again only when the caller passes a different one.
struct HandleState {
  rocblas_handle handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;
};

HandleState& handle_for_current_device() {
  int device = 0;
  check_hip(hipGetDevice(&device), "hipGetDevice");
  thread_local std::vector<HandleState> states;
  if (device >= static_cast<int>(states.size())) states.resize(device + 1);
  HandleState& s = states[device];
  if (s.handle == nullptr) check_rocblas(rocblas_create_handle(&s.handle), "rocblas_create_handle");
  return s;
}

bool fits_int32(int64_t v) { return v >= 0 && v <= INT_MAX; }

}  // namespace

void rocblas_check(const GemmArgs& g) {
  if (is_block_scaled(g))
    TE_UNSUPPORTED("Float8BlockScaling (block-scaled FP8 GEMM) is not supported by rocBLAS; it "
                   "needs cuBLASLt >= 12.9 on sm_90");
  if (is_fp8_type(g.a_type) || is_fp8_type(g.d_type))
    TE_UNSUPPORTED("FP8 GEMM (", describe_problem(g), ") is not supported by rocBLAS; set "
                   "NVTE_USE_HIPBLASLT=1 to use hipBLASLt");
  if (!(fits_int32(g.m) && fits_int32(g.n) && fits_int32(g.k) && fits_int32(g.lda) &&
        fits_int32(g.ldb) && fits_int32(g.ldd)))
    TE_UNSUPPORTED("rocBLAS takes 32-bit sizes; ", describe_problem(g),
                   " is too large (set NVTE_USE_HIPBLASLT=1 to use hipBLASLt)");
}

void rocblas_run(const GemmArgs& g) {
  // Without a workspace of the caller's, rocBLAS allocates its own device memory on first use,
  // which a graph capture must never see: refuse there instead (the caller's workspace, when
  // given, is handed to the handle below and rocBLAS allocates nothing).
  if (g.workspace == nullptr || g.workspace_size == 0) {
    hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
    if (hipStreamIsCapturing(reinterpret_cast<hipStream_t>(g.stream), &capture) == hipSuccess &&
        capture != hipStreamCaptureStatusNone)
      TE_UNSUPPORTED("rocBLAS GEMM (", describe_problem(g), ") under graph capture needs the "
                     "caller's workspace: pass workspace and workspace_size (rocBLAS would "
                     "allocate device memory during the capture)");
    (void)hipGetLastError();
  }
  HandleState& s = handle_for_current_device();
  check_rocblas(rocblas_set_stream(s.handle, reinterpret_cast<hipStream_t>(g.stream)),
                "rocblas_set_stream");
  if (s.workspace != g.workspace || s.workspace_size != g.workspace_size) {
    check_rocblas(rocblas_set_workspace(s.handle, g.workspace, g.workspace_size),
                  "rocblas_set_workspace");
    s.workspace = g.workspace;
    s.workspace_size = g.workspace_size;
  }
  const rocblas_datatype ab = rocblas_type(g.a_type), d = rocblas_type(g.d_type);
  check_rocblas(
      rocblas_gemm_ex(s.handle, g.transa ? rocblas_operation_transpose : rocblas_operation_none,
                      g.transb ? rocblas_operation_transpose : rocblas_operation_none,
                      static_cast<rocblas_int>(g.m), static_cast<rocblas_int>(g.n),
                      static_cast<rocblas_int>(g.k), &g.alpha, g.a, ab,
                      static_cast<rocblas_int>(g.lda), g.b, ab, static_cast<rocblas_int>(g.ldb),
                      &g.beta, addend_of(g), d, static_cast<rocblas_int>(g.ldd), g.d, d,
                      static_cast<rocblas_int>(g.ldd), rocblas_datatype_f32_r,
                      rocblas_gemm_algo_standard, 0, rocblas_gemm_flags_none),
      "rocblas_gemm_ex");
  // Bias, GELU and the bias gradient, on the product now in D.
  if (g.epilogue != kNVTEGemmEpilogueNone) run_unfused_epilogue(g, 1.f);
}

}  // namespace gemm
}  // namespace te
