// Row-wise kernel building blocks shared by the normalization and softmax families: chunked
// vector accesses (mixed dtypes included), reductions over the threads that own one row, and the
// choice of row layout.
//
// Layout. A row of `cols` elements is owned by `tpr` consecutive threads, a power of two from 8
// to 1024, so that a row is either a power-of-two slice of one warp or a whole number of warps on
// both 32-lane (NVIDIA) and 64-lane (CDNA) hardware. The row is cut into chunks of
// kN = 16 / sizeof(input) elements, one 16-byte access; thread t owns chunks t, t + tpr, ..., so
// consecutive threads touch consecutive 16-byte pieces. In the register path a thread holds its
// chunks for the whole computation: their count is a template parameter and tpr a run-time one,
// which keeps the number of instantiations small while covering long rows in registers.
#pragma once

#include <map>
#include <mutex>
#include <tuple>

#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace rows {

constexpr int kMinTpr = 8;
// Shared-memory slots for per-warp partials: enough for 1024 threads of 32-lane warps.
constexpr int kMaxWarps = 1024 / TE_LOGICAL_WARP_SIZE;

// N elements of T moved with 16-byte accesses (or one narrower access when the chunk is smaller),
// so that a chunk of 8 fp32 weights next to 8 bf16 inputs needs only 16-byte alignment.
template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Chunk {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  const Chunk<T, N> c = *reinterpret_cast<const Chunk<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float(c.v[k]);
}

template <typename T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  Chunk<T, N> c;
#pragma unroll
  for (int k = 0; k < N; ++k) c.v[k] = from_float<T>(in[k]);
  *reinterpret_cast<Chunk<T, N>*>(p) = c;
}

// The kIters chunks a thread owns in one row (element offset (it * tpr + t) * kN), loaded as
// stored; chunks at or past `limit`, and every chunk of a row that does not exist, are zeros.
template <typename T, int kN, int kIters>
__device__ __forceinline__ void load_row_chunks(const T* row_ptr, bool valid, int limit, int tpr,
                                                int t, Chunk<T, kN> (&out)[kIters]) {
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (valid && c < limit) {
      out[it] = *reinterpret_cast<const Chunk<T, kN>*>(row_ptr + c);
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) out[it].v[k] = from_float<T>(0.f);
    }
  }
}

// Two 16-bit values packed in a 32-bit word (the lower address in the low half) as floats.
__device__ __forceinline__ float2 unpack_pair(uint32_t w, bf16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack_pair(uint32_t w, fp16) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}

// A 16-byte chunk held in registers as four 32-bit words, as loaded: 16-bit values stay packed
// two per register (a chunk of 8 bf16 takes 4 registers, not 8), and are unpacked where used.
template <typename T>
__device__ __forceinline__ void unpack_words(const uint4& w, float (&out)[16 / sizeof(T)]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack_pair(words[j], T{});
      out[2 * j] = f.x;
      out[2 * j + 1] = f.y;
    }
  } else {
    static_assert(sizeof(T) == 4, "16- or 32-bit values");
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = __uint_as_float(words[j]);
  }
}

// Makes the compiler unpack `w` again at its next use instead of keeping unpacked copies live
// across a reduction (forget_value in arch.h).
__device__ __forceinline__ void forget_words(uint4& w) {
  forget_value(w.x);
  forget_value(w.y);
  forget_value(w.z);
  forget_value(w.w);
}

// Like load_row_chunks, as words: the kIters chunks a thread owns in one row, zeros at or past
// `limit` and for rows that do not exist.
template <typename T, int kIters>
__device__ __forceinline__ void load_row_words(const T* row_ptr, bool valid, int limit, int tpr,
                                               int t, uint4 (&out)[kIters]) {
  constexpr int kN = 16 / sizeof(T);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    out[it] = valid && c < limit ? *reinterpret_cast<const uint4*>(row_ptr + c)
                                 : make_uint4(0, 0, 0, 0);
  }
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float kIdentity = 0.f;
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float kIdentity = -__builtin_huge_valf();
};

