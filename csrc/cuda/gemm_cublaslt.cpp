// cuBLASLt implementation of the GEMM vendor interface (csrc/common/gemm/gemm_backend.h).
//
// Host cost per call is what makes small GEMMs fast or slow, so everything that depends only on
// the problem's shape/types/layout/epilogue/alignment -- the matmul and layout descriptors and
// the algorithm -- is built once per thread and device and cached (LRU-bounded, plan_cache.h); a
// repeated call sets the data-dependent pointer attributes (plain host writes) and launches.
//
// Algorithm choice: the heuristic's first answer is not always the fastest of its own candidates
// (on an H100, FP8 with fast accumulation at 16384x4096x4096 its sixth candidate ran in 0.36 ms
// against 0.45 ms for the first; torch._scaled_mm without fast accumulation was 4% faster than our
// first choice there). So the first call of a large enough plan that runs outside stream capture
// times the candidates on its own operands and keeps the fastest (tune_plan): a one-time host
// synchronisation per problem, never on the hot path. The choice is the process's (plan_cache.h,
// SharedChoices): another thread's plan of the same key, autograd's backward thread say, takes
// it without timing, so the same product gives the same bits on every thread. Under capture
// nothing is timed (the shared choice, else the heuristic's first, runs, and a later uncaptured
// call tunes the plan); nothing here allocates device memory.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "gemm/gemm_backend.h"
#include "gemm/plan_cache.h"
#include "util/error.h"
#include "util/stream_capture.h"

namespace te {
namespace gemm {
namespace {

// How many candidates to ask the heuristic for. They come ordered by estimated time; the usable
// ones (enough workspace, supported) are kept and timed once per plan (see tune_plan).
constexpr int kHeuristicResults = 8;
// Tuning protocol. Problems under kTuneMinFlops keep the heuristic's choice: their launches are
// microseconds, so host enqueue time, not the kernel, would be timed. Otherwise every candidate
// is timed in kTuneRounds interleaved rounds (so a clock ramp or a thermal drift hits all of them
// alike), each measurement spanning about kTuneBatchMs of launches, and a candidate's score is
// its best round. The heuristic's first choice is replaced only by one at least kTuneMargin
// faster, so that noise alone never trades it away.
constexpr double kTuneMinFlops = 3.0e10;
constexpr int kTuneRounds = 3;
constexpr float kTuneBatchMs = 0.5f;
constexpr int kTuneMaxBatch = 16;
constexpr float kTuneMargin = 0.97f;

// The first cuBLASLt with 1x128 / 128x128 block-scaled FP8 (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
// _BLK128x128_32F), in cublasLtGetVersion()'s encoding; before Blackwell those modes exist on sm_90
// only.
constexpr size_t kBlockScalingMinVersion = 120900;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(status == CUBLAS_STATUS_NOT_SUPPORTED ? kNVTEUnsupported : kNVTEDeviceError,
              concat("cuBLASLt ", what, " failed: ", cublasLtGetStatusName(status), " (",
                     cublasLtGetStatusString(status), ")"));
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(kNVTEDeviceError, concat(what, " failed: ", cudaGetErrorString(err)));
  }
}

cudaDataType_t cuda_type(NVTEDType t) {
  switch (t) {
    case kNVTEFloat32: return CUDA_R_32F;
    case kNVTEFloat16: return CUDA_R_16F;
    case kNVTEBFloat16: return CUDA_R_16BF;
    case kNVTEFloat8E4M3: return CUDA_R_8F_E4M3;
    case kNVTEFloat8E5M2: return CUDA_R_8F_E5M2;
    default: throw Error(kNVTEInvalidArgument, concat("no cuBLASLt type for ", nvte_dtype_name(t)));
  }
}

cublasLtEpilogue_t lt_epilogue(NVTEGemmEpilogue e) {
  switch (e) {
    case kNVTEGemmEpilogueBias: return CUBLASLT_EPILOGUE_BIAS;
    case kNVTEGemmEpilogueGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case kNVTEGemmEpilogueBiasGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case kNVTEGemmEpilogueDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case kNVTEGemmEpilogueDGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case kNVTEGemmEpilogueBGradB: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

int current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

// Per-thread, per-device state. Handles are created on first use and deliberately never
// destroyed: thread-exit destructors can run after the CUDA context is gone, and a handle is a
// small host object.
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  int compute_capability = 0;  // major * 10 + minor
};

DeviceState& device_state(int device) {
  thread_local std::vector<DeviceState> states;
  if (device >= static_cast<int>(states.size())) states.resize(device + 1);
  DeviceState& s = states[device];
  if (s.handle == nullptr) {
    // A thread of the caller's own (not one the framework set up) may have no context current
    // yet: cudaGetDevice and the attribute queries below do not bind one, and cuBLASLt's launch
    // then failed (CUBLAS_STATUS_EXECUTION_FAILED on an H200, a second thread's first GEMM while
    // another thread held a handle). cudaFree(nullptr) binds the device's primary context when
    // none is current and leaves a current one as it is. A capture in global mode (torch's
    // default) refuses that call on every thread, so a thread whose first GEMM is captured could
    // not make its handle: the call runs in relaxed mode, where it is allowed (it captures
    // nothing and, given nullptr, frees nothing).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    const cudaError_t bound = cudaFree(nullptr);
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    check_cuda(bound, "cudaFree(nullptr) (binding the device's context)");
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(major)");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "cudaDeviceGetAttribute(minor)");
    s.compute_capability = major * 10 + minor;
    check_cublas(cublasLtCreate(&s.handle), "cublasLtCreate");
  }
  return s;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(T)),
               "cublasLtMatmulDescSetAttribute");
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(T)),
               "cublasLtMatmulPreferenceSetAttribute");
}

