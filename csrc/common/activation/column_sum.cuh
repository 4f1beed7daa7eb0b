// First stage of the plain column sum (nvte_dbias): dbias[c] = sum_r grad[r, c], fp32 sums.
//
// A block of kColThreads x kRowThreads threads owns a strip of kColThreads * V columns (V
// elements = 16 bytes per thread) and rows_per_block rows (blockIdx.y picks the row block). Each
// thread walks its rows kRowThreads apart, kUnroll 16-byte loads in flight before the first add,
// so each load of a warp reads whole kColThreads * 16-byte pieces of rows. The kRowThreads partial
// sums of a column are added in shared memory in a fixed order and written as one fp32 row per
// row block, which the second stage (launch_dbias_reduce) sums per column, again in a fixed order:
// no atomics, the result is the same bits run to run. With a single row block the kernel writes
// the result in the output dtype directly (OutT) and the second stage is skipped.
//
// Scalar form (pointer not 16-byte aligned or cols not a multiple of V): thread tx owns columns
// c0 + k * kColThreads + tx, k < V (coalesced per k), same strip and row blocks.
//
// Nothing here depends on the warp width: threads are combined through shared memory only.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "util/device_utils.cuh"

namespace te {
namespace act {

// Adds the V = 16 / sizeof(T) elements packed in one 16-byte word to acc.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <typename T>
__device__ __forceinline__ void add_word(float* acc, uint32_t w) {
  if constexpr (std::is_same<T, float>::value) {
    acc[0] += __uint_as_float(w);
  } else if constexpr (std::is_same<T, bf16>::value) {
    acc[0] += bf16_lo(w);
    acc[1] += bf16_hi(w);
  } else {
    const __half2 h = *reinterpret_cast<const __half2*>(&w);
    const float2 f = __half22float2(h);
    acc[0] += f.x;
    acc[1] += f.y;
  }
}

template <typename T>
__device__ __forceinline__ void add_vec16(float* acc, const uint4& v) {
  constexpr int kPerWord = 4 / int(sizeof(T));
  add_word<T>(acc + 0 * kPerWord, v.x);
  add_word<T>(acc + 1 * kPerWord, v.y);
  add_word<T>(acc + 2 * kPerWord, v.z);
  add_word<T>(acc + 3 * kPerWord, v.w);
}

template <typename T, typename OutT, int kColThreads, int kRowThreads, int kUnroll>
__global__ void __launch_bounds__(kColThreads * kRowThreads)
column_sum_kernel(const T* __restrict__ in, OutT* __restrict__ out, int64_t rows, int64_t cols,
                  int64_t rows_per_block, bool vectorized) {
  constexpr int V = 16 / int(sizeof(T));
  constexpr int kStrip = kColThreads * V;
  constexpr int kThreads = kColThreads * kRowThreads;
  __shared__ float sums[kRowThreads][kStrip];
  wait_for_previous_grid();
  release_next_grid();
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t c0 = int64_t(blockIdx.x) * kStrip;
  const int64_t r_begin = int64_t(blockIdx.y) * rows_per_block;
  const int64_t r_end = r_begin + rows_per_block < rows ? r_begin + rows_per_block : rows;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;

  if (vectorized) {
    // cols is a multiple of V: a thread's vector lies inside the row or wholly past its end.
    if (c0 + int64_t(tx) * V < cols) {
      const int64_t step = int64_t(kRowThreads) * cols;
      int64_t r = r_begin + ty;
      const T* p = in + r * cols + c0 + int64_t(tx) * V;
      for (; r + int64_t(kUnroll - 1) * kRowThreads < r_end; r += int64_t(kUnroll) * kRowThreads) {
        uint4 w[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) w[u] = *reinterpret_cast<const uint4*>(p + u * step);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) add_vec16<T>(acc, w[u]);
        p += kUnroll * step;
      }
      for (; r < r_end; r += kRowThreads) {
        add_vec16<T>(acc, *reinterpret_cast<const uint4*>(p));
        p += step;
      }
    }
  } else {
    for (int64_t r = r_begin + ty; r < r_end; r += kRowThreads) {
      const T* row = in + r * cols;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int64_t c = c0 + k * kColThreads + tx;
        if (c < cols) acc[k] += to_float(row[c]);
      }
    }
  }

  if (vectorized) {
#pragma unroll
    for (int k = 0; k < V; k += 4)
      *reinterpret_cast<float4*>(&sums[ty][tx * V + k]) =
          make_float4(acc[k], acc[k + 1], acc[k + 2], acc[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) sums[ty][k * kColThreads + tx] = acc[k];
  }
  __syncthreads();
  OutT* dst = out + int64_t(blockIdx.y) * cols + c0;
  for (int j = threadIdx.x; j < kStrip; j += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int t = 0; t < kRowThreads; ++t) s += sums[t][j];
    if (c0 + j < cols) dst[j] = from_float<OutT>(s);
  }
}

}  // namespace act
}  // namespace te
