// Kernels of the activation family, templated over the functors of activation_math.cuh and
// instantiated once per activation by the thin files gelu.cu, relu.cu, ...
//
// Elementwise kernels (plain and gated, forward and backward) are grid-stride loops over tiles
// of kBlock x kElems elements (the launch shape of each kind: shape_of below), each thread moving
// 16-byte pieces laid out so that a warp's accesses are contiguous (see Pieces below), then whole
// pieces, then a scalar loop for the tail and for tensors whose pointers or gated width do not
// allow whole pieces. Whether to vectorise is a run-time argument rather than a template
// parameter, which halves the number of instantiations (and the build time); the branch is
// uniform.
//
// The fused dbias + dact runs in two stages. Stage 1: a block of 32 x 8 threads owns a strip of
// 32 * V columns (V elements = 16 bytes per thread) and rows_per_block rows; it writes dx and one
// row of fp32 partial column sums into the workspace. Stage 2 sums the partial rows per column.
// No atomics, so dbias is deterministic run to run.
#pragma once

#include <type_traits>

#include "activation/activation_launch.h"
#include "activation/activation_math.cuh"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace act {

constexpr int kThreads = kActThreads;
// Elements per thread per tile (see shape_of for which kind uses which). With an FP8 output the
// plain forward reads 16 elements (two 16-byte pieces) per thread per tile, the other kinds 8 of
// each input. Streaming cache hints on the 16-byte accesses did no better on an H100 (1-4%
// slower).
constexpr int kVec = 16;
constexpr int kMultiInputVec = 8;
constexpr int kMaxBlock = 1024;  // the largest block any elementwise launch uses

template <typename T>
constexpr bool is_fp8_type() {
  return std::is_same<T, fp8e4m3>::value || std::is_same<T, fp8e5m2>::value;
}

// Vector loads and stores spelled out as 16-byte (or 8/4-byte) words. A plain copy of a Vec is
// sometimes split by the compiler into one store per element or per 4 bytes (seen for the gated
// backward and the dbias kernels: a factor of three in bandwidth), even when written as uint4
// stores. A 16-byte store of one 128-bit integer is never split (nvcc and hip-clang both lower
// it to a single 16-byte store), so the element bits are packed into those by hand.
template <int kBytes> struct WordsOf;
template <> struct WordsOf<16> { using type = uint4; };
template <> struct WordsOf<8> { using type = uint2; };
template <> struct WordsOf<4> { using type = uint32_t; };

template <typename T, int N>
__device__ __forceinline__ void load_vec(Vec<T, N>& v, const T* p) {
  constexpr int kBytes = int(sizeof(T)) * N;
  constexpr int kChunk = kBytes >= 16 ? 16 : kBytes;
  using Chunk = typename WordsOf<kChunk>::type;
  union Bits {
    Vec<T, N> vec;
    Chunk chunk[kBytes / kChunk];
    __device__ Bits() {}
  } bits;
  const Chunk* src = reinterpret_cast<const Chunk*>(p);
#pragma unroll
  for (int i = 0; i < kBytes / kChunk; ++i) bits.chunk[i] = src[i];
  v = bits.vec;
}

// One 16-byte piece loaded under an L2 eviction policy (load16_l2_policy, util/device_utils.cuh).
template <typename T, int N>
__device__ __forceinline__ void load_vec_l2_policy(Vec<T, N>& v, const T* p, uint64_t policy) {
  static_assert(int(sizeof(T)) * N == 16, "one 16-byte piece");
  union Bits {
    Vec<T, N> vec;
    uint4 word;
    __device__ Bits() {}
  } bits;
  bits.word = load16_l2_policy(p, policy);
  v = bits.vec;
}