#if CUBLAS_VERSION >= 120900
int32_t lt_scale_mode(NVTEGemmScaleMode m) {
  switch (m) {
    case kNVTEGemmScaleBlock1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case kNVTEGemmScaleBlock128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

void set_block_scale_modes(cublasLtMatmulDesc_t desc, const GemmArgs& g) {
  set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_scale_mode(g.a_scale_mode));
  set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_scale_mode(g.b_scale_mode));
}
#else
void set_block_scale_modes(cublasLtMatmulDesc_t, const GemmArgs&) {
  TE_UNSUPPORTED("Float8BlockScaling needs cuBLASLt >= 12.9 on sm_90; this library was built "
                 "against cuBLAS ", CUBLAS_VERSION);
}
#endif

// cuBLASLt's descriptor types and destroy calls, for the shared plan template (plan_cache.h).
struct CublasLtApi {
  using MatmulDesc = cublasLtMatmulDesc_t;
  using Layout = cublasLtMatrixLayout_t;
  using Algo = cublasLtMatmulAlgo_t;
  static void destroy_desc(MatmulDesc desc) { cublasLtMatmulDescDestroy(desc); }
  static void destroy_layout(Layout layout) { cublasLtMatrixLayoutDestroy(layout); }
};

// Descriptors and algorithm of one cached problem, plus what the one-time tuning needs.
struct Plan : LtMatmulPlan<CublasLtApi> {
  std::vector<cublasLtMatmulAlgo_t> candidates;  // usable heuristic answers, best estimate first
  size_t choice = 0;   // algo is candidates[choice]
  bool tuned = false;  // algo is the fastest candidate as timed (or there was nothing to time)
};

// The C matrix is D itself, or the caller's distinct addend (GemmArgs::c, D's type and layout);
// it is read only when beta != 0. For an FP8 D, cuBLASLt wants a 16-bit C type (the bias's when
// there is one) in a buffer other than D; beta is 0 then, so C is never read (see
// GemmArgs::fp8_out_c).
NVTEDType c_type_of(const GemmArgs& g) {
  if (!is_fp8_type(g.d_type)) return g.d_type;
  return epilogue_uses_bias(g.epilogue) ? g.bias_type : kNVTEBFloat16;
}

const void* c_pointer(const GemmArgs& g) {
  return is_fp8_type(g.d_type) ? g.fp8_out_c : addend_of(g);
}

// Sets the attributes that point at this call's data. Cheap host writes into the descriptor.
void set_data_pointers(const Plan& p, const GemmArgs& g) {
  if (is_fp8_type(g.a_type)) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale_inv);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale_inv);
  }
  if (is_fp8_type(g.d_type)) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, g.d_scale);
    if (g.d_amax != nullptr) set_desc(p.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, g.d_amax);
  }
  if (p.fused && epilogue_uses_bias(g.epilogue))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
  if (p.fused && epilogue_uses_aux(g.epilogue))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.aux));
}

