// The vendor interface behind nvte_gemm. csrc/common/gemm/gemm.cpp validates the request and
// turns it into GemmArgs (the column-major BLAS view, see transformer_engine/gemm.h); a vendor
// file implements backend_check/backend_run with its library (csrc/cuda: cuBLASLt; csrc/hip:
// hipBLASLt or rocBLAS, chosen per call). What a library cannot fuse it may hand to the portable
// epilogue kernels declared below.
//
// This header is vendor-neutral on purpose: the ROCm build hipifies csrc/common, and csrc/hip
// includes this file from the hipified tree under the same name, so it must not change there.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "transformer_engine/gemm.h"

namespace te {
namespace gemm {

// The first bytes of the caller's workspace stay with the dispatch layer (the FP8 output's amax
// slot, folded into D.amax after the GEMM); the library gets the 256-byte aligned rest.
constexpr size_t kInternalScratchBytes = 256;
// Offered to the libraries. Their fastest large-GEMM kernels on Hopper / MI300 (split-K and
// stream-K variants) need scratch; 32 MiB is what PyTorch gives cuBLAS on Hopper, so with it the
// heuristics can choose what torch.matmul and torch._scaled_mm get.
constexpr size_t kLibraryWorkspaceBytes = size_t(32) << 20;

// One GEMM in the column-major view, already validated. Leading dimensions are in elements.
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  const void* a = nullptr;
  NVTEDType a_type = kNVTEFloat32;
  int64_t lda = 1;
  const float* a_scale_inv = nullptr;  // FP8 A only
  const void* b = nullptr;
  NVTEDType b_type = kNVTEFloat32;
  int64_t ldb = 1;
  const float* b_scale_inv = nullptr;  // FP8 B only
  void* d = nullptr;                   // also C when beta != 0 and c is null
  NVTEDType d_type = kNVTEFloat32;
  int64_t ldd = 1;
  // The addend C when it is a buffer other than D (nvte_gemm_with_c): D's type, shape and leading
  // dimension, high-precision D only, never overlapping D. Read when beta != 0. Null: C is D.
  const void* c = nullptr;
  const float* d_scale = nullptr;  // FP8 D only
  float* d_amax = nullptr;         // FP8 D only: the library *overwrites* it (null: not wanted)
  // FP8 D only: what to pass as C. The libraries refuse C == D when C's type differs from D's
  // (an FP8 D takes a 16-bit C); beta is 0 then, so this distinct pointer is never read.
  const void* fp8_out_c = nullptr;
  void* bias = nullptr;            // input for Bias*, output for DGeluBGrad and BGradB
  NVTEDType bias_type = kNVTEFloat32;
  void* aux = nullptr;  // GELU pre-activation: output for *GeluAux, input for DGelu*
  NVTEDType aux_type = kNVTEFloat32;
  int64_t ld_aux = 1;
  NVTEGemmEpilogue epilogue = kNVTEGemmEpilogueNone;
  float alpha = 1.f, beta = 0.f;
  bool fast_accum = false;
  // How a_scale_inv / b_scale_inv are read (nvte_gemm_block_scaled; Tensor: one float).
  NVTEGemmScaleMode a_scale_mode = kNVTEGemmScaleTensor, b_scale_mode = kNVTEGemmScaleTensor;
  void* workspace = nullptr;  // the library's part of the caller's workspace
  size_t workspace_size = 0;
  NVTEStream stream = nullptr;
};

inline bool is_block_scaled(const GemmArgs& g) {
  return g.a_scale_mode != kNVTEGemmScaleTensor || g.b_scale_mode != kNVTEGemmScaleTensor;
}
inline bool is_fp8_type(NVTEDType t) { return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2; }
inline bool epilogue_adds_bias(NVTEGemmEpilogue e) {
  return e == kNVTEGemmEpilogueBias || e == kNVTEGemmEpilogueBiasGeluAux;
}
inline bool epilogue_gelu_forward(NVTEGemmEpilogue e) {
  return e == kNVTEGemmEpilogueGeluAux || e == kNVTEGemmEpilogueBiasGeluAux;
}
inline bool epilogue_gelu_backward(NVTEGemmEpilogue e) {
  return e == kNVTEGemmEpilogueDGelu || e == kNVTEGemmEpilogueDGeluBGrad;
}
inline bool epilogue_uses_aux(NVTEGemmEpilogue e) {
  return epilogue_gelu_forward(e) || epilogue_gelu_backward(e);
}
// The epilogues that write a bias gradient (the bias tensor is their output).
inline bool epilogue_writes_bias_grad(NVTEGemmEpilogue e) {
  return e == kNVTEGemmEpilogueDGeluBGrad || e == kNVTEGemmEpilogueBGradB;
}
inline bool epilogue_uses_bias(NVTEGemmEpilogue e) {
  return epilogue_adds_bias(e) || epilogue_writes_bias_grad(e);
}
// Elements of the bias vector: D's columns (m), or op(B)'s columns (n) for BGradB.
inline int64_t bias_length(const GemmArgs& g) {
  return g.epilogue == kNVTEGemmEpilogueBGradB ? g.n : g.m;
}
const char* epilogue_name(NVTEGemmEpilogue e);

// Largest power of two (at most 256) dividing the address: the libraries choose kernels by the
// operands' alignment, so it is part of what a cached algorithm choice depends on.
inline int64_t alignment_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  int64_t a = 1;
  while (a < 256 && (v & uintptr_t(a)) == 0) a <<= 1;
  return a;
}

// What the library reads as C for a high-precision D: the distinct addend, else D itself.
inline const void* addend_of(const GemmArgs& g) { return g.c != nullptr ? g.c : g.d; }

// Human-readable problem description for error messages ("bfloat16 x bfloat16 -> float32, TN,
// m=.. n=.. k=.., epilogue BiasGeluAux").
const char* describe_problem(const GemmArgs& args);

// ---- implemented once per vendor build (csrc/cuda or csrc/hip) -------------------------------
// Name of the library that serves the next call on this thread ("cuBLASLt", "hipBLASLt", ...).
const char* backend_name();
// Throws kNVTEUnsupported for a valid request the library or device cannot serve. Called for
// every request, empty ones included, so the answer does not depend on the shape.
void backend_check(const GemmArgs& args);
// Runs the GEMM and its epilogue on args.stream (m, n, k > 0). No host synchronisation.
void backend_run(const GemmArgs& args);

// ---- portable kernels (csrc/common/gemm/epilogue.cu) -----------------------------------------
// Applies args.epilogue in place for a library that computed only the plain product: the value
// before the epilogue is `result_scale * S` with S = src (null: D, which holds
// alpha op(A) op(B) + beta C), or 0 when result_scale == 0 (S is then not read). The k = 0 case
// passes result_scale = beta and src = args.c (null when C is D). Writes aux / the bias gradient
// as the fused epilogues do, quantises an FP8 D with d_scale and overwrites *d_amax. BGradB sums
// B's columns (B is read, never written). A bias gradient needs 4 * bias_length(args) bytes of
// args.workspace.
void run_unfused_epilogue(const GemmArgs& args, float result_scale, const void* src = nullptr);
// amax[0] = max(amax[0], amax_src[0]) and scale_inv[0] = 1 / scale[0]; null pointers skip a part.
void finalize_fp8_output(float* amax, const float* amax_src, const float* scale, float* scale_inv,
                         NVTEStream stream);
// Zeroes bytes of device memory on the stream.
void zero_device(void* ptr, size_t bytes, NVTEStream stream);

}  // namespace gemm
}  // namespace te