__device__ __forceinline__ uint32_t raw_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t raw_bits(fp16 v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t raw_bits(bf16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint32_t raw_bits(fp8e4m3 v) { return v.bits; }
__device__ __forceinline__ uint32_t raw_bits(fp8e5m2 v) { return v.bits; }

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  constexpr int kBytes = int(sizeof(T)) * N;
  static_assert(kBytes % 4 == 0 && (kBytes <= 8 || kBytes % 16 == 0), "vector size");
  constexpr int kWords = kBytes / 4, kPerWord = 4 / int(sizeof(T));
  uint32_t w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    w[i] = 0;
#pragma unroll
    for (int j = 0; j < kPerWord; ++j) w[i] |= raw_bits(v.v[i * kPerWord + j]) << (8 * sizeof(T) * j);
  }
  if constexpr (kWords >= 4) {
    using u128 = unsigned __int128;
#pragma unroll
    for (int q = 0; q < kWords / 4; ++q)
      reinterpret_cast<u128*>(p)[q] = u128(w[4 * q]) | (u128(w[4 * q + 1]) << 32) |
                                      (u128(w[4 * q + 2]) << 64) | (u128(w[4 * q + 3]) << 96);
  } else if constexpr (kWords == 2) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
}

// a / b, in 32-bit arithmetic when both fit (64-bit division is a long software sequence).
__device__ __forceinline__ int64_t div_index(int64_t a, int64_t b) {
  if (((a | b) >> 32) == 0) return int64_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

// Converts fp32 results to the output type; for FP8 outputs applies the scale and tracks amax
// of the unscaled values, as nvte_quantize does.
template <typename OutT>
struct OutputCast {
  static constexpr bool kFp8 = is_fp8_type<OutT>();
  float scale = 1.f;
  float amax = 0.f;

  __device__ explicit OutputCast(const float* scale_ptr, float* scale_inv_ptr) {
    if (kFp8) {
      scale = *scale_ptr;
      if (scale_inv_ptr != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        *scale_inv_ptr = 1.f / scale;
    }
  }
  __device__ __forceinline__ OutT operator()(float v) {
    if constexpr (kFp8) {
      amax = amax_step(amax, v);
      return from_float<OutT>(v * scale);
    } else {
      return from_float<OutT>(v);
    }
  }
  // Every thread of the block must call this (it synchronises the block).
  __device__ void publish_amax(float* amax_ptr) {
    if constexpr (kFp8) {
      __shared__ float scratch[kMaxBlock / TE_LOGICAL_WARP_SIZE + 1];
      if (amax_ptr == nullptr) return;  // uniform across the block
      const float block_amax = block_reduce_max(amax, scratch);
      if (threadIdx.x == 0) atomic_max_nonneg(amax_ptr, block_amax);
    }
  }
};

// ----- elementwise tiles ------------------------------------------------------------------------
// A block works on tiles of kBlock * kElems elements. Inside a tile a thread owns kElems / P
// pieces of P = 16 / sizeof(InT) elements (one 16-byte load per input), piece p of thread t at
// tile offset (p * kBlock + t) * P: every warp-wide load and store covers one contiguous span,
// whole 32-byte sectors. (One contiguous 16-element vector per thread instead split each warp
// access into half sectors over twice the span; at the bandwidth roof on an H100 that cost
// gelu backward 5% against PyTorch's own elementwise kernel.) Pieces never straddle a row of a
// gated tensor: the vector path needs cols % P == 0.
template <typename InT, int kElems = kVec, int kBlock = kThreads>
struct Pieces {
  static constexpr int P = 16 / int(sizeof(InT));
  static constexpr int kCount = kElems / P;
  static constexpr int64_t kTile = int64_t(kBlock) * kElems;
  static_assert(kCount >= 1 && kElems % P == 0, "whole 16-byte pieces per thread");
};

// ----- elementwise forward ---------------------------------------------------------------------
// n = rows * cols output elements. Plain: y[o] = act(x[o]). Gated (row r, column c):
// y[r, c] = act(x[r, c]) * x[r, cols + c], where the input row holds 2 * cols values, so the
// input offset of output o is o + r * cols.
template <class Op, bool kGated, typename InT, typename OutT, int P>
__device__ __forceinline__ void fwd_vec(const Vec<InT, P>& a, const Vec<InT, P>& b,
                                        OutputCast<OutT>& cast, OutT* dst) {
  Vec<OutT, P> y;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    float r = Op::value(to_float(a.v[k]));
    if (kGated) r *= to_float(b.v[k]);
    y.v[k] = cast(r);
  }
  store_vec(dst, y);
}

// kElems: elements per thread per tile.
template <class Op, bool kGated, typename InT, typename OutT, int kElems = kVec,
          int kBlock = kThreads>
__global__ void __launch_bounds__(kBlock)
activation_fwd_kernel(const InT* __restrict__ in, OutT* __restrict__ out, int64_t rows,
                      int64_t cols, bool vectorized, const float* __restrict__ scale_ptr,
                      float* __restrict__ amax_ptr, float* __restrict__ scale_inv_ptr) {
  wait_for_previous_grid();  // before the first global access (scale)
  release_next_grid();
  using Shape = Pieces<InT, kElems, kBlock>;
  constexpr int P = Shape::P;
  OutputCast<OutT> cast(scale_ptr, scale_inv_ptr);
  const int64_t n = rows * cols;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  auto in_offset = [&](int64_t o) { return kGated ? o + div_index(o, cols) * cols : o; };
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t tiles = n / Shape::kTile;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t base = tile * Shape::kTile + int64_t(threadIdx.x) * P;
      Vec<InT, P> a[Shape::kCount], b[Shape::kCount];
      // Every load of the tile is issued before the first use.
#pragma unroll
      for (int p = 0; p < Shape::kCount; ++p) {
        const int64_t i = in_offset(base + int64_t(p) * kBlock * P);
        load_vec(a[p], in + i);
        if (kGated) load_vec(b[p], in + i + cols);
      }
#pragma unroll
      for (int p = 0; p < Shape::kCount; ++p)
        fwd_vec<Op, kGated>(a[p], b[p], cast, out + base + int64_t(p) * kBlock * P);
    }
    // Whole pieces after the last whole tile, then single elements.
    const int64_t pieces = n / P;
    for (int64_t q = tiles * (Shape::kTile / P) + tid; q < pieces; q += nthreads) {
      Vec<InT, P> a, b;
      const int64_t i = in_offset(q * P);
      load_vec(a, in + i);
      if (kGated) load_vec(b, in + i + cols);
      fwd_vec<Op, kGated>(a, b, cast, out + q * P);
    }
    scalar_begin = pieces * P;
  }
  for (int64_t o = scalar_begin + tid; o < n; o += nthreads) {
    const int64_t i = in_offset(o);
    float r = Op::value(to_float(in[i]));
    if (kGated) r *= to_float(in[i + cols]);
    out[o] = cast(r);
  }
  cast.publish_amax(amax_ptr);
}

