// Device-side building blocks shared by the kernel families: dtype dispatch, 16-byte vectors,
// conversions to and from float, warp/block reductions, and the post-launch error check.
#pragma once

#include <stdint.h>

#include "transformer_engine/transformer_engine.h"
#include "util/arch.h"
#include "util/error.h"

namespace te {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// ----- launch checks -------------------------------------------------------------------------
inline void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("launch of ", kernel, " failed: ", cudaGetErrorString(err)));
}

inline cudaStream_t to_stream(NVTEStream s) { return reinterpret_cast<cudaStream_t>(s); }

// ----- conversions ---------------------------------------------------------------------------
template <typename T> struct Convert;
template <> struct Convert<float> {
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
};
template <> struct Convert<fp16> {
  __device__ static float to_float(fp16 v) { return __half2float(v); }
  __device__ static fp16 from_float(float v) { return __float2half_rn(v); }
};
template <> struct Convert<bf16> {
  __device__ static float to_float(bf16 v) { return __bfloat162float(v); }
  // __float2bfloat16 rounds to nearest even on both vendors (HIP has no _rn spelling).
  __device__ static bf16 from_float(float v) { return __float2bfloat16(v); }
};
template <> struct Convert<fp8e4m3> {
  __device__ static float to_float(fp8e4m3 v) { return fp8_bits_to_float(v.bits, fp8e4m3{}); }
  __device__ static fp8e4m3 from_float(float v) { return fp8e4m3{float_to_fp8_bits(v, fp8e4m3{})}; }
};
template <> struct Convert<fp8e5m2> {
  __device__ static float to_float(fp8e5m2 v) { return fp8_bits_to_float(v.bits, fp8e5m2{}); }
  __device__ static fp8e5m2 from_float(float v) { return fp8e5m2{float_to_fp8_bits(v, fp8e5m2{})}; }
};

template <typename T> __device__ __forceinline__ float to_float(T v) { return Convert<T>::to_float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v) { return Convert<T>::from_float(v); }

// ----- 16-byte vectors -----------------------------------------------------------------------
// N elements of T loaded or stored with 16-byte (or narrower, when N*sizeof(T) < 16) accesses.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ void load(const T* p) { *this = *reinterpret_cast<const Vec*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
};

// ----- reductions ----------------------------------------------------------------------------
// max that keeps NaN (fmaxf drops it), so an amax over data holding NaN reports NaN.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
  for (int offset = TE_WARP_SIZE / 2; offset > 0; offset /= 2)
    v = nan_max(v, warp_shfl_xor(v, offset));
  return v;
}

// Max over the block; the result is valid in thread 0. `scratch` holds one float per warp.
__device__ __forceinline__ float block_reduce_max(float v, float* scratch) {
  const int lane = threadIdx.x % TE_WARP_SIZE;
  const int warp = threadIdx.x / TE_WARP_SIZE;
  const int num_warps = (blockDim.x + TE_WARP_SIZE - 1) / TE_WARP_SIZE;
  v = warp_reduce_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < num_warps ? scratch[lane] : 0.f;
    v = warp_reduce_max(v);
  }
  return v;
}

// Non-negative floats order like their bit patterns as signed ints, so an integer atomicMax is
// an exact float max for amax values (NaN compares as larger than every finite value and +inf,
// so a NaN amax is kept and reported rather than lost).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float value) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(value));
}

__device__ __forceinline__ float amax_step(float acc, float x) { return nan_max(fabsf(x), acc); }

// ----- programmatic dependent launch (sm_90+) ------------------------------------------------
// A kernel that may be launched with te::launch_overlapping (util/arch.h: it may then start while
// the kernel before it in the stream is still running its last blocks) calls
// wait_for_previous_grid() before its first access to global memory: it returns once that grid
// has finished and its writes are visible, so results are those of plain stream order. What the
// overlap saves is the launch latency and ramp of the new grid. release_next_grid() lets the
// next such kernel be scheduled once every block of this grid has called it (or exited).
// Both are no-ops on other targets and under a plain launch.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void release_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// ----- L2 residency hint for data read twice (sm_80+) ------------------------------------------
// A 16-byte load under an L2 eviction policy: with l2_evict_last_policy() its line stays in L2
// ahead of the kernel's streaming lines, for data that another thread of the same kernel reads
// again shortly after (the gated backward reads dy and the activation input once for each half
// of dx). Elsewhere (older NVIDIA devices, HIP) a plain 16-byte load and the policy is unused.
// p must be 16-byte aligned.
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
#else
  return 0;
#endif
}

// The opposite hint, for the last read of data read twice: its line is the first to leave L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
#else
  return 0;
#endif
}

__device__ __forceinline__ uint4 load16_l2_policy(const void* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 r;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
#else
  (void)policy;
  return *reinterpret_cast<const uint4*>(p);
#endif
}

}  // namespace te

// ----- dtype dispatch ------------------------------------------------------------------------
#define TE_SWITCH_HP(dtype, T, what, ...)                                          \
  switch (dtype) {                                                                 \
    case kNVTEFloat32: { using T = float; __VA_ARGS__; } break;                    \
    case kNVTEFloat16: { using T = ::te::fp16; __VA_ARGS__; } break;               \
    case kNVTEBFloat16: { using T = ::te::bf16; __VA_ARGS__; } break;              \
    default:                                                                       \
      TE_CHECK_ARG(false, what, " has dtype ", nvte_dtype_name(dtype),             \
                   "; expected float32, float16 or bfloat16");                     \
  }

#define TE_SWITCH_FP8(dtype, T, what, ...)                                         \
  switch (dtype) {                                                                 \
    case kNVTEFloat8E4M3: { using T = ::te::fp8e4m3; __VA_ARGS__; } break;         \
    case kNVTEFloat8E5M2: { using T = ::te::fp8e5m2; __VA_ARGS__; } break;         \
    default:                                                                       \
      TE_CHECK_ARG(false, what, " has dtype ", nvte_dtype_name(dtype),             \
                   "; expected float8_e4m3 or float8_e5m2");                       \
  }
