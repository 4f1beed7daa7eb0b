// Per-tensor scaled casts between high precision and FP8, and amax-only reduction.
//
// One elementwise grid-stride kernel per direction. Each thread handles 16 elements per step so
// that the FP8 side is one 16-byte access and the high-precision side one to four; a scalar tail
// covers sizes that are not multiples of 16 and pointers that are not 16-byte aligned.
#include "transformer_engine/cast.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kElemsPerThread = 16;
constexpr int kThreads = 256;

int grid_for(int64_t n_vec) {
  int64_t blocks = (n_vec + kThreads - 1) / kThreads;
  // Enough blocks to fill any current GPU several times over; the kernels are grid-stride.
  const int64_t cap = 132 * 16;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// Converts (and reduces amax over) elements [begin, end) element by element.
template <typename InT, typename OutT, bool kQuantize>
__device__ float convert_scalar(const InT* in, OutT* out, int64_t begin, int64_t end,
                                int64_t stride, float mul, float amax) {
  for (int64_t i = begin; i < end; i += stride) {
    const float x = to_float(in[i]);
    if (kQuantize) amax = amax_step(amax, x);
    if (out != nullptr) out[i] = from_float<OutT>(x * mul);
  }
  return amax;
}

// out may be null (amax only). mul is scale (quantize) or scale_inv (dequantize).
template <typename InT, typename OutT, bool kQuantize, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
convert_kernel(const InT* __restrict__ in, OutT* __restrict__ out, int64_t n,
               const float* __restrict__ mul_ptr, float* __restrict__ amax_ptr,
               float* __restrict__ scale_inv_ptr) {
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
  const float mul = mul_ptr != nullptr ? *mul_ptr : 1.f;
  if (scale_inv_ptr != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_ptr = 1.f / mul;

  float amax = 0.f;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (kVectorized) {
    const int64_t n_vec = n / kElemsPerThread;
    for (int64_t v = tid; v < n_vec; v += nthreads) {
      Vec<InT, kElemsPerThread> x;
      x.load(in + v * kElemsPerThread);
      Vec<OutT, kElemsPerThread> y;
#pragma unroll
      for (int k = 0; k < kElemsPerThread; ++k) {
        const float f = to_float(x.v[k]);
        if (kQuantize) amax = amax_step(amax, f);
        y.v[k] = from_float<OutT>(f * mul);
      }
      if (out != nullptr) y.store(out + v * kElemsPerThread);
    }
    scalar_begin = n_vec * kElemsPerThread;
  }
  amax = convert_scalar<InT, OutT, kQuantize>(in, out, scalar_begin + tid, n, nthreads, mul, amax);

  if (kQuantize && amax_ptr != nullptr) {
    amax = block_reduce_max(amax, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax_ptr, amax);
  }
}

template <typename InT, typename OutT, bool kQuantize>
void launch_convert(const InT* in, OutT* out, int64_t n, const float* mul, float* amax,
                    float* scale_inv, cudaStream_t stream) {
  const bool vec = aligned16(in) && (out == nullptr || aligned16(out));
  const int grid = grid_for(vec ? n / kElemsPerThread + 1 : n);
  if (vec)
    convert_kernel<InT, OutT, kQuantize, true>
        <<<grid, kThreads, 0, stream>>>(in, out, n, mul, amax, scale_inv);
  else
    convert_kernel<InT, OutT, kQuantize, false>
        <<<grid, kThreads, 0, stream>>>(in, out, n, mul, amax, scale_inv);
  check_launch("convert_kernel");
}

void check_same_numel(const NVTETensor& a, const NVTETensor& b) {
  TE_CHECK_ARG(numel(a) == numel(b), "input shape ", shape_str(a), " and output shape ",
               shape_str(b), " have different element counts");
}

}  // namespace
}  // namespace te

using namespace te;

extern "C" NVTEStatus nvte_quantize(const NVTETensor* input, NVTETensor* output,
                                    NVTEStream stream) {
  return guard("nvte_quantize", [&] {
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_same_numel(*input, *output);
    check_dtype_in(*input, "input", is_high_precision(input->dtype),
                   "float32, float16 or bfloat16");
    check_fp8_scaling(*output, "output", true);
    // An empty tensor still gets its scale_inv written, so its metadata is never stale.
    const int64_t n = numel(*input);
    TE_SWITCH_HP(input->dtype, InT, "input",
      TE_SWITCH_FP8(output->dtype, OutT, "output",
        launch_convert<InT, OutT, true>(static_cast<const InT*>(input->data),
                                        static_cast<OutT*>(output->data), n, output->scale,
                                        output->amax, output->scale_inv, to_stream(stream))));
  });
}

extern "C" NVTEStatus nvte_dequantize(const NVTETensor* input, NVTETensor* output,
                                      NVTEStream stream) {
  return guard("nvte_dequantize", [&] {
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_same_numel(*input, *output);
    TE_CHECK_ARG(input->scale_inv != nullptr, "input (", nvte_dtype_name(input->dtype),
                 ") needs a scale_inv pointer");
    const int64_t n = numel(*input);
    if (n == 0) return;
    TE_SWITCH_FP8(input->dtype, InT, "input",
      TE_SWITCH_HP(output->dtype, OutT, "output",
        launch_convert<InT, OutT, false>(static_cast<const InT*>(input->data),
                                         static_cast<OutT*>(output->data), n, input->scale_inv,
                                         nullptr, nullptr, to_stream(stream))));
  });
}

extern "C" NVTEStatus nvte_compute_amax(const NVTETensor* input, float* amax, NVTEStream stream) {
  return guard("nvte_compute_amax", [&] {
    check_tensor(input, "input");
    TE_CHECK_ARG(amax != nullptr, "amax is a null pointer");
    const int64_t n = numel(*input);
    if (n == 0) return;
    TE_SWITCH_HP(input->dtype, InT, "input",
      launch_convert<InT, fp8e4m3, true>(static_cast<const InT*>(input->data), nullptr, n,
                                         nullptr, amax, nullptr, to_stream(stream)));
  });
}