// ----- elementwise backward --------------------------------------------------------------------
// n = rows * cols grad elements. Plain: dx[o] = dy[o] act'(x[o]). Gated: with a = x[r, c] and
// b = x[r, cols + c], dx[r, c] = dy b act'(a) and dx[r, cols + c] = dy act(a).
template <class Op, bool kGated, typename InT, typename OutT, int P>
__device__ __forceinline__ void bwd_vec(const Vec<InT, P>& g, const Vec<InT, P>& a,
                                        const Vec<InT, P>& b, OutputCast<OutT>& cast,
                                        OutT* dst, int64_t cols) {
  Vec<OutT, P> da, db;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const float x = to_float(a.v[k]), dy = to_float(g.v[k]);
    if (kGated) {
      da.v[k] = cast(dy * to_float(b.v[k]) * Op::deriv(x));
      db.v[k] = cast(dy * Op::value(x));
    } else {
      da.v[k] = cast(dy * Op::deriv(x));
    }
  }
  store_vec(dst, da);
  if (kGated) store_vec(dst + cols, db);
}

// Gated backward with a high-precision dx, vectorised: the threads walk dx (rows x 2 cols, the
// input's layout) in order, one 16-byte piece each; a piece in the first half is
// dy b act'(a) (reads dy, a and b), in the second half dy act(a) (reads dy and a again, which
// the first half's threads have just brought into L2). Writing dx as one contiguous stream
// measured ~1% faster on an H100 than writing both halves from one thread (the layout
// torch.compile gives cat([da, db], -1)), which was the last ~1.5% behind it for reglu/sreglu.
// dy and a, read twice, are loaded under an L2 evict-last policy so that the second read finds
// them (as torch.compile's kernel does), b under the default one. H100 scratch harness, bf16,
// reglu/sreglu, interleaved with torch.compile (ratio to it, two timings each): the evict-last
// loads 0.997 -> 1.001 at 32768x8192 and 0.998 -> 1.000 at 16384x4096; blocks of 1024 threads
// instead of 512, 0.997 -> 1.000-1.002 and 0.998 -> 1.000-1.001 (256: 0.996-0.998).
// The evict-last loads and the 1024-thread blocks were measured on reglu/sreglu only; with them
// the gated forms whose derivative costs more (geglu, qgeglu, swiglu) fell to 0.79-0.86x
// torch.compile (geglu to 70% of copy) in the full H100 benchmark, against 1.07-2.18x before.
// Those keep plain loads in blocks of 512.
template <class Op>
constexpr bool cheap_gated_derivative() {
  return std::is_same<Op, Relu>::value || std::is_same<Op, SquaredRelu>::value;
}

