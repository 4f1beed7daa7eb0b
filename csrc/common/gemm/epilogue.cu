// Portable GEMM epilogues, for what a library cannot fuse: rocBLAS has no epilogues at all,
// cuBLASLt refuses GELU aux buffers whose leading dimension is not a multiple of 8, and an empty
// reduction (k = 0) never reaches a library. Written once, hipified for ROCm.
//
// One 2-D pass over D: each 256-thread block covers 32 consecutive columns (coalesced, since D is
// row-major with m columns) and strides over rows, so the bias-gradient column sums accumulate
// in registers and need one shared-memory step and one atomic per column and block. BGradB's
// column sums of B are the same pass over B in read-only mode.
#include "activation/activation_math.cuh"
#include "gemm/gemm_backend.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace gemm {
namespace {

constexpr int kCols = 32;
constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kCols * kRowsPerBlock;
// GELU is the activation family's own (one definition of the maths for kernels and epilogues).
__device__ __forceinline__ float gelu_tanh(float x) { return act::GeluTanh::value(x); }
__device__ __forceinline__ float dgelu_tanh(float x) { return act::GeluTanh::deriv(x); }

// Element access by run-time dtype: this is a fallback, so one kernel serves every type mix
// instead of an instantiation per (D, bias, aux) triple; the branch is uniform across the grid.
__device__ __forceinline__ float load_as_float(const void* p, NVTEDType t, int64_t i) {
  switch (t) {
    case kNVTEFloat32: return static_cast<const float*>(p)[i];
    case kNVTEFloat16: return to_float(static_cast<const fp16*>(p)[i]);
    case kNVTEBFloat16: return to_float(static_cast<const bf16*>(p)[i]);
    case kNVTEFloat8E4M3: return to_float(static_cast<const fp8e4m3*>(p)[i]);
    default: return to_float(static_cast<const fp8e5m2*>(p)[i]);
  }
}

__device__ __forceinline__ void store_from_float(void* p, NVTEDType t, int64_t i, float v) {
  switch (t) {
    case kNVTEFloat32: static_cast<float*>(p)[i] = v; break;
    case kNVTEFloat16: static_cast<fp16*>(p)[i] = from_float<fp16>(v); break;
    case kNVTEBFloat16: static_cast<bf16*>(p)[i] = from_float<bf16>(v); break;
    case kNVTEFloat8E4M3: static_cast<fp8e4m3*>(p)[i] = from_float<fp8e4m3>(v); break;
    default: static_cast<fp8e5m2*>(p)[i] = from_float<fp8e5m2>(v); break;
  }
}

struct EpilogueParams {
  void* d;
  NVTEDType d_type;
  const void* src;  // where the value before the epilogue is read (D's type): D, or the addend C
  const void* bias;  // added (Bias, BiasGeluAux)
  NVTEDType bias_type;
  void* aux;
  NVTEDType aux_type;
  float* bias_grad_acc;  // fp32 column sums (DGeluBGrad), zeroed beforehand
  int64_t m, n;
  float result_scale;  // 0: the product is zero and D is not read
  bool gelu_forward, gelu_backward, fp8_out;
  bool store;  // false: only sum the columns (BGradB reads B and must not write it)
  const float* d_scale;
  float* d_amax;
};

__global__ void __launch_bounds__(kThreads) epilogue_kernel(EpilogueParams p) {
  __shared__ float col_sums[kRowsPerBlock][kCols];
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
  const int tx = threadIdx.x % kCols, ty = threadIdx.x / kCols;
  const int64_t col = int64_t(blockIdx.x) * kCols + tx;
  const bool active = col < p.m;
  const float scale = (p.fp8_out && p.d_scale != nullptr) ? *p.d_scale : 1.f;
  float col_sum = 0.f, amax = 0.f;
  if (active) {
    const float bias = p.bias != nullptr ? load_as_float(p.bias, p.bias_type, col) : 0.f;
    for (int64_t row = int64_t(blockIdx.y) * kRowsPerBlock + ty; row < p.n;
         row += int64_t(gridDim.y) * kRowsPerBlock) {
      const int64_t idx = row * p.m + col;
      float r = p.result_scale != 0.f ? p.result_scale * load_as_float(p.src, p.d_type, idx) : 0.f;
      r += bias;
      if (p.gelu_forward) {
        store_from_float(p.aux, p.aux_type, idx, r);
        r = gelu_tanh(r);
      }
      if (p.gelu_backward) r *= dgelu_tanh(load_as_float(p.aux, p.aux_type, idx));
      col_sum += r;
      if (p.fp8_out) {
        amax = amax_step(amax, r);
        r *= scale;
      }
      if (p.store) store_from_float(p.d, p.d_type, idx, r);
    }
  }
  if (p.bias_grad_acc != nullptr) {
    col_sums[ty][tx] = col_sum;
    __syncthreads();
    if (ty == 0 && active) {
      float s = 0.f;
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) s += col_sums[r][tx];
      atomicAdd(p.bias_grad_acc + col, s);
    }
  }
  if (p.fp8_out && p.d_amax != nullptr) {
    amax = block_reduce_max(amax, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(p.d_amax, amax);
  }
}

__global__ void store_bias_grad_kernel(const float* acc, void* bias, NVTEDType bias_type,
                                       int64_t m) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < m) store_from_float(bias, bias_type, i, acc[i]);
}