// Reduces each of v[0..N) over the tpr threads of a row; every thread of the row gets the same
// bits (butterfly shuffles give every lane the same operands; the cross-warp step reads the
// warp partials in one fixed order). When a row spans warps the partials meet in `red`
// ([N][kMaxWarps] floats) behind a __syncthreads, so every thread of the block must call this.
// Callers alternate two `red` buffers between consecutive reductions: the buffer written by
// reduction i + 2 is touched only after every thread passed the barrier of reduction i + 1, hence
// after it finished reading reduction i.
template <typename Op, int N>
__device__ __forceinline__ void row_reduce(float (&v)[N], int tpr, float* red, Op op) {
  const int lanes = tpr < TE_WARP_SIZE ? tpr : TE_WARP_SIZE;
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = op(v[k], warp_shfl_xor(v[k], offset));
  }
  if (tpr > TE_WARP_SIZE) {
    const int warp = threadIdx.x / TE_WARP_SIZE;
    const int warps_per_row = tpr / TE_WARP_SIZE;
    if (threadIdx.x % TE_WARP_SIZE == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) red[k * kMaxWarps + warp] = v[k];
    }
    __syncthreads();
    const int first = warp - warp % warps_per_row;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float s = Op::kIdentity;
      for (int w = 0; w < warps_per_row; ++w) s = op(s, red[k * kMaxWarps + first + w]);
      v[k] = s;
    }
  }
}

template <int N>
__device__ __forceinline__ void row_sum(float (&v)[N], int tpr, float* red) {
  row_reduce(v, tpr, red, SumOp{});
}

struct RowLayout {
  int tpr;    // threads per row
  int iters;  // chunks per thread (register path)
};

// Register path: the smallest power-of-two tpr (up to max_tpr) whose threads hold the row in at
// most max_iters chunks each. Fewer threads per row means fewer shared-memory rounds in the
// reductions; few chunks per thread keeps registers low enough for the occupancy that
// saturates DRAM.
inline bool pick_register_layout(int64_t chunks, int max_iters, int max_tpr, RowLayout* out) {
  for (int tpr = kMinTpr; tpr <= max_tpr; tpr *= 2) {
    const int64_t iters = (chunks + tpr - 1) / tpr;
    if (iters <= max_iters) {
      *out = RowLayout{tpr, static_cast<int>(iters < 1 ? 1 : iters)};
      return true;
    }
  }
  return false;
}

// General path (any cols, any alignment): a warp for short rows, up to max_tpr threads for long
// ones, each thread striding over the row with scalar accesses.
inline int general_tpr(int64_t cols, int max_tpr) {
  int tpr = 32;
  while (tpr < max_tpr && int64_t(tpr) * 8 < cols) tpr *= 2;
  return tpr;
}

inline int blocks_for(int64_t rows, int rows_per_block) {
  return static_cast<int>((rows + rows_per_block - 1) / rows_per_block);
}

// Blocks of `kernel` (launched with `block` threads and `smem` dynamic bytes) that the current
// device holds at once, capped by `wanted`: the grid of a persistent row loop. The answer is
// cached per (device, kernel, block, smem) so that repeated calls cost a map lookup, not two
// driver queries.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int block, size_t smem, int64_t wanted) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, size_t>, int64_t> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) throw Error(kNVTEDeviceError, "no current device");
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), block, smem);
  int64_t cap = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) cap = it->second;
  }
  if (cap == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem) != cudaSuccess)
      throw Error(kNVTEDeviceError, concat("occupancy query failed for a row kernel of ", block,
                                           " threads and ", smem, " bytes of shared memory"));
    cap = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
    std::lock_guard<std::mutex> lock(mutex);
    cache[key] = cap;
  }
  return wanted < cap ? wanted : cap;
}

}  // namespace rows
}  // namespace te