template <class Op, typename InT, typename OutT, int kBlock>
__global__ void __launch_bounds__(kBlock)
gated_bwd_flat_kernel(const InT* __restrict__ grad, const InT* __restrict__ in,
                      OutT* __restrict__ out, int64_t rows, int64_t cols) {
  wait_for_previous_grid();
  release_next_grid();
  constexpr int P = Pieces<InT>::P;
  const uint64_t keep = cheap_gated_derivative<Op>() ? l2_evict_last_policy() : 0;
  const int64_t pieces = rows * 2 * cols / P;
  for (int64_t q = blockIdx.x * int64_t(kBlock) + threadIdx.x; q < pieces;
       q += int64_t(gridDim.x) * kBlock) {
    const int64_t o = q * P;
    const int64_t r = div_index(o, 2 * cols), c = o - r * 2 * cols;
    const bool first = c < cols;
    const int64_t cc = first ? c : c - cols;
    Vec<InT, P> g, a, b;
    if constexpr (cheap_gated_derivative<Op>()) {
      load_vec_l2_policy(g, grad + r * cols + cc, keep);
      load_vec_l2_policy(a, in + r * 2 * cols + cc, keep);
    } else {
      load_vec(g, grad + r * cols + cc);
      load_vec(a, in + r * 2 * cols + cc);
    }
    if (first) load_vec(b, in + r * 2 * cols + cols + cc);
    Vec<OutT, P> d;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float x = to_float(a.v[k]), dy = to_float(g.v[k]);
      d.v[k] = from_float<OutT>(first ? dy * to_float(b.v[k]) * Op::deriv(x) : dy * Op::value(x));
    }
    store_vec(out + o, d);
  }
}
constexpr int kFlatBlock = 512;  // the gated forms other than reglu/sreglu (see above)

template <class Op, bool kGated, typename InT, typename OutT, int kElems = kVec,
          int kBlock = kThreads>
__global__ void __launch_bounds__(kBlock)
activation_bwd_kernel(const InT* __restrict__ grad, const InT* __restrict__ in,
                      OutT* __restrict__ out, int64_t rows, int64_t cols, bool vectorized,
                      const float* __restrict__ scale_ptr, float* __restrict__ amax_ptr,
                      float* __restrict__ scale_inv_ptr) {
  wait_for_previous_grid();  // before the first global access (scale)
  release_next_grid();
  using Shape = Pieces<InT, kElems, kBlock>;
  constexpr int P = Shape::P;
  OutputCast<OutT> cast(scale_ptr, scale_inv_ptr);
  const int64_t n = rows * cols;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  auto in_offset = [&](int64_t o) { return kGated ? o + div_index(o, cols) * cols : o; };
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t tiles = n / Shape::kTile;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t base = tile * Shape::kTile + int64_t(threadIdx.x) * P;
      Vec<InT, P> g[Shape::kCount], a[Shape::kCount], b[Shape::kCount];
      int64_t at[Shape::kCount];
#pragma unroll
      for (int p = 0; p < Shape::kCount; ++p) {
        const int64_t o = base + int64_t(p) * kBlock * P;
        at[p] = in_offset(o);
        load_vec(g[p], grad + o);
        load_vec(a[p], in + at[p]);
        if (kGated) load_vec(b[p], in + at[p] + cols);
      }
#pragma unroll
      for (int p = 0; p < Shape::kCount; ++p)
        bwd_vec<Op, kGated>(g[p], a[p], b[p], cast, out + at[p], cols);
    }
    const int64_t pieces = n / P;
    for (int64_t q = tiles * (Shape::kTile / P) + tid; q < pieces; q += nthreads) {
      Vec<InT, P> g, a, b;
      const int64_t i = in_offset(q * P);
      load_vec(g, grad + q * P);
      load_vec(a, in + i);
      if (kGated) load_vec(b, in + i + cols);
      bwd_vec<Op, kGated>(g, a, b, cast, out + i, cols);
    }
    scalar_begin = pieces * P;
  }
  for (int64_t o = scalar_begin + tid; o < n; o += nthreads) {
    const int64_t i = in_offset(o);
    const float x = to_float(in[i]), dy = to_float(grad[o]);
    if (kGated) {
      out[i] = cast(dy * to_float(in[i + cols]) * Op::deriv(x));
      out[i + cols] = cast(dy * Op::value(x));
    } else {
      out[i] = cast(dy * Op::deriv(x));
    }
  }
  cast.publish_amax(amax_ptr);
}

