// Float8CurrentScaling's scales of several tensors in one launch (see recipe.h): each block maxes
// |x| over its share of one tensor into that tensor's amax accumulator, then counts itself done;
// the block that counts last computes every scale, as the delayed-scaling update does with a
// one-row history (a non-finite amax keeps the scale and, when counted, adds one to skipped[i]),
// and leaves accumulators and counter at zero for the next launch.
//
// Why one launch: the separate path (nvte_compute_amax per tensor, then the update) costs three
// launches for a Linear's input and weight, and on a small, host-bound step each launch costs
// more host time than its kernel.
#include <cmath>

#include "transformer_engine/recipe.h"
#include "util/device_utils.cuh"
#include "recipe/current_scaling.h"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kMaxTensors = 4;
constexpr int kThreads = 256;
constexpr int kElemsPerThread = 16;  // one 16-byte access of a 16-bit input per step
constexpr int64_t kMaxBlocksPerTensor = 132 * 4;  // a few waves of a large GPU; grid-stride

struct ScalesTable {
  const void* data[kMaxTensors];
  int64_t numel[kMaxTensors];
  int dtype[kMaxTensors];
  bool vec[kMaxTensors];  // 16-byte aligned: vector loads
  int64_t first_block[kMaxTensors + 1];
  int n;
};

template <typename T>
__device__ float amax_of_share(const T* x, int64_t n, bool vec, int64_t block, int64_t blocks) {
  float amax = 0.f;
  const int64_t tid = block * kThreads + threadIdx.x, nthreads = blocks * kThreads;
  int64_t begin = 0;
  if (vec) {
    const int64_t n_vec = n / kElemsPerThread;
    for (int64_t v = tid; v < n_vec; v += nthreads) {
      Vec<T, kElemsPerThread> a;
      a.load(x + v * kElemsPerThread);
#pragma unroll
      for (int k = 0; k < kElemsPerThread; ++k) amax = amax_step(amax, to_float(a.v[k]));
    }
    begin = n_vec * kElemsPerThread;
  }
  for (int64_t i = begin + tid; i < n; i += nthreads) amax = amax_step(amax, to_float(x[i]));
  return amax;
}

__global__ void __launch_bounds__(kThreads)
current_scales_kernel(const ScalesTable t, float* __restrict__ amax_acc, int* __restrict__ counter,
                      float* __restrict__ scale, float* __restrict__ scale_inv,
                      int* __restrict__ skipped, float fp8_max) {
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
  __shared__ bool last;
  int i = 0;
  while (i + 1 < t.n && int64_t(blockIdx.x) >= t.first_block[i + 1]) ++i;
  const int64_t block = blockIdx.x - t.first_block[i], blocks = t.first_block[i + 1] - t.first_block[i];
  float amax = 0.f;
  switch (t.dtype[i]) {
    case kNVTEFloat32:
      amax = amax_of_share(static_cast<const float*>(t.data[i]), t.numel[i], t.vec[i], block, blocks);
      break;
    case kNVTEFloat16:
      amax = amax_of_share(static_cast<const fp16*>(t.data[i]), t.numel[i], t.vec[i], block, blocks);
      break;
    default:
      amax = amax_of_share(static_cast<const bf16*>(t.data[i]), t.numel[i], t.vec[i], block, blocks);
  }
  amax = block_reduce_max(amax, scratch);
  if (threadIdx.x == 0) {
    atomic_max_nonneg(amax_acc + i, amax);
    // This block's max is visible device-wide before it counts itself done, so the block that
    // counts last reads every max.
    __threadfence();
    last = atomicAdd(counter, 1) == int(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x >= t.n) return;
  __threadfence();
  const int j = threadIdx.x;
  // read and clear in one atomic: the accumulator is left zero for the next launch
  const float a = atomicExch(amax_acc + j, 0.f);
  // nvte_delayed_scaling_update's rule with margin 0 (its division by 2^0 changes no bits)
  float s = scale[j];
  const float candidate = fp8_max / a;
  if (a > 0.f && isfinite(a) && isfinite(candidate)) s = candidate;
  scale[j] = s;
  scale_inv[j] = 1.f / s;
  // the events the update counts: a NaN or infinite amax (not 0, not a finite amax too small
  // for a finite scale), one thread per tensor, so no atomic
  if (skipped != nullptr && !isfinite(a)) skipped[j] += 1;
  if (j == 0) atomicExch(counter, 0);
}

}  // namespace
}  // namespace te

namespace te {

void launch_current_scales(const NVTETensor* const* inputs, int64_t n, float* amax, int* counter,
                           float* scale, float* scale_inv, int* skipped, float fp8_max,
                           NVTEStream stream) {
  TE_CHECK_ARG(n >= 1 && n <= kMaxTensors, "n is ", n, "; expected 1 to ", kMaxTensors);
  TE_CHECK_ARG(inputs != nullptr, "inputs is a null pointer");
  TE_CHECK_ARG(amax && counter && scale && scale_inv,
               "amax, counter, scale and scale_inv must all be device pointers");
  TE_CHECK_ARG(fp8_max > 0.f && std::isfinite(fp8_max), "fp8_max is ", fp8_max,
               "; expected a positive finite number");
  ScalesTable t{};
  t.n = static_cast<int>(n);
  t.first_block[0] = 0;
  for (int i = 0; i < t.n; ++i) {
    check_tensor(inputs[i], "input");
    check_dtype_in(*inputs[i], "input", is_high_precision(inputs[i]->dtype),
                   "float32, float16 or bfloat16");
    const int64_t numel_i = numel(*inputs[i]);
    t.data[i] = inputs[i]->data;
    t.numel[i] = numel_i;
    t.dtype[i] = inputs[i]->dtype;
    t.vec[i] = aligned16(inputs[i]->data);
    const int64_t per_block = int64_t(kThreads) * kElemsPerThread;
    int64_t blocks = (numel_i + per_block - 1) / per_block;
    blocks = blocks < 1 ? 1 : (blocks > kMaxBlocksPerTensor ? kMaxBlocksPerTensor : blocks);
    t.first_block[i + 1] = t.first_block[i] + blocks;  // an empty tensor: one idle block
  }
  current_scales_kernel<<<unsigned(t.first_block[t.n]), kThreads, 0, to_stream(stream)>>>(
      t, amax, counter, scale, scale_inv, skipped, fp8_max);
  check_launch("current_scales_kernel");
}

}  // namespace te

extern "C" NVTEStatus nvte_current_scaling_scales(const NVTETensor* const* inputs, int64_t n,
                                                  float* amax, int* counter, float* scale,
                                                  float* scale_inv, int* skipped, float fp8_max,
                                                  NVTEStream stream) {
  return te::guard("nvte_current_scaling_scales", [&] {
    te::launch_current_scales(inputs, n, amax, counter, scale, scale_inv, skipped, fp8_max,
                              stream);
  });
}
