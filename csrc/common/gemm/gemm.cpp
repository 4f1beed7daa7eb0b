// nvte_gemm: argument validation and dispatch to the vendor library (gemm_backend.h). Every rule
// that does not depend on the library lives here, so both vendors refuse the same requests with
// the same messages.
#include <string>

#include "gemm/gemm_backend.h"
#include "transformer_engine/gemm.h"
#include "util/error.h"
#include "util/tensor.h"

namespace te {
namespace gemm {

const char* epilogue_name(NVTEGemmEpilogue e) {
  switch (e) {
    case kNVTEGemmEpilogueNone: return "None";
    case kNVTEGemmEpilogueBias: return "Bias";
    case kNVTEGemmEpilogueGeluAux: return "GeluAux";
    case kNVTEGemmEpilogueBiasGeluAux: return "BiasGeluAux";
    case kNVTEGemmEpilogueDGelu: return "DGelu";
    case kNVTEGemmEpilogueDGeluBGrad: return "DGeluBGrad";
    case kNVTEGemmEpilogueBGradB: return "BGradB";
    default: return "invalid";
  }
}

const char* describe_problem(const GemmArgs& a) {
  thread_local std::string text;
  text = concat(nvte_dtype_name(a.a_type), " x ", nvte_dtype_name(a.b_type), " -> ",
                nvte_dtype_name(a.d_type), ", layout ", a.transa ? "T" : "N", a.transb ? "T" : "N",
                ", m=", a.m, " n=", a.n, " k=", a.k, ", epilogue ", epilogue_name(a.epilogue),
                is_block_scaled(a) ? ", block-scaled (1x128 / 128x128 scales)" : "");
  return text.c_str();
}

namespace {

struct Rows2d {
  int64_t rows, cols;
};

Rows2d view_2d(const NVTETensor& t) {
  Rows2d v{};
  as_2d(t, &v.rows, &v.cols);
  return v;
}

// FP8 operand pairs the libraries multiply (E5M2 x E5M2 has no kernels anywhere).
void check_operand_types(const NVTETensor& A, const NVTETensor& B) {
  const bool a8 = is_fp8(A.dtype), b8 = is_fp8(B.dtype);
  check_dtype_in(A, "A", a8 || is_high_precision(A.dtype),
                 "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
  check_dtype_in(B, "B", b8 || is_high_precision(B.dtype),
                 "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
  TE_CHECK_ARG(a8 == b8, "A (", nvte_dtype_name(A.dtype), ") and B (", nvte_dtype_name(B.dtype),
               ") must both be FP8 or both high precision");
  if (!a8) {
    TE_CHECK_ARG(A.dtype == B.dtype, "A (", nvte_dtype_name(A.dtype), ") and B (",
                 nvte_dtype_name(B.dtype), ") must have the same dtype");
    return;
  }
  if (A.dtype == kNVTEFloat8E5M2 && B.dtype == kNVTEFloat8E5M2)
    TE_UNSUPPORTED("float8_e5m2 x float8_e5m2 has no GEMM kernels; quantize one operand to "
                   "float8_e4m3 (E4M3 x E5M2 and E5M2 x E4M3 are supported)");
  TE_CHECK_ARG(A.scale_inv != nullptr, "A (", nvte_dtype_name(A.dtype),
               ") needs a scale_inv pointer");
  TE_CHECK_ARG(B.scale_inv != nullptr, "B (", nvte_dtype_name(B.dtype),
               ") needs a scale_inv pointer");
}

void check_output_type(const NVTETensor& A, const NVTETensor& D) {
  if (is_fp8(A.dtype)) {
    check_dtype_in(D, "D", is_high_precision(D.dtype) || is_fp8(D.dtype),
                   "float32, bfloat16, float16, float8_e4m3 or float8_e5m2 for FP8 inputs");
    if (is_fp8(D.dtype))
      TE_CHECK_ARG(D.scale != nullptr, "D (", nvte_dtype_name(D.dtype), ") needs a scale pointer");
  } else {
    TE_CHECK_ARG(D.dtype == A.dtype || D.dtype == kNVTEFloat32, "D has dtype ",
                 nvte_dtype_name(D.dtype), "; expected ", nvte_dtype_name(A.dtype),
                 " (the inputs' dtype) or float32");
  }
}

// Bias and aux follow D's dtype; an FP8 D takes them in 16-bit (the libraries' rule).
void check_epilogue_tensors(const GemmArgs& g, NVTETensor* bias, NVTETensor* aux) {
  const NVTEGemmEpilogue e = g.epilogue;
  const bool d8 = is_fp8(g.d_type);
  if (e == kNVTEGemmEpilogueBGradB) {
    // The portable fallback sums B's rows (row-major [k, n]); FP8 data would need its scale.
    if (!g.transb)
      TE_UNSUPPORTED("epilogue BGradB sums op(B) over k only for a transposed B (layout NT, the ",
                     "wgrad layout); got layout ", g.transa ? "T" : "N", "N");
    if (is_fp8(g.b_type))
      TE_UNSUPPORTED("epilogue BGradB takes high-precision operands; an FP8 output gradient ",
                     "gets its bias gradient from nvte_cast_transpose_dbias");
  }
  if (epilogue_uses_bias(e)) {
    const char* what = epilogue_writes_bias_grad(e) ? "bias (the bias gradient output)" : "bias";
    TE_CHECK_ARG(bias != nullptr, what, " is required by epilogue ", epilogue_name(e));
    check_tensor(bias, what);
    TE_CHECK_ARG(numel(*bias) == bias_length(g), what, " has shape ", shape_str(*bias),
                 "; expected ", bias_length(g), " elements (",
                 e == kNVTEGemmEpilogueBGradB ? "op(B)'s columns" : "D's last dimension", ")");
    if (d8)
      check_dtype_in(*bias, what, bias->dtype == kNVTEBFloat16 || bias->dtype == kNVTEFloat16,
                     "bfloat16 or float16 for an FP8 D");
    else
      TE_CHECK_ARG(bias->dtype == g.d_type, what, " has dtype ", nvte_dtype_name(bias->dtype),
                   "; expected ", nvte_dtype_name(g.d_type), " like D");
  }
  if (epilogue_uses_aux(e)) {
    const char* what = epilogue_gelu_forward(e) ? "aux (the GELU input output)"
                                                : "aux (the saved GELU input)";
    TE_CHECK_ARG(aux != nullptr, what, " is required by epilogue ", epilogue_name(e));
    check_tensor(aux, what);
    int64_t rows = 0, cols = 0;
    as_2d(*aux, &rows, &cols);
    TE_CHECK_ARG(rows == g.n && cols == g.m, what, " has shape ", shape_str(*aux),
                 "; expected D's shape [", g.n, ", ", g.m, "]");
    if (d8)
      check_dtype_in(*aux, what, aux->dtype == kNVTEBFloat16 || aux->dtype == kNVTEFloat16,
                     "bfloat16 or float16 for an FP8 D");
    else
      TE_CHECK_ARG(aux->dtype == g.d_type, what, " has dtype ", nvte_dtype_name(aux->dtype),
                   "; expected ", nvte_dtype_name(g.d_type), " like D");
  }
}

void check_fp8_shape(const GemmArgs& g) {
  TE_CHECK_ARG(g.m % 16 == 0 && g.n % 16 == 0 && g.k % 16 == 0,
               "FP8 GEMM needs m, n and k to be multiples of 16; got m=", g.m, " n=", g.n,
               " k=", g.k, " (pad the token dimension or use a high-precision GEMM)");
  TE_CHECK_ARG(aligned16(g.a) && aligned16(g.b) && aligned16(g.d),
               "FP8 GEMM needs 16-byte aligned A, B and D data pointers");
  TE_CHECK_ARG(aligned16(g.c), "FP8 GEMM needs a 16-byte aligned C data pointer (like A, B and D)");
}

bool overlap(const void* p, size_t p_bytes, const void* q, size_t q_bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return p_bytes > 0 && q_bytes > 0 && a < b + q_bytes && b < a + p_bytes;
}

// The addend C of nvte_gemm_with_c. Returns the pointer GemmArgs::c takes: null when C is D
// (the same buffer: nvte_gemm's accumulation), else C's data.
const void* check_addend(const NVTETensor* C, const NVTETensor& D, const GemmArgs& g) {
  if (C == nullptr) return nullptr;
  check_tensor(C, "C");
  const bool same = C->data == D.data;
  TE_CHECK_ARG(same || !is_fp8(D.dtype), "C (an addend distinct from D) needs a high-precision D; ",
               "D is ", nvte_dtype_name(D.dtype), " (pass C = NULL or C == D with beta = 0)");
  int64_t rows = 0, cols = 0;
  as_2d(*C, &rows, &cols);
  TE_CHECK_ARG(rows == g.n && cols == g.m, "C has shape ", shape_str(*C), "; expected D's shape [",
               g.n, ", ", g.m, "]");
  TE_CHECK_ARG(C->dtype == D.dtype, "C has dtype ", nvte_dtype_name(C->dtype), "; expected ",
               nvte_dtype_name(D.dtype), " like D");
  if (same || g.m == 0 || g.n == 0) return nullptr;
  // Repeated runs (cuBLASLt times its candidates on the call's own operands) and split kernels
  // must not see C change under them: it may not share memory with what the GEMM writes.
  const size_t bytes = size_t(g.m) * size_t(g.n) * nvte_dtype_size(D.dtype);
  TE_CHECK_ARG(!overlap(C->data, bytes, D.data, bytes), "C overlaps D at another address; pass ",
               "C == D to accumulate in place, or a separate buffer");
  return C->data;
}

// A distinct C must not share memory with the GELU epilogues' aux output either (aux validated).
void check_addend_vs_aux(const GemmArgs& g, const NVTETensor* aux) {
  if (g.c == nullptr || !epilogue_gelu_forward(g.epilogue)) return;
  const size_t bytes = size_t(g.m) * size_t(g.n) * nvte_dtype_size(g.d_type);
  TE_CHECK_ARG(!overlap(g.c, bytes, aux->data, size_t(numel(*aux)) * nvte_dtype_size(aux->dtype)),
               "C overlaps aux (the GELU input output); pass a separate buffer");
}

}  // namespace
}  // namespace gemm
}  // namespace te

using namespace te;
using namespace te::gemm;

extern "C" size_t nvte_gemm_workspace_size(void) {
  return kInternalScratchBytes + kLibraryWorkspaceBytes;
}

namespace {

// nvte_gemm and nvte_gemm_with_c: `op` names the entry point in error messages; C null means C
// is D.
NVTEStatus gemm_entry(const char* op, const NVTETensor* A, bool transa, const NVTETensor* B,
                      bool transb, const NVTETensor* C, NVTETensor* D, NVTETensor* bias,
                      NVTETensor* aux, NVTEGemmEpilogue epilogue, float alpha, float beta,
                      bool use_fast_accum, void* workspace, size_t workspace_size,
                      NVTEStream stream) {
  return guard(op, [&] {
    check_tensor(A, "A");
    check_tensor(B, "B");
    check_tensor(D, "D");
    TE_CHECK_ARG(epilogue >= 0 && epilogue < kNVTENumGemmEpilogues, "epilogue has invalid value ",
                 static_cast<int>(epilogue));
    check_operand_types(*A, *B);
    check_output_type(*A, *D);

    // Row-major [rows, cols] is the column-major cols x rows matrix (see gemm.h).
    const Rows2d a = view_2d(*A), b = view_2d(*B), d = view_2d(*D);
    GemmArgs g;
    g.transa = transa;
    g.transb = transb;
    g.m = transa ? a.rows : a.cols;
    g.k = transa ? a.cols : a.rows;
    g.n = transb ? b.cols : b.rows;
    const int64_t k_of_b = transb ? b.rows : b.cols;
    TE_CHECK_ARG(k_of_b == g.k, "A ", shape_str(*A), (transa ? " (transposed)" : ""), " and B ",
                 shape_str(*B), (transb ? " (transposed)" : ""),
                 " disagree on the reduction dimension: k=", g.k, " from A, ", k_of_b, " from B");
    TE_CHECK_ARG(d.rows == g.n && d.cols == g.m, "D has shape ", shape_str(*D), "; expected [",
                 g.n, ", ", g.m, "] (row-major op(B) @ op(A))");
    g.a = A->data;
    g.a_type = A->dtype;
    g.lda = a.cols > 0 ? a.cols : 1;
    g.b = B->data;
    g.b_type = B->dtype;
    g.ldb = b.cols > 0 ? b.cols : 1;
    g.d = D->data;
    g.d_type = D->dtype;
    g.ldd = d.cols > 0 ? d.cols : 1;
    const bool fp8_in = is_fp8(A->dtype), fp8_out = is_fp8(D->dtype);
    if (fp8_in) {
      g.a_scale_inv = A->scale_inv;
      g.b_scale_inv = B->scale_inv;
      g.fast_accum = use_fast_accum;
    }
    if (fp8_out) g.d_scale = D->scale;
    g.epilogue = epilogue;
    g.alpha = alpha;
    g.beta = beta;
    g.stream = stream;
    g.c = check_addend(C, *D, g);
    TE_CHECK_ARG(!(beta != 0.f && fp8_out), "beta=", beta, " accumulates into D, which needs a ",
                 "high-precision D; D is ", nvte_dtype_name(D->dtype));
    check_epilogue_tensors(g, bias, aux);
    check_addend_vs_aux(g, aux);
    if (epilogue_uses_bias(epilogue)) {
      g.bias = bias->data;
      g.bias_type = bias->dtype;
    }
    if (epilogue_uses_aux(epilogue)) {
      g.aux = aux->data;
      g.aux_type = aux->dtype;
      g.ld_aux = g.ldd;
    }
    if (fp8_in) check_fp8_shape(g);

    // Workspace: [0, 256) for this layer, the rest for the library.
    TE_CHECK_ARG(workspace != nullptr || workspace_size == 0,
                 "workspace is null but workspace_size is ", workspace_size);
    TE_CHECK_ARG(workspace == nullptr || alignment_of(workspace) >= 256,
                 "workspace must be 256-byte aligned");
    float* amax_scratch = nullptr;
    if (workspace_size >= kInternalScratchBytes) {
      amax_scratch = static_cast<float*>(workspace);
      g.workspace = static_cast<char*>(workspace) + kInternalScratchBytes;
      g.workspace_size = workspace_size - kInternalScratchBytes;
    }
    if (fp8_out && amax_scratch != nullptr) g.fp8_out_c = static_cast<char*>(workspace) + 128;
    if (fp8_out && D->amax != nullptr) {
      TE_CHECK_ARG(amax_scratch != nullptr, "an FP8 D with an amax needs a workspace of at least ",
                   kInternalScratchBytes, " bytes; got ", workspace_size);
      g.d_amax = amax_scratch;
    }

    backend_check(g);

    if (g.m == 0 || g.n == 0) {
      // Nothing to multiply; a bias gradient over zero rows of D is zero, while BGradB's sums
      // of B do not depend on D.
      if (epilogue == kNVTEGemmEpilogueDGeluBGrad && g.m > 0)
        zero_device(g.bias, size_t(g.m) * nvte_dtype_size(g.bias_type), stream);
      if (epilogue == kNVTEGemmEpilogueBGradB) run_unfused_epilogue(g, 1.f);
    } else if (g.k == 0) {
      // An empty reduction: D = epilogue(beta * C). The libraries reject k = 0.
      run_unfused_epilogue(g, beta, g.c);
    } else {
      backend_run(g);
    }
    if (fp8_out && (D->amax != nullptr || D->scale_inv != nullptr)) {
      const bool computed = g.d_amax != nullptr && g.m > 0 && g.n > 0;
      finalize_fp8_output(D->amax, computed ? g.d_amax : nullptr, D->scale, D->scale_inv, stream);
    }
  });
}

}  // namespace

extern "C" NVTEStatus nvte_gemm(const NVTETensor* A, bool transa, const NVTETensor* B, bool transb,
                                NVTETensor* D, NVTETensor* bias, NVTETensor* aux,
                                NVTEGemmEpilogue epilogue, float alpha, float beta,
                                bool use_fast_accum, void* workspace, size_t workspace_size,
                                NVTEStream stream) {
  return gemm_entry("nvte_gemm", A, transa, B, transb, nullptr, D, bias, aux, epilogue, alpha,
                    beta, use_fast_accum, workspace, workspace_size, stream);
}

extern "C" NVTEStatus nvte_gemm_with_c(const NVTETensor* A, bool transa, const NVTETensor* B,
                                       bool transb, const NVTETensor* C, NVTETensor* D,
                                       NVTETensor* bias, NVTETensor* aux,
                                       NVTEGemmEpilogue epilogue, float alpha, float beta,
                                       bool use_fast_accum, void* workspace,
                                       size_t workspace_size, NVTEStream stream) {
  return gemm_entry("nvte_gemm_with_c", A, transa, B, transb, C, D, bias, aux, epilogue, alpha,
                    beta, use_fast_accum, workspace, workspace_size, stream);
}
