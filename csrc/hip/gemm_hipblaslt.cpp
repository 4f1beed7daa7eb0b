// hipBLASLt behind the GEMM vendor interface (NVTE_USE_HIPBLASLT=1, the usual ROCm default).
//
// Same structure as csrc/cuda/gemm_cublaslt.cpp: descriptors and the heuristic's algorithm are
// cached per thread, device and problem (LRU-bounded, plan_cache.h; the heuristic's first
// answer is used, no timing of candidates), a repeated call only sets the data pointers and
// launches, nothing synchronises or allocates. Differences from cuBLASLt:
//  - FP8 encodings follow the device: FNUZ (HIP_R_8F_E4M3_FNUZ / E5M2_FNUZ) on gfx940-942
//    (MI300), OCP (HIP_R_8F_E4M3 / E5M2) on gfx950 and later; gfx90a has no FP8. The arch is
//    read at run time from gcnArchName, since one binary serves every arch it was built for.
//  - hipBLASLt has no fast-accumulation switch (the flag is ignored) and no alignment
//    preferences (it checks pointers itself).
//  - An FP8 D is given C = D with D's layout (beta is 0, so C is not read). A high-precision D
//    takes the caller's distinct addend (GemmArgs::c) as C when there is one, with D's layout.
#include <hip/hip_runtime.h>
#include <hipblaslt/hipblaslt.h>

#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "gemm/plan_cache.h"
#include "hip_gemm_backends.h"
#include "util/error.h"

