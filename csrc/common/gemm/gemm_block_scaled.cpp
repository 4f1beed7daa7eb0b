// nvte_gemm_block_scaled: validation of a block-scaled FP8 GEMM (Float8BlockScaling) and dispatch
// to the vendor library through the same interface as nvte_gemm (gemm_backend.h), with the
// operands' scale modes set. The library decides whether it can serve it (backend_check).
#include "gemm/gemm_backend.h"
#include "transformer_engine/gemm.h"
#include "util/error.h"
#include "util/tensor.h"

namespace te {
namespace gemm {
namespace {

void check_scale_mode(NVTEGemmScaleMode m, const char* what) {
  TE_CHECK_ARG(m == kNVTEGemmScaleTensor || m == kNVTEGemmScaleBlock1x128 ||
                   m == kNVTEGemmScaleBlock128x128,
               what, " has invalid value ", static_cast<int>(m));
}

void check_fp8_operand(const NVTETensor& t, const char* what) {
  TE_CHECK_ARG(is_fp8(t.dtype), what, " has dtype ", nvte_dtype_name(t.dtype),
               "; expected float8_e4m3 or float8_e5m2");
  TE_CHECK_ARG(t.scale_inv != nullptr, what, " needs a scale_inv pointer (its scales)");
  TE_CHECK_ARG(aligned16(t.data), what, "'s data must be 16-byte aligned");
}

}  // namespace
}  // namespace gemm
}  // namespace te

using namespace te;
using namespace te::gemm;

extern "C" NVTEStatus nvte_gemm_block_scaled(const NVTETensor* A, NVTEGemmScaleMode a_scale_mode,
                                             const NVTETensor* B, NVTEGemmScaleMode b_scale_mode,
                                             NVTETensor* D, const NVTETensor* bias,
                                             void* workspace, size_t workspace_size,
                                             NVTEStream stream) {
  return guard("nvte_gemm_block_scaled", [&] {
    check_tensor(A, "A");
    check_tensor(B, "B");
    check_tensor(D, "D");
    check_scale_mode(a_scale_mode, "a_scale_mode");
    check_scale_mode(b_scale_mode, "b_scale_mode");
    check_fp8_operand(*A, "A");
    check_fp8_operand(*B, "B");
    TE_CHECK_ARG(!(A->dtype == kNVTEFloat8E5M2 && B->dtype == kNVTEFloat8E5M2),
                 "A and B are both float8_e5m2; at most one operand may be E5M2");
    TE_CHECK_ARG(!(a_scale_mode == kNVTEGemmScaleBlock128x128 &&
                   b_scale_mode == kNVTEGemmScaleBlock128x128),
                 "a_scale_mode and b_scale_mode are both Block128x128; one operand must use "
                 "Block1x128 or Tensor");
    check_dtype_in(*D, "D", is_high_precision(D->dtype), "float32, bfloat16 or float16");
    int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0, d_rows = 0, d_cols = 0;
    as_2d(*A, &a_rows, &a_cols);
    as_2d(*B, &b_rows, &b_cols);
    as_2d(*D, &d_rows, &d_cols);
    // TN: A [m, k], B [n, k], D [n, m], row-major (see the top of gemm.h).
    TE_CHECK_ARG(a_cols == b_cols, "A ", shape_str(*A), " and B ", shape_str(*B),
                 " disagree on the reduction dimension (their last)");
    TE_CHECK_ARG(d_rows == b_rows && d_cols == a_rows, "D has shape ", shape_str(*D),
                 "; expected [", b_rows, ", ", a_rows, "] (B @ A^T)");
    GemmArgs g;
    g.transa = true;
    g.transb = false;
    g.m = a_rows;
    g.n = b_rows;
    g.k = a_cols;
    TE_CHECK_ARG(g.m % 16 == 0 && g.n % 16 == 0 && g.k % 16 == 0, "FP8 needs m, n and k to be ",
                 "multiples of 16; got m=", g.m, " n=", g.n, " k=", g.k);
    g.a = A->data;
    g.a_type = A->dtype;
    g.lda = g.k > 0 ? g.k : 1;
    g.b = B->data;
    g.b_type = B->dtype;
    g.ldb = g.lda;
    g.d = D->data;
    g.d_type = D->dtype;
    g.ldd = g.m > 0 ? g.m : 1;
    g.a_scale_inv = A->scale_inv;
    g.b_scale_inv = B->scale_inv;
    g.a_scale_mode = a_scale_mode;
    g.b_scale_mode = b_scale_mode;
    g.fast_accum = false;  // block scaling accumulates in full precision
    g.stream = stream;
    if (bias != nullptr && bias->data != nullptr) {
      check_tensor(bias, "bias");
      TE_CHECK_ARG(bias->dtype == D->dtype && numel(*bias) == g.m, "bias has dtype ",
                   nvte_dtype_name(bias->dtype), " and shape ", shape_str(*bias), "; expected ",
                   nvte_dtype_name(D->dtype), " [", g.m, "]");
      g.epilogue = kNVTEGemmEpilogueBias;
      g.bias = bias->data;
      g.bias_type = bias->dtype;
    }
    TE_CHECK_ARG(workspace != nullptr || workspace_size == 0,
                 "workspace is null but workspace_size is ", workspace_size);
    TE_CHECK_ARG(workspace == nullptr || alignment_of(workspace) >= 256,
                 "workspace must be 256-byte aligned");
    if (workspace_size >= kInternalScratchBytes) {
      g.workspace = static_cast<char*>(workspace) + kInternalScratchBytes;
      g.workspace_size = workspace_size - kInternalScratchBytes;
    }
    backend_check(g);
    if (g.m == 0 || g.n == 0) return;
    if (g.k == 0) {
      run_unfused_epilogue(g, 0.f);
      return;
    }
    backend_run(g);
  });
}