// ----- high-precision plain forward and backward: one 16-byte piece per thread -----------------
// y = act(x) or dx = dy act'(x) with the output in the input's dtype and 16-byte aligned pointers:
// thread t of block b owns elements (b * block + t) * P .. + P - 1, so a warp's accesses are
// contiguous, and there is no loop: the grid covers the tensor (the last thread's partial piece
// goes element by element). With only 8 bf16 elements per thread, the grid-stride kernel's loop
// and index set-up were a visible share of the issued instructions: in a scratch harness on an
// H100 (bf16 gelu forward, 16384x4096 / 32768x8192), 0.998 / 0.995x torch.compile with
// activation_fwd_kernel (8 x 128), 1.012 / 1.007x with this schedule; the cheaper activations
// and the backwards gained 0.1-0.5%. Register caps (12 or 16 resident blocks) did not help.
// bench_kernels --quick on an H100 (with the overlapping launch): plain forwards 0.995-1.000x ->
// 1.007-1.009x at 16384x4096, 1.000-1.008x at 32768x8192; plain backwards 1.001-1.006x / 0.999-
// 1.004x, all at 98-102% of copy like their compiled peers. Same arithmetic as
// activation_fwd_kernel / activation_bwd_kernel, bit for bit.
// Block size: 256 threads for the forward; the backward (two inputs) takes 512: in the H100
// harness (bf16, two timings each, ratio to torch.compile) gelu bwd 32768x8192 1.000 -> 1.002-
// 1.003, srelu bwd 16384x4096 1.002 -> 1.004, silu bwd 32768x8192 1.001 either way; 128 threads
// 0.998-1.002.
template <bool kBackward>
constexpr int piece_block() {
  return kBackward ? 512 : 256;
}

template <class Op, bool kBackward, typename T>
__global__ void __launch_bounds__(piece_block<kBackward>())
activation_piece_kernel(const T* __restrict__ grad, const T* __restrict__ in, T* __restrict__ out,
                        int64_t n) {
  wait_for_previous_grid();
  release_next_grid();
  constexpr int P = Pieces<T>::P;
  constexpr int kBlock = piece_block<kBackward>();
  const int64_t o = (int64_t(blockIdx.x) * kBlock + threadIdx.x) * P;
  if (o + P <= n) {
    Vec<T, P> x, g, y;
    load_vec(x, in + o);
    if (kBackward) load_vec(g, grad + o);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float v = to_float(x.v[k]);
      y.v[k] = from_float<T>(kBackward ? to_float(g.v[k]) * Op::deriv(v) : Op::value(v));
    }
    store_vec(out + o, y);
  } else {
    for (int64_t i = o; i < n; ++i) {
      const float v = to_float(in[i]);
      out[i] = from_float<T>(kBackward ? to_float(grad[i]) * Op::deriv(v) : Op::value(v));
    }
  }
}