// Builds descriptors for g (with its epilogue fused or not) and asks the heuristic. Returns
// false when cuBLASLt has no algorithm for it.
bool build_plan(Plan& p, const GemmArgs& g, cublasLtHandle_t handle, bool fused) {
  p.release();
  p.fused = fused;
  check_cublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const int32_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (is_fp8_type(g.a_type)) {
    const int8_t fast = g.fast_accum ? 1 : 0;
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
  }
  if (is_block_scaled(g)) set_block_scale_modes(p.desc, g);
  const uint32_t epi = fused ? lt_epilogue(g.epilogue) : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (fused && epilogue_uses_bias(g.epilogue)) {
    const int32_t bias_type = cuda_type(g.bias_type);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
  }
  if (fused && epilogue_uses_aux(g.epilogue)) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_aux);
    if (g.aux_type != g.d_type) {
      const int32_t aux_type = cuda_type(g.aux_type);
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type);
    }
  }
  // Pointer attributes take part in the heuristic's alignment checks, so they are set first.
  set_data_pointers(p, g);

  const uint64_t a_rows = g.transa ? g.k : g.m, a_cols = g.transa ? g.m : g.k;
  const uint64_t b_rows = g.transb ? g.n : g.k, b_cols = g.transb ? g.k : g.n;
  check_cublas(cublasLtMatrixLayoutCreate(&p.a, cuda_type(g.a_type), a_rows, a_cols, g.lda),
               "cublasLtMatrixLayoutCreate(A)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.b, cuda_type(g.b_type), b_rows, b_cols, g.ldb),
               "cublasLtMatrixLayoutCreate(B)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.c, cuda_type(c_type_of(g)), g.m, g.n, g.ldd),
               "cublasLtMatrixLayoutCreate(C)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.d, cuda_type(g.d_type), g.m, g.n, g.ldd),
               "cublasLtMatrixLayoutCreate(D)");

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      pref_guard(pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = g.workspace_size;
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
  const uint32_t align_a = static_cast<uint32_t>(alignment_of(g.a));
  const uint32_t align_b = static_cast<uint32_t>(alignment_of(g.b));
  const uint32_t align_d = static_cast<uint32_t>(alignment_of(g.d));
  // C is D (or an unread scratch C for an FP8 D: D's alignment, as ever) unless the addend is
  // distinct (its alignment is part of the plan key).
  const uint32_t align_c = static_cast<uint32_t>(alignment_of(addend_of(g)));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  if (fused && g.epilogue == kNVTEGemmEpilogueBGradB) {
    // The H100's first BGradB choice for a small fp16 wgrad was 4 ulps off fp32 accumulation
    // (split-K partials summed in the output type, presumably): fp32 partials only.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
  }

  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, p.desc, p.a, p.b, p.c, p.d, pref, kHeuristicResults, results, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  p.candidates.clear();
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws)
      p.candidates.push_back(results[i].algo);
  }
  if (p.candidates.empty()) return false;
  p.algo = p.candidates.front();
  p.tuned = p.candidates.size() == 1;
  return true;
}

// cuBLASLt reads a GELU aux buffer only with a leading dimension divisible by 8.
bool can_fuse(const GemmArgs& g) {
  if (g.epilogue == kNVTEGemmEpilogueNone) return true;
  return !epilogue_uses_aux(g.epilogue) || g.ld_aux % 8 == 0;
}

Plan& plan_for(const GemmArgs& g, int device, cublasLtHandle_t handle) {
  auto build = [handle](Plan& p, const GemmArgs& args, bool fused) {
    return build_plan(p, args, handle, fused);
  };
  auto device_name = [device] { return concat("sm_", device_state(device).compute_capability); };
  return cached_plan<Plan>(g, device, can_fuse(g), build, "cuBLASLt", device_name);
}

cublasStatus_t launch_matmul(cublasLtHandle_t handle, const Plan& p, const GemmArgs& g,
                             const cublasLtMatmulAlgo_t& algo) {
  return cublasLtMatmul(handle, p.desc, &g.alpha, g.a, p.a, g.b, p.b, &g.beta, c_pointer(g), p.c,
                        g.d, p.d,
                        &algo, g.workspace, g.workspace_size,
                        reinterpret_cast<cudaStream_t>(g.stream));
}

// Whether g's problem is large enough to time its candidates (kTuneMinFlops above).
bool worth_timing(const GemmArgs& g) {
  return 2.0 * double(g.m) * double(g.n) * double(g.k) >= kTuneMinFlops;
}

