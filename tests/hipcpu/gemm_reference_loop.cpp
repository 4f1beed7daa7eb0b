// The GEMM of the emulated AMD build: a reference loop behind csrc/common/gemm/gemm_backend.h.
// rocBLAS and hipBLASLt are not linked into the emulation; nothing here stands for them, and the
// name this backend reports says so in `info` and in every log line.
#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_fp8.h>
#include <hip/hip_runtime.h>

#include <cmath>
#include <vector>

#include "gemm/gemm_backend.h"
#include "transformer_engine/gemm_library.h"
#include "util/error.h"

namespace {

constexpr const char* kBackendName = "reference loop (HIP-on-CPU emulation; no rocBLAS/hipBLASLt)";

#if defined(HIPCPU_GFX950)
constexpr __hip_fp8_interpretation_t kE4M3 = __HIP_E4M3, kE5M2 = __HIP_E5M2;
#else
constexpr __hip_fp8_interpretation_t kE4M3 = __HIP_E4M3_FNUZ, kE5M2 = __HIP_E5M2_FNUZ;
#endif

float load(const void* p, NVTEDType t, int64_t idx) {
  switch (t) {
    case kNVTEFloat32: return static_cast<const float*>(p)[idx];
    case kNVTEFloat16: return float(static_cast<const __half*>(p)[idx]);
    case kNVTEBFloat16: return float(static_cast<const __hip_bfloat16*>(p)[idx]);
    case kNVTEFloat8E4M3:
      return float(hipcpu::decode(hipcpu::fp8_format(kE4M3), static_cast<const uint8_t*>(p)[idx]));
    case kNVTEFloat8E5M2:
      return float(hipcpu::decode(hipcpu::fp8_format(kE5M2), static_cast<const uint8_t*>(p)[idx]));
    default:
      throw te::Error(kNVTEUnsupported, te::concat("the reference GEMM loop has no ",
                                                   nvte_dtype_name(t), " operand path"));
  }
}

void store(void* p, NVTEDType t, int64_t idx, float v) {
  switch (t) {
    case kNVTEFloat32: static_cast<float*>(p)[idx] = v; break;
    case kNVTEFloat16: static_cast<__half*>(p)[idx] = __half(v); break;
    case kNVTEBFloat16: static_cast<__hip_bfloat16*>(p)[idx] = __hip_bfloat16(v); break;
    case kNVTEFloat8E4M3:
      static_cast<uint8_t*>(p)[idx] = __hip_cvt_float_to_fp8(v, __HIP_SATFINITE, kE4M3);
      break;
    case kNVTEFloat8E5M2:
      static_cast<uint8_t*>(p)[idx] = __hip_cvt_float_to_fp8(v, __HIP_SATFINITE, kE5M2);
      break;
    default:
      throw te::Error(kNVTEUnsupported, te::concat("the reference GEMM loop has no ",
                                                   nvte_dtype_name(t), " output path"));
  }
}

}  // namespace

namespace te {
namespace gemm {

const char* backend_name() { return kBackendName; }

void backend_check(const GemmArgs& args) {
  // the loop reads one scale per operand: block scales would be silently ignored
  if (is_block_scaled(args))
    throw Error(kNVTEUnsupported, concat(kBackendName, ": Float8BlockScaling (block-scaled FP8 GEMM) ",
                                         "is not supported; it needs cuBLASLt on sm_90"));
  (void)load;  // every dtype nvte_gemm admits has a path; the loop refuses others when run
  // The layout rule of the AMD FP8 GEMM libraries, kept so that callers see the same refusal.
  if ((is_fp8_type(args.a_type) || is_fp8_type(args.b_type)) && !(args.transa && !args.transb))
    throw Error(kNVTEUnsupported, concat(kBackendName, ": FP8 GEMM needs the TN layout (",
                                         describe_problem(args), ")"));
  if (args.a_type == kNVTEInt32 || args.d_type == kNVTEInt32)
    throw Error(kNVTEUnsupported, concat(kBackendName, ": no int32 GEMM"));
}

void backend_run(const GemmArgs& g) {
  const float sa = is_fp8_type(g.a_type) && g.a_scale_inv ? *g.a_scale_inv : 1.f;
  const float sb = is_fp8_type(g.b_type) && g.b_scale_inv ? *g.b_scale_inv : 1.f;
  std::vector<float> acc(size_t(g.m) * size_t(g.n));
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0.0;
      for (int64_t k = 0; k < g.k; ++k) {
        const float a = load(g.a, g.a_type, g.transa ? k + i * g.lda : i + k * g.lda);
        const float b = load(g.b, g.b_type, g.transb ? j + k * g.ldb : k + j * g.ldb);
        s += double(a) * double(b);
      }
      acc[i + j * g.m] = g.alpha * float(s) * sa * sb;
    }
  if (!is_fp8_type(g.d_type)) {
    const void* c = addend_of(g);
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) {
        float v = acc[i + j * g.m];
        if (g.beta != 0.f) v += g.beta * load(c, g.d_type, i + j * g.ldd);
        store(g.d, g.d_type, i + j * g.ldd, v);
      }
    if (g.epilogue != kNVTEGemmEpilogueNone) run_unfused_epilogue(g, 1.f);
    return;
  }
  // FP8 D: the epilogue runs on a float copy, then the result is scaled, quantised and its amax
  // (of the unscaled values) overwrites *d_amax.
  GemmArgs plain = g;
  plain.d = acc.data();
  plain.d_type = kNVTEFloat32;
  plain.ldd = g.m;
  plain.c = nullptr;
  plain.beta = 0.f;
  plain.d_scale = nullptr;
  plain.d_amax = nullptr;
  if (g.epilogue != kNVTEGemmEpilogueNone) run_unfused_epilogue(plain, 1.f);
  const float scale = g.d_scale ? *g.d_scale : 1.f;
  float amax = 0.f;
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      const float v = acc[i + j * g.m];
      amax = std::isnan(v) || std::fabs(v) > amax ? std::fabs(v) : amax;
      store(g.d, g.d_type, i + j * g.ldd, v * scale);
    }
  if (g.d_amax) *g.d_amax = amax;
}

}  // namespace gemm
}  // namespace te

extern "C" int nvte_rocm_default_hipblaslt(void) { return 1; }
extern "C" const char* nvte_default_gemm_library(void) { return kBackendName; }
// Present only in the emulated build: how the Python side tells it from a ROCm build.
extern "C" const char* nvte_hipcpu_emulation(void) {
#if defined(HIPCPU_GFX950)
  return "emulated on CPU, wave64, gfx950 OCP";
#else
  return "emulated on CPU, wave64, gfx942 FNUZ";
#endif
}