// ----- fused dbias + dact, stage 1 -------------------------------------------------------------
constexpr int kColThreads = 32;  // one warp spans the strip: 32 x 16 bytes contiguous per row
constexpr int kRowThreads = kDbiasRowThreads;
constexpr int kRowUnroll = kDbiasRowUnroll;  // rows in flight per thread: 2 x 4 loads of 16 B
static_assert(kColThreads * kRowThreads == kThreads, "dbias block shape");

// Grid: x over column strips, y over row blocks. Vectorised: thread tx owns columns
// c0 + tx*V .. +V-1 (one 16-byte access). Scalar: columns c0 + k*32 + tx (coalesced per k).
template <class Op, typename InT, typename OutT>
__global__ void __launch_bounds__(kThreads)
dbias_dact_kernel(const InT* __restrict__ grad, const InT* __restrict__ in,
                  OutT* __restrict__ out, float* __restrict__ partial, int64_t rows, int64_t cols,
                  int64_t rows_per_block, bool vectorized, const float* __restrict__ scale_ptr,
                  float* __restrict__ amax_ptr, float* __restrict__ scale_inv_ptr) {
  constexpr int V = 16 / sizeof(InT);
  constexpr int kStrip = kColThreads * V;
  __shared__ float sums[kRowThreads][kStrip];
  OutputCast<OutT> cast(scale_ptr, scale_inv_ptr);
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t c0 = int64_t(blockIdx.x) * kStrip;
  const int64_t r_begin = int64_t(blockIdx.y) * rows_per_block;
  const int64_t r_end = r_begin + rows_per_block < rows ? r_begin + rows_per_block : rows;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;

  const bool whole_vec = vectorized && c0 + (tx + 1) * V <= cols;
  for (int64_t r0 = r_begin + ty; r0 < r_end; r0 += kRowThreads * kRowUnroll) {
    if (whole_vec) {
      Vec<InT, V> g[kRowUnroll], x[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = r0 + u * kRowThreads;
        if (r < r_end) {
          load_vec(g[u], grad + r * cols + c0 + tx * V);
          load_vec(x[u], in + r * cols + c0 + tx * V);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = r0 + u * kRowThreads;
        if (r >= r_end) continue;
        Vec<OutT, V> y;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = to_float(g[u].v[k]) * Op::deriv(to_float(x[u].v[k]));
          acc[k] += d;
          y.v[k] = cast(d);
        }
        store_vec(out + r * cols + c0 + tx * V, y);
      }
    } else if (!vectorized) {
#pragma unroll 1
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = r0 + u * kRowThreads;
        if (r >= r_end) break;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int64_t c = c0 + k * kColThreads + tx;
          if (c < cols) {
            const int64_t i = r * cols + c;
            const float d = to_float(grad[i]) * Op::deriv(to_float(in[i]));
            acc[k] += d;
            out[i] = cast(d);
          }
        }
      }
    }
    // vectorized but past the last whole vector: cols is a multiple of V there, so nothing left.
  }

#pragma unroll
  for (int k = 0; k < V; ++k) sums[ty][vectorized ? tx * V + k : k * kColThreads + tx] = acc[k];
  __syncthreads();
  for (int j = threadIdx.x; j < kStrip; j += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int t = 0; t < kRowThreads; ++t) s += sums[t][j];
    if (c0 + j < cols) partial[int64_t(blockIdx.y) * cols + c0 + j] = s;
  }
  cast.publish_amax(amax_ptr);
}

// ----- launchers -------------------------------------------------------------------------------

// Launch shape of one kind: elements per thread per tile and threads per block.
struct ElementwiseShape {
  int elems, block;
};