namespace te {
namespace gemm {
namespace {

constexpr int kHeuristicResults = 8;  // the first usable one is taken, as on cuBLASLt

const char* status_name(hipblasStatus_t s) {
  switch (s) {
    case HIPBLAS_STATUS_SUCCESS: return "HIPBLAS_STATUS_SUCCESS";
    case HIPBLAS_STATUS_NOT_INITIALIZED: return "HIPBLAS_STATUS_NOT_INITIALIZED";
    case HIPBLAS_STATUS_ALLOC_FAILED: return "HIPBLAS_STATUS_ALLOC_FAILED";
    case HIPBLAS_STATUS_INVALID_VALUE: return "HIPBLAS_STATUS_INVALID_VALUE";
    case HIPBLAS_STATUS_MAPPING_ERROR: return "HIPBLAS_STATUS_MAPPING_ERROR";
    case HIPBLAS_STATUS_EXECUTION_FAILED: return "HIPBLAS_STATUS_EXECUTION_FAILED";
    case HIPBLAS_STATUS_INTERNAL_ERROR: return "HIPBLAS_STATUS_INTERNAL_ERROR";
    case HIPBLAS_STATUS_NOT_SUPPORTED: return "HIPBLAS_STATUS_NOT_SUPPORTED";
    case HIPBLAS_STATUS_ARCH_MISMATCH: return "HIPBLAS_STATUS_ARCH_MISMATCH";
    case HIPBLAS_STATUS_INVALID_ENUM: return "HIPBLAS_STATUS_INVALID_ENUM";
    default: return "HIPBLAS_STATUS_UNKNOWN";
  }
}

void check_hipblaslt(hipblasStatus_t status, const char* what) {
  if (status == HIPBLAS_STATUS_SUCCESS) return;
  throw Error(status == HIPBLAS_STATUS_NOT_SUPPORTED ? kNVTEUnsupported : kNVTEDeviceError,
              concat("hipBLASLt ", what, " failed: ", status_name(status)));
}

void check_hip(hipError_t err, const char* what) {
  if (err != hipSuccess) {
    (void)hipGetLastError();
    throw Error(kNVTEDeviceError, concat(what, " failed: ", hipGetErrorString(err)));
  }
}

enum class Fp8Kind { kNone, kFnuz, kOcp };

// Per-thread, per-device state: the handle (created on first use, never destroyed: see
// gemm_cublaslt.cpp) and the device's FP8 encoding.
struct DeviceState {
  hipblasLtHandle_t handle = nullptr;
  Fp8Kind fp8 = Fp8Kind::kNone;
  char arch[64] = {0};
};

int current_device() {
  int device = 0;
  check_hip(hipGetDevice(&device), "hipGetDevice");
  return device;
}

DeviceState& device_state(int device) {
  thread_local std::vector<DeviceState> states;
  if (device >= static_cast<int>(states.size())) states.resize(device + 1);
  DeviceState& s = states[device];
  if (s.handle == nullptr) {
    hipDeviceProp_t prop;
    check_hip(hipGetDeviceProperties(&prop, device), "hipGetDeviceProperties");
    std::strncpy(s.arch, prop.gcnArchName, sizeof(s.arch) - 1);
    if (char* colon = std::strchr(s.arch, ':')) *colon = '\0';  // "gfx942:sramecc+:xnack-"
    const bool mi300 = std::strncmp(s.arch, "gfx940", 6) == 0 ||
                       std::strncmp(s.arch, "gfx941", 6) == 0 ||
                       std::strncmp(s.arch, "gfx942", 6) == 0;
    const bool no_fp8 = std::strncmp(s.arch, "gfx90", 5) == 0 || std::strncmp(s.arch, "gfx10", 5) == 0 ||
                        std::strncmp(s.arch, "gfx11", 5) == 0;
    s.fp8 = mi300 ? Fp8Kind::kFnuz : (no_fp8 ? Fp8Kind::kNone : Fp8Kind::kOcp);
    check_hipblaslt(hipblasLtCreate(&s.handle), "hipblasLtCreate");
  }
  return s;
}

hipDataType hip_type(NVTEDType t, Fp8Kind fp8) {
  switch (t) {
    case kNVTEFloat32: return HIP_R_32F;
    case kNVTEFloat16: return HIP_R_16F;
    case kNVTEBFloat16: return HIP_R_16BF;
    case kNVTEFloat8E4M3: return fp8 == Fp8Kind::kFnuz ? HIP_R_8F_E4M3_FNUZ : HIP_R_8F_E4M3;
    case kNVTEFloat8E5M2: return fp8 == Fp8Kind::kFnuz ? HIP_R_8F_E5M2_FNUZ : HIP_R_8F_E5M2;
    default:
      throw Error(kNVTEInvalidArgument, concat("no hipBLASLt type for ", nvte_dtype_name(t)));
  }
}

hipblasLtEpilogue_t lt_epilogue(NVTEGemmEpilogue e) {
  switch (e) {
    case kNVTEGemmEpilogueBias: return HIPBLASLT_EPILOGUE_BIAS;
    case kNVTEGemmEpilogueGeluAux: return HIPBLASLT_EPILOGUE_GELU_AUX;
    case kNVTEGemmEpilogueBiasGeluAux: return HIPBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case kNVTEGemmEpilogueDGelu: return HIPBLASLT_EPILOGUE_DGELU;
    case kNVTEGemmEpilogueDGeluBGrad: return HIPBLASLT_EPILOGUE_DGELU_BGRAD;
    case kNVTEGemmEpilogueBGradB: return HIPBLASLT_EPILOGUE_BGRADB;
    default: return HIPBLASLT_EPILOGUE_DEFAULT;
  }
}

template <typename T>
void set_desc(hipblasLtMatmulDesc_t desc, hipblasLtMatmulDescAttributes_t attr, const T& value) {
  check_hipblaslt(hipblasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(T)),
                  "hipblasLtMatmulDescSetAttribute");
}

// hipBLASLt's descriptor types and destroy calls, for the shared plan template (plan_cache.h).
struct HipblasLtApi {
  using MatmulDesc = hipblasLtMatmulDesc_t;
  using Layout = hipblasLtMatrixLayout_t;
  using Algo = hipblasLtMatmulAlgo_t;
  static void destroy_desc(MatmulDesc desc) { hipblasLtMatmulDescDestroy(desc); }
  static void destroy_layout(Layout layout) { hipblasLtMatrixLayoutDestroy(layout); }
};

using Plan = LtMatmulPlan<HipblasLtApi>;

void set_data_pointers(const Plan& p, const GemmArgs& g) {
  if (is_fp8_type(g.a_type)) {
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.a_scale_inv));
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.b_scale_inv));
  }
  if (is_fp8_type(g.d_type)) {
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(g.d_scale));
    if (g.d_amax != nullptr)
      set_desc(p.desc, HIPBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(g.d_amax));
  }
  if (p.fused && epilogue_uses_bias(g.epilogue))
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(g.bias));
  if (p.fused && epilogue_uses_aux(g.epilogue))
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(g.aux));
}