// Times the candidates of p on this call's operands and keeps the fastest (protocol above). Only
// for problems worth timing, calls whose repeated runs are harmless (see repeatable) and a stream
// outside capture. The events are waited on in relaxed capture mode, so that a graph another
// thread captures meanwhile is not invalidated by this (legal, uncaptured) synchronisation. Any
// failure keeps the heuristic's first choice.
void tune_plan(Plan& p, const GemmArgs& g, cublasLtHandle_t handle) {
  p.tuned = true;  // tried once, whatever happens below
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(g.stream);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  const size_t count = p.candidates.size();
  std::vector<float> best_ms(count, -1.f);
  // Launches `reps` times between the events; the elapsed ms per launch, or -1 on failure.
  auto timed = [&](const cublasLtMatmulAlgo_t& algo, int reps) {
    bool ok = cudaEventRecord(start, stream) == cudaSuccess;
    for (int r = 0; ok && r < reps; ++r)
      ok = launch_matmul(handle, p, g, algo) == CUBLAS_STATUS_SUCCESS;
    float ms = 0.f;
    ok = ok && cudaEventRecord(stop, stream) == cudaSuccess &&
         cudaEventSynchronize(stop) == cudaSuccess &&
         cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    return ok ? ms / reps : -1.f;
  };
  if (cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
    // One launch of each candidate loads its kernels (lazy module loading) outside the timings;
    // one that fails is dropped.
    std::vector<bool> usable(count, false);
    for (size_t i = 0; i < count; ++i)
      usable[i] = launch_matmul(handle, p, g, p.candidates[i]) == CUBLAS_STATUS_SUCCESS;
    const float first_ms = usable[0] ? timed(p.candidates[0], 1) : -1.f;
    if (first_ms > 0.f) {
      int batch = static_cast<int>(kTuneBatchMs / first_ms + 0.5f);
      batch = batch < 1 ? 1 : (batch > kTuneMaxBatch ? kTuneMaxBatch : batch);
      for (int round = 0; round < kTuneRounds; ++round) {
        for (size_t i = 0; i < count; ++i) {
          if (!usable[i]) continue;
          const float ms = timed(p.candidates[i], batch);
          if (ms > 0.f && (best_ms[i] < 0.f || ms < best_ms[i])) best_ms[i] = ms;
        }
      }
    }
  }
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  (void)cudaGetLastError();
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (best_ms[0] <= 0.f) return;
  size_t best = 0;
  for (size_t i = 1; i < count; ++i)
    if (best_ms[i] > 0.f && best_ms[i] < best_ms[best]) best = i;
  if (best_ms[best] < kTuneMargin * best_ms[0]) {
    p.choice = best;
    p.algo = p.candidates[best];
  }
}

// Whether running g twice gives what running it once does: D, aux, the bias gradient and the
// FP8 amax are overwritten, never accumulated, so only a read of D as C (beta != 0 with C = D)
// makes a repeat differ. A distinct C is only read, and nvte_gemm_with_c has refused a C that
// shares memory with D or aux.
bool repeatable(const GemmArgs& g) { return g.beta == 0.f || g.c != nullptr; }

// Gives an untuned plan its algorithm: the process's choice for its key when one was made (on
// any thread), else this call's timing (outside capture, for repeatable calls), which becomes
// the process's choice unless another thread's got there first. The choice is shared as an
// index into the heuristic's answers, which a key gets in the same order on every thread (each
// thread asks with its own handle).
void settle_algorithm(Plan& p, const GemmArgs& g, int device, cublasLtHandle_t handle) {
  if (!worth_timing(g)) {  // the heuristic's first choice, on every thread alike: nothing to share
    p.tuned = true;
    return;
  }
  SharedChoices<size_t>& shared = process_choices<size_t>();
  const PlanKey key = plan_key(g, device);
  size_t choice = 0;
  if (shared.find(key, &choice) && choice < p.candidates.size()) {
    p.choice = choice;
    p.algo = p.candidates[choice];
    p.tuned = true;
    return;
  }
  if (!repeatable(g) || stream_capturing(reinterpret_cast<cudaStream_t>(g.stream))) return;
  tune_plan(p, g, handle);
  choice = shared.settle(key, p.choice);
  if (choice < p.candidates.size()) {
    p.choice = choice;
    p.algo = p.candidates[choice];
  }
}

}  // namespace

const char* backend_name() { return "cuBLASLt"; }

void backend_check(const GemmArgs& g) {
  if (!is_fp8_type(g.a_type)) return;
  const int cc = device_state(current_device()).compute_capability;
  if (is_block_scaled(g)) {
    const size_t version = cublasLtGetVersion();
    if (cc != 90 || version < kBlockScalingMinVersion || CUBLAS_VERSION < 120900)
      TE_UNSUPPORTED("Float8BlockScaling needs cuBLASLt >= 12.9 on sm_90 (Hopper); this device "
                     "is sm_", cc, " and the loaded cuBLASLt is version ", version);
  }
  if (cc < 89)
    TE_UNSUPPORTED("FP8 GEMM needs FP8 tensor cores (sm_89 or newer); this device is sm_", cc);
  // Before Blackwell, cuBLASLt's FP8 kernels read both operands K-major: the TN layout only.
  if (cc < 100 && !(g.transa && !g.transb))
    TE_UNSUPPORTED("FP8 GEMM on sm_", cc, " supports only the TN layout (transa=true, ",
                   "transb=false); got ", g.transa ? "T" : "N", g.transb ? "T" : "N",
                   ". Make the transposed FP8 copy with cast_transpose instead");
}

void backend_run(const GemmArgs& g) {
  const int device = current_device();
  cublasLtHandle_t handle = device_state(device).handle;
  Plan& plan = plan_for(g, device, handle);
  set_data_pointers(plan, g);
  if (!plan.tuned) settle_algorithm(plan, g, device, handle);
  check_cublas(launch_matmul(handle, plan, g, plan.algo), "cublasLtMatmul");
  if (!plan.fused) run_unfused_epilogue(g, 1.f);
}

}  // namespace gemm
}  // namespace te