// High-precision outputs run one tile per block in a single pass, like a copy kernel, so every
// thread's loads are issued at once. (Aligned plain kinds now take activation_piece_kernel; the
// plain shapes below serve their unaligned, element-by-element form.) Measured on an H100 at
// 16384x4096 and 32768x8192 bf16, interleaved with torch.compile (relative to it, relu / silu /
// gelu):
//   plain forward  16 x 256: 0.991-0.999   8 x 128: 0.995-1.002   8 x 512: 0.94 for gelu
//   gated forward   8 x 256: 0.993-1.001   8 x 1024: 0.999-1.007
//   backwards       8 x 256: 1.000-1.013 (kept)
// FP8 outputs: a grid of a few waves looping over the data, so that only that many blocks
// publish an amax atomically; 16 elements per thread for the plain forward, 8 otherwise.
template <typename OutT>
constexpr ElementwiseShape shape_of(Kind kind) {
  if (is_fp8_type<OutT>()) return {kind == Kind::kForward ? kVec : kMultiInputVec, kThreads};
  if (kind == Kind::kForward) return {kMultiInputVec, 128};
  if (kind == Kind::kGatedForward) return {kMultiInputVec, 1024};
  return {kMultiInputVec, kThreads};
}

template <class Op, bool kGated, typename InT, typename OutT, Kind K>
void launch_fwd_kind(const InT* in, OutT* out, const ElementwiseArgs& a, bool vec, int grid,
                     cudaStream_t s) {
  constexpr ElementwiseShape sh = shape_of<OutT>(K);
  launch_overlapping(activation_fwd_kernel<Op, kGated, InT, OutT, sh.elems, sh.block>, dim3(grid),
                     dim3(sh.block), s, in, out, a.rows, a.cols, vec, a.scale, a.amax, a.scale_inv);
}

// A block count as a launch's grid size, capped at the largest one (grid-stride kernels loop).
inline int grid_of(int64_t blocks) {
  return static_cast<int>(blocks > (int64_t(1) << 31) - 1 ? (int64_t(1) << 31) - 1 : blocks);
}

template <class Op, typename InT, typename OutT>
void launch_elementwise_typed(const ElementwiseArgs& a) {
  const bool gated = a.kind == Kind::kGatedForward || a.kind == Kind::kGatedBackward;
  const bool forward = a.kind == Kind::kForward || a.kind == Kind::kGatedForward;
  const int64_t n = a.rows * a.cols;
  bool vec = aligned16(a.input) && aligned16(a.output) && (forward || aligned16(a.grad));
  if (gated) vec = vec && a.cols % Pieces<InT>::P == 0;
  const ElementwiseShape sh = shape_of<OutT>(a.kind);
  const int64_t items = vec ? n / sh.elems + 1 : n;  // about one tile per block
  int grid;
  if (is_fp8_type<OutT>()) {
    grid = elementwise_grid(items);
  } else {
    grid = grid_of((items + sh.block - 1) / sh.block);  // the kernels loop if more
  }
  auto in = static_cast<const InT*>(a.input);
  auto grad = static_cast<const InT*>(a.grad);
  auto out = static_cast<OutT*>(a.output);
  cudaStream_t s = to_stream(a.stream);
  if constexpr (std::is_same<InT, OutT>::value) {
    if (vec && !gated) {
      const int block = forward ? piece_block<false>() : piece_block<true>();
      const int64_t blocks = (n + int64_t(block) * Pieces<InT>::P - 1) /
                             (int64_t(block) * Pieces<InT>::P);
      TE_CHECK_ARG(blocks < (int64_t(1) << 31), "tensor of ", n, " elements is too large");
      if (blocks == 0) return;
      if (forward)
        launch_overlapping(activation_piece_kernel<Op, false, InT>, dim3(unsigned(blocks)),
                           dim3(block), s, grad, in, out, n);
      else
        launch_overlapping(activation_piece_kernel<Op, true, InT>, dim3(unsigned(blocks)),
                           dim3(block), s, grad, in, out, n);
      check_launch("activation_piece_kernel");
      return;
    }
  }
  switch (a.kind) {
    case Kind::kForward:
      launch_fwd_kind<Op, false, InT, OutT, Kind::kForward>(in, out, a, vec, grid, s);
      break;
    case Kind::kGatedForward:
      launch_fwd_kind<Op, true, InT, OutT, Kind::kGatedForward>(in, out, a, vec, grid, s);
      break;
    case Kind::kBackward:
      launch_overlapping(activation_bwd_kernel<Op, false, InT, OutT, kMultiInputVec>, dim3(grid),
                         dim3(kThreads), s, grad, in, out, a.rows, a.cols, vec, a.scale, a.amax,
                         a.scale_inv);
      break;
    case Kind::kGatedBackward:
      if (vec && !is_fp8_type<OutT>()) {
        constexpr int kBlock = cheap_gated_derivative<Op>() ? 1024 : kFlatBlock;
        const int flat_grid = grid_of((2 * n / Pieces<InT>::P + kBlock - 1) / kBlock);
        if (flat_grid > 0)
          launch_overlapping(gated_bwd_flat_kernel<Op, InT, OutT, kBlock>, dim3(flat_grid),
                             dim3(kBlock), s, grad, in, out, a.rows, a.cols);
        break;
      }
      launch_overlapping(activation_bwd_kernel<Op, true, InT, OutT, kMultiInputVec>, dim3(grid),
                         dim3(kThreads), s, grad, in, out, a.rows, a.cols, vec, a.scale, a.amax,
                         a.scale_inv);
      break;
  }
  check_launch("activation kernel");
}