__global__ void finalize_fp8_kernel(float* amax, const float* amax_src, const float* scale,
                                    float* scale_inv) {
  if (amax != nullptr && amax_src != nullptr) *amax = nan_max(*amax, *amax_src);
  if (scale_inv != nullptr) *scale_inv = 1.f / *scale;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(kNVTEDeviceError, concat(what, " failed: ", cudaGetErrorString(err)));
  }
}

}  // namespace

void zero_device(void* ptr, size_t bytes, NVTEStream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(ptr, 0, bytes, to_stream(stream)), "cudaMemsetAsync");
}

namespace {

// fp32 column sums for a bias gradient of `cols` elements: the start of the library workspace,
// zeroed on the stream.
float* bias_grad_scratch(const GemmArgs& g, int64_t cols) {
  const size_t need = size_t(cols) * sizeof(float);
  TE_CHECK_ARG(g.workspace != nullptr && g.workspace_size >= need, "the unfused bias gradient ",
               "of ", describe_problem(g), " needs ", need + kInternalScratchBytes,
               " bytes of workspace; got ", g.workspace_size + kInternalScratchBytes);
  float* acc = static_cast<float*>(g.workspace);
  zero_device(acc, need, g.stream);
  return acc;
}

// One epilogue_kernel pass over the p.n x p.m row-major matrix at p.d.
void launch_pass(const EpilogueParams& p, cudaStream_t stream) {
  const int64_t col_blocks = (p.m + kCols - 1) / kCols;
  const int64_t row_blocks = (p.n + kRowsPerBlock - 1) / kRowsPerBlock;
  // Enough blocks to fill any current GPU a few times over; rows beyond that are strided.
  const int64_t target = 132 * 16;
  int64_t grid_y = target / col_blocks;
  grid_y = grid_y < 1 ? 1 : (grid_y > row_blocks ? row_blocks : grid_y);
  grid_y = grid_y > 65535 ? 65535 : grid_y;
  TE_CHECK_ARG(col_blocks <= 0x7fffffff, "m=", p.m, " is too large for the unfused epilogue");
  dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(grid_y));
  epilogue_kernel<<<grid, kThreads, 0, stream>>>(p);
  check_launch("epilogue_kernel");
}

void store_bias_grad(const float* acc, void* bias, NVTEDType bias_type, int64_t cols,
                     cudaStream_t stream) {
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((cols + threads - 1) / threads);
  store_bias_grad_kernel<<<blocks, threads, 0, stream>>>(acc, bias, bias_type, cols);
  check_launch("store_bias_grad_kernel");
}

// BGradB: D = result_scale * S (only k = 0 leaves something to do: result_scale = beta, S = C),
// and the bias = column sums of B ([k, n] row-major; nvte_gemm admits BGradB only with transb).
void run_bgradb(const GemmArgs& g, float result_scale, const void* src, cudaStream_t stream) {
  if ((result_scale != 1.f || (src != nullptr && src != g.d)) && g.m > 0 && g.n > 0) {
    GemmArgs plain = g;
    plain.epilogue = kNVTEGemmEpilogueNone;
    run_unfused_epilogue(plain, result_scale, src);
  }
  if (g.n == 0) return;
  float* acc = bias_grad_scratch(g, g.n);
  if (g.k > 0) {
    EpilogueParams p{};
    p.d = const_cast<void*>(g.b);
    p.d_type = g.b_type;
    p.src = g.b;
    p.m = g.n;
    p.n = g.k;
    p.result_scale = 1.f;
    p.bias_grad_acc = acc;
    launch_pass(p, stream);
  }
  store_bias_grad(acc, g.bias, g.bias_type, g.n, stream);
}

}  // namespace

void run_unfused_epilogue(const GemmArgs& g, float result_scale, const void* src) {
  cudaStream_t stream = to_stream(g.stream);
  if (g.epilogue == kNVTEGemmEpilogueBGradB) return run_bgradb(g, result_scale, src, stream);
  if (g.m == 0 || g.n == 0) return;
  EpilogueParams p{};
  p.d = g.d;
  p.d_type = g.d_type;
  p.src = src != nullptr ? src : g.d;
  p.bias = epilogue_adds_bias(g.epilogue) ? g.bias : nullptr;
  p.bias_type = g.bias_type;
  p.aux = g.aux;
  p.aux_type = g.aux_type;
  p.m = g.m;
  p.n = g.n;
  p.result_scale = result_scale;
  p.gelu_forward = epilogue_gelu_forward(g.epilogue);
  p.gelu_backward = epilogue_gelu_backward(g.epilogue);
  p.fp8_out = is_fp8_type(g.d_type);
  p.store = true;
  p.d_scale = g.d_scale;
  p.d_amax = g.d_amax;
  const bool bias_grad = g.epilogue == kNVTEGemmEpilogueDGeluBGrad;
  if (bias_grad) p.bias_grad_acc = bias_grad_scratch(g, g.m);
  if (p.fp8_out && p.d_amax != nullptr) zero_device(p.d_amax, sizeof(float), g.stream);
  launch_pass(p, stream);
  if (bias_grad) store_bias_grad(p.bias_grad_acc, g.bias, g.bias_type, g.m, stream);
}

void finalize_fp8_output(float* amax, const float* amax_src, const float* scale, float* scale_inv,
                         NVTEStream stream) {
  if ((amax == nullptr || amax_src == nullptr) && scale_inv == nullptr) return;
  finalize_fp8_kernel<<<1, 1, 0, to_stream(stream)>>>(amax, amax_src, scale, scale_inv);
  check_launch("finalize_fp8_kernel");
}

}  // namespace gemm
}  // namespace te