bool build_plan(Plan& p, const GemmArgs& g, const DeviceState& dev, bool fused) {
  p.release();
  p.fused = fused;
  check_hipblaslt(hipblasLtMatmulDescCreate(&p.desc, HIPBLAS_COMPUTE_32F, HIP_R_32F),
                  "hipblasLtMatmulDescCreate");
  const int32_t ta = g.transa ? HIPBLAS_OP_T : HIPBLAS_OP_N;
  const int32_t tb = g.transb ? HIPBLAS_OP_T : HIPBLAS_OP_N;
  set_desc(p.desc, HIPBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(p.desc, HIPBLASLT_MATMUL_DESC_TRANSB, tb);
  const uint32_t epi = fused ? lt_epilogue(g.epilogue) : HIPBLASLT_EPILOGUE_DEFAULT;
  set_desc(p.desc, HIPBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (fused && epilogue_uses_bias(g.epilogue)) {
    const int32_t bias_type = hip_type(g.bias_type, dev.fp8);
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  if (fused && epilogue_uses_aux(g.epilogue)) {
    set_desc(p.desc, HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_aux);
    if (g.aux_type != g.d_type) {
      const int32_t aux_type = hip_type(g.aux_type, dev.fp8);
      set_desc(p.desc, HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
    }
  }
  set_data_pointers(p, g);

  const uint64_t a_rows = g.transa ? g.k : g.m, a_cols = g.transa ? g.m : g.k;
  const uint64_t b_rows = g.transb ? g.n : g.k, b_cols = g.transb ? g.k : g.n;
  const hipDataType d_type = hip_type(g.d_type, dev.fp8);
  check_hipblaslt(hipblasLtMatrixLayoutCreate(&p.a, hip_type(g.a_type, dev.fp8), a_rows, a_cols, g.lda),
                  "hipblasLtMatrixLayoutCreate(A)");
  check_hipblaslt(hipblasLtMatrixLayoutCreate(&p.b, hip_type(g.b_type, dev.fp8), b_rows, b_cols, g.ldb),
                  "hipblasLtMatrixLayoutCreate(B)");
  check_hipblaslt(hipblasLtMatrixLayoutCreate(&p.c, d_type, g.m, g.n, g.ldd),
                  "hipblasLtMatrixLayoutCreate(C)");
  check_hipblaslt(hipblasLtMatrixLayoutCreate(&p.d, d_type, g.m, g.n, g.ldd),
                  "hipblasLtMatrixLayoutCreate(D)");

  hipblasLtMatmulPreference_t pref = nullptr;
  check_hipblaslt(hipblasLtMatmulPreferenceCreate(&pref), "hipblasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer<hipblasLtMatmulPreference_t>::type,
                  hipblasStatus_t (*)(hipblasLtMatmulPreference_t)>
      pref_guard(pref, hipblasLtMatmulPreferenceDestroy);
  const uint64_t ws = g.workspace_size;
  check_hipblaslt(hipblasLtMatmulPreferenceSetAttribute(pref, HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &ws, sizeof(ws)),
                  "hipblasLtMatmulPreferenceSetAttribute");

  hipblasLtMatmulHeuristicResult_t results[kHeuristicResults];
  int found = 0;
  const hipblasStatus_t status = hipblasLtMatmulAlgoGetHeuristic(
      dev.handle, p.desc, p.a, p.b, p.c, p.d, pref, kHeuristicResults, results, &found);
  if (status == HIPBLAS_STATUS_NOT_SUPPORTED) return false;
  check_hipblaslt(status, "hipblasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < found; ++i) {
    if (results[i].state == HIPBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws) {
      p.algo = results[i].algo;
      return true;
    }
  }
  return false;
}

const Plan& plan_for(const GemmArgs& g, int device, const DeviceState& dev) {
  auto build = [&dev](Plan& p, const GemmArgs& args, bool fused) {
    return build_plan(p, args, dev, fused);
  };
  auto device_name = [&dev] { return dev.arch; };
  return cached_plan<Plan>(g, device, /*try_fused=*/true, build, "hipBLASLt", device_name);
}

}  // namespace

void hipblaslt_check(const GemmArgs& g) {
  if (is_block_scaled(g))
    TE_UNSUPPORTED("Float8BlockScaling (block-scaled FP8 GEMM) is not supported by hipBLASLt "
                   "here; it needs cuBLASLt >= 12.9 on sm_90");
  if (!is_fp8_type(g.a_type) && !is_fp8_type(g.d_type)) return;
  const DeviceState& dev = device_state(current_device());
  if (dev.fp8 == Fp8Kind::kNone)
    TE_UNSUPPORTED("FP8 GEMM needs gfx942 (MI300) or gfx950 (MI350); this device is ", dev.arch);
}

void hipblaslt_run(const GemmArgs& g) {
  const int device = current_device();
  const DeviceState& dev = device_state(device);
  const Plan& plan = plan_for(g, device, dev);
  set_data_pointers(plan, g);
  check_hipblaslt(hipblasLtMatmul(dev.handle, plan.desc, &g.alpha, g.a, plan.a, g.b, plan.b,
                                  &g.beta, addend_of(g), plan.c, g.d, plan.d, &plan.algo,
                                  g.workspace, g.workspace_size,
                                  reinterpret_cast<hipStream_t>(g.stream)),
                  "hipblasLtMatmul");
  if (!plan.fused) run_unfused_epilogue(g, 1.f);
}

}  // namespace gemm
}  // namespace te