template <class Op, typename InT, typename OutT>
void launch_dbias_typed(const DbiasArgs& a) {
  constexpr int V = 16 / sizeof(InT);
  constexpr int64_t kStrip = kColThreads * V;
  cudaStream_t s = to_stream(a.stream);
  const int64_t row_blocks = dbias_row_blocks(a.rows);
  const int64_t strips = (a.cols + kStrip - 1) / kStrip;
  if (row_blocks > 0 && strips > 0) {
    TE_CHECK_ARG(row_blocks < 65536, "tensor of ", a.rows, " rows is too large");
    const bool vec = aligned16(a.grad) && aligned16(a.input) && aligned16(a.output) &&
                     a.cols % V == 0;
    const dim3 grid{unsigned(strips), unsigned(row_blocks), 1u};
    dbias_dact_kernel<Op, InT, OutT><<<grid, kThreads, 0, s>>>(
        static_cast<const InT*>(a.grad), static_cast<const InT*>(a.input),
        static_cast<OutT*>(a.output), a.workspace, a.rows, a.cols, dbias_rows_per_block(a.rows),
        vec, a.scale, a.amax, a.scale_inv);
    check_launch("dbias_dact_kernel");
  } else if (is_fp8_type<OutT>()) {
    // Nothing to compute, but an FP8 dx still gets its scale_inv, like an empty quantize.
    activation_fwd_kernel<Op, false, InT, OutT><<<1, kThreads, 0, s>>>(
        static_cast<const InT*>(a.input), static_cast<OutT*>(a.output), 0, 0, false, a.scale,
        a.amax, a.scale_inv);
    check_launch("activation kernel");
  }
  launch_dbias_reduce(a.workspace, a.dbias, a.dbias_dtype, row_blocks, a.cols, a.stream);
}

// Dispatch on the input dtype and on the output: the input's own dtype or one of the FP8 types.
#define TE_ACT_SWITCH_OUT(in_dtype, out_dtype, InT, OutT, ...)                          \
  TE_SWITCH_HP(in_dtype, InT, "input",                                                  \
    if (out_dtype == in_dtype) { using OutT = InT; __VA_ARGS__; }                       \
    else { TE_SWITCH_FP8(out_dtype, OutT, "output", __VA_ARGS__); })

template <NVTEActivation A>
void launch_elementwise(const ElementwiseArgs& a) {
  using Op = typename OpOf<A>::type;
  TE_ACT_SWITCH_OUT(a.in_dtype, a.out_dtype, InT, OutT,
                    launch_elementwise_typed<Op, InT, OutT>(a));
}

template <NVTEActivation A>
void launch_dbias(const DbiasArgs& a) {
  using Op = typename OpOf<A>::type;
  TE_ACT_SWITCH_OUT(a.in_dtype, a.out_dtype, InT, OutT, launch_dbias_typed<Op, InT, OutT>(a));
}

}  // namespace act
}  // namespace te

// One line per activation file: compiles every kernel of that activation.
#define TE_INSTANTIATE_ACTIVATION(A)                                                      \
  namespace te {                                                                         \
  namespace act {                                                                        \
  template void launch_elementwise<A>(const ElementwiseArgs&);                           \
  template void launch_dbias<A>(const DbiasArgs&);                                       \
  }                                                                                      \
  }
