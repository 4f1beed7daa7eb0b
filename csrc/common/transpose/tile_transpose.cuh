// The one tile engine of the transpose family: a [rows, cols] row-major result written row-major
// and transposed in one pass, for the plain transpose, the FP8 cast+transpose and its fusions
// (dbias, activation, activation backward).
//
// A block owns a tile of kDim x kDim elements, kDim = 8 * kSeg where kSeg = 16 / sizeof(OutT)
// (the elements of one 16-byte output access). Phase 1 reads each row of the tile as 8 segments
// of kSeg elements, converts them, writes the row-major output directly and parks the converted
// segment in shared memory. Phase 2 reads kSeg consecutive rows of one column from shared memory
// and writes them as one 16-byte access of the transposed output.
//
// Shared memory is swizzled at 16-byte granularity: segment s of row r lives in chunk
// s ^ ((r / kSeg) % 8). In phase 2 the 8 threads that write one 128-byte run of a transposed row
// read the same column in 8 different row groups, which the swizzle spreads over 8 different
// bank groups instead of one.
//
// What an element of the result is comes from a Producer (see the producers below): the plain
// copy, a cast of one input, act(x), dact(grad, x) and their gated forms. The engine owns the
// tiling, the bounds, the FP8 scaling and amax, and optionally one row of fp32 column sums per
// row of tiles (the first stage of a dbias reduction).
#pragma once

#include "recipe/delayed_scaling.cuh"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace tile_transpose {

constexpr int kThreads = 256;
constexpr int kSegsPerRow = 8;  // 8 x 16 bytes: a 128-byte row of output per tile row

template <typename OutT>
struct Tile {
  static constexpr int kSeg = 16 / sizeof(OutT);
  static constexpr int kDim = kSegsPerRow * kSeg;
  static constexpr int kRowsPerPass = kThreads / kSegsPerRow;  // 32
  static constexpr int kPasses = kDim / kRowsPerPass;            // kSeg / 4
  static_assert(kPasses >= 1, "element type too wide for this tile");
};

// Rows of tiles of an FP8 result, i.e. the rows of the dbias workspace [row_tiles, cols].
inline int64_t fp8_row_tiles(int64_t rows) {
  constexpr int64_t kDim = Tile<fp8e4m3>::kDim;
  return (rows + kDim - 1) / kDim;
}

// Resident blocks per SM (the register cap) and the bytes of loads a thread issues together in
// phase 1, per kind of producer. Several blocks keep loads in flight while others are in their
// shared-memory phase; more bytes per thread do the same within a block, at the cost of registers.
// Swept on an H100 (bf16 -> FP8, 16384 x 16384 and 16384 x 4096; results bit-identical):
//   one input, no column sums (cast, act): 4 blocks, 64 bytes. act+cast+transpose 3.6-4.6% faster
//     than 3 blocks with 256 bytes, the plain cast+transpose equal;
//   two inputs with column sums (dact+dbias): 3 blocks, 64 bytes, 12% faster than 2 with 128;
//   the rest (cast+dbias, gated forms): 2 blocks, 128 bytes; tighter caps spill or were slower.
// Then on an H200 (4096 x 8192, 8192 x 4096, 6144 x 4096, 16384 x 4096; us against a bf16 copy
// of the same tensor), one input at 4 blocks with 32 bytes instead of 64: the 1-byte transpose
// (four passes of 16 bytes per group before, two now) 32.1 -> 22.4 us at 4096 x 8192 (58% -> 84%
// of the copy's rate), gelu+cast+transpose 47.6 -> 45.2 (72% -> 76%), cast+transpose 39.9 ->
// 39.2; 16 bytes or 3 and 5 blocks were slower. cast+transpose+dbias (one input with column
// sums) at 3 blocks, 32 bytes instead of 2 and 128: 35.2 -> 32.9 us at 4096 x 6144, 84.6 -> 78.8
// at 16384 x 4096 (80 registers, no spill; 4 blocks spill, 64 bytes or 2 blocks were slower).
// dact+dbias stays at 3 blocks, 64 bytes (68.9 us, 75%: 2 or 4 blocks, 32 or 128 bytes were
// equal or slower; with dy * x in place of its GELU derivative it takes 59.7 us, so the
// derivative's arithmetic, not the loads, holds it under the plain cast).
// AMD keeps the shapes of before those sweeps (3 and 2 blocks, 256 and 128 bytes): nothing was
// measured there, and hipcc cannot fit these kernels in the registers of 4 resident 256-thread
// blocks per CU (it reports the occupancy target missed).
#if TE_PLATFORM_ROCM
constexpr int kBlocksOneInput = 3, kBytesOneInput = 256, kBlocksDact = 2, kBytesDact = 128;
constexpr int kBlocksOneInputSums = 2, kBytesOneInputSums = 128;
#else
constexpr int kBlocksOneInput = 4, kBytesOneInput = 32, kBlocksDact = 3, kBytesDact = 64;
constexpr int kBlocksOneInputSums = 3, kBytesOneInputSums = 32;
#endif

template <class Producer, bool kSums>
__host__ __device__ constexpr int min_blocks_per_sm() {
  return Producer::kInputs == 1 ? (kSums ? kBlocksOneInputSums : kBlocksOneInput)
                                : (Producer::kInputs == 2 && kSums ? kBlocksDact : 2);
}

template <class Producer, bool kSums>
__host__ __device__ constexpr int load_budget_bytes() {
  return Producer::kInputs == 1 ? (kSums ? kBytesOneInputSums : kBytesOneInput)
                                : (Producer::kInputs == 2 && kSums ? kBytesDact : 128);
}

// Passes of phase 1 whose loads are issued together: as many as the budget above holds, at least
// one.
template <class Producer, bool kSums, int kSeg, int kPasses>
__host__ __device__ constexpr int load_group() {
  constexpr int kBytesPerPass = Producer::kInputs * kSeg * int(sizeof(typename Producer::InT));
  constexpr int g = load_budget_bytes<Producer, kSums>() / kBytesPerPass;
  return g < 1 ? 1 : (g > kPasses ? kPasses : g);
}

// ----- producers -------------------------------------------------------------------------------
// A producer reads kInputs tensors of InT and defines each element of the result:
//   load_seg(v, r, c)    loads what the kSeg elements at result columns c .. c+kSeg-1 of row r
//                        need (vector path: the segment is inside and 16-byte aligned);
//   load_one(v, k, r, c) element k of a segment, at result column c (scalar path);
//   value(v, k, c)       the fp32 result of element k. On the vector path c is the column of
//                        the segment's first element (producers whose formula depends on the
//                        column need their boundary to be a multiple of kSeg there);
//   vector_ok(seg)       (host) whether the inputs allow the vector path with seg-element
//                        segments (pointer alignment, widths).

// Result = the input itself (transpose, cast+transpose, cast+transpose+dbias).
template <typename T>
struct CopyProducer {
  using InT = T;
  static constexpr int kInputs = 1;
  const T* x;
  int64_t cols;
  template <int N> __device__ void load_seg(Vec<T, N> (&v)[kInputs], int64_t r, int64_t c) const {
    v[0].load(x + r * cols + c);
  }
  template <int N>
  __device__ void load_one(Vec<T, N> (&v)[kInputs], int k, int64_t r, int64_t c) const {
    v[0].v[k] = x[r * cols + c];
  }
  template <int N> __device__ float value(const Vec<T, N> (&v)[kInputs], int k, int64_t) const {
    return to_float(v[0].v[k]);
  }
  bool vector_ok(int) const { return aligned16(x); }
};

// An input of one row of tiles has its column sums complete in this kernel: they are the bias
// gradient itself, written here in dbias's dtype (saving the reduce launch, which on a small
// host-bound step costs more than the kernel). As the reduce kernel rounds them: s + 0 (so a -0
// sum is +0 there too), then converted once; the bits are the same.
__device__ __forceinline__ void store_final_sum(void* dbias, int dtype, int64_t c, float s) {
  s += 0.f;
  if (dtype == kNVTEFloat32)
    static_cast<float*>(dbias)[c] = s;
  else if (dtype == kNVTEFloat16)
    static_cast<fp16*>(dbias)[c] = from_float<fp16>(s);
  else
    static_cast<bf16*>(dbias)[c] = from_float<bf16>(s);
}

// ----- the kernel ------------------------------------------------------------------------------
// kCast: out = fp8(value * scale) with amax; otherwise out = the input's bits (copy producer,
// InT == OutT). kAligned: rows, cols are multiples of kSeg and pointers 16-byte aligned, so every
// segment is either wholly inside the tensor or wholly outside and moves as one vector.
// kSums: one fp32 column sum of the unrounded values per column and row of tiles goes to
// partial[row_tile, col] (skipped when partial is null), or straight into dbias (dtype
// dbias_dtype) when dbias is not null (an input of one row of tiles: the sums are final).
// One block's work: tile number `tile` of the result (row-major over the tiles). The kernels
// below call it with their block's tile (one tensor) or a tile of one of several tensors. ld_t:
// the distance between rows of out_t (rows, or more when the result is a band of rows of a
// larger tensor whose transpose out_t points into).
template <class Producer, typename OutT, bool kCast, bool kAligned, bool kSums>
__device__ __forceinline__ void transpose_tile(
    const Producer& prod, OutT* __restrict__ out, OutT* __restrict__ out_t, int64_t rows,
    int64_t cols, const float* __restrict__ scale_ptr, float* __restrict__ amax_ptr,
    float* __restrict__ scale_inv_ptr, float* __restrict__ partial, void* __restrict__ dbias,
    int dbias_dtype, int64_t tile, int64_t ld_t) {
  using T = Tile<OutT>;
  using InT = typename Producer::InT;
  constexpr int kSeg = T::kSeg;
  constexpr int kIn = Producer::kInputs;
  constexpr int kGroup = load_group<Producer, kSums, kSeg, T::kPasses>();
  static_assert(T::kPasses % kGroup == 0, "load groups must tile the passes");
  constexpr int kWarps = kThreads / TE_WARP_SIZE;
  __shared__ alignas(16) OutT smem[T::kDim][T::kDim];
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
  __shared__ float col_sums[kSums ? kWarps : 1][kSums ? T::kDim : 1];

  const int64_t col_tiles = cols > 0 ? (cols + T::kDim - 1) / T::kDim : 1;
  const int64_t row_tile = tile / col_tiles;
  const int64_t row0 = row_tile * T::kDim;
  const int64_t col0 = (tile % col_tiles) * T::kDim;
  const int seg = threadIdx.x % kSegsPerRow;
  float scale = 1.f;
  if (kCast) {
    scale = *scale_ptr;
    if (scale_inv_ptr != nullptr && tile == 0 && threadIdx.x == 0) *scale_inv_ptr = 1.f / scale;
  }
  float amax = 0.f;
  float sums[kSums ? kSeg : 1];
#pragma unroll
  for (int k = 0; k < (kSums ? kSeg : 1); ++k) sums[k] = 0.f;

  // Phase 1, kGroup passes at a time: all loads of a group first, so they are in flight together.
#pragma unroll
  for (int p0 = 0; p0 < T::kPasses; p0 += kGroup) {
    Vec<InT, kSeg> x[kGroup][kIn];
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      const int r = (p0 + q) * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
      const int64_t gr = row0 + r, gc = col0 + seg * kSeg;
      if (kAligned) {
        if (gr < rows && gc < cols) prod.load_seg(x[q], gr, gc);
      } else {
#pragma unroll
        for (int k = 0; k < kSeg; ++k)
          if (gr < rows && gc + k < cols) prod.load_one(x[q], k, gr, gc + k);
      }
    }
#pragma unroll
    for (int q = 0; q < kGroup; ++q) {
      const int r = (p0 + q) * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
      const int64_t gr = row0 + r, gc = col0 + seg * kSeg;
      Vec<OutT, kSeg> y;
#pragma unroll
      for (int k = 0; k < kSeg; ++k) {
        if constexpr (kCast) {
          const float f = prod.value(x[q], k, kAligned ? gc : gc + k);
          const bool inside = kAligned ? (gr < rows && gc < cols) : (gr < rows && gc + k < cols);
          if (inside) {
            amax = amax_step(amax, f);
            if constexpr (kSums) sums[k] += f;
          }
          y.v[k] = from_float<OutT>(f * scale);
        } else {
          y.v[k] = x[q][0].v[k];
        }
      }
      const int chunk = seg ^ ((r / kSeg) % kSegsPerRow);
      y.store(&smem[r][chunk * kSeg]);
      OutT* dst = out == nullptr ? nullptr : out + gr * cols + gc;
      if (dst != nullptr) {
        if (kAligned) {
          if (gr < rows && gc < cols) y.store(dst);
        } else {
#pragma unroll
          for (int k = 0; k < kSeg; ++k)
            if (gr < rows && gc + k < cols) dst[k] = y.v[k];
        }
      }
    }
  }

  // Column sums: the threads of one segment are every 8th lane, so a butterfly over lane
  // distances 8, 16, ... sums a warp's rows; one row per warp then goes to shared memory.
  if constexpr (kSums) {
    if (partial != nullptr) {  // uniform across the block
#pragma unroll
      for (int k = 0; k < kSeg; ++k)
#pragma unroll
        for (int d = kSegsPerRow; d < TE_WARP_SIZE; d *= 2) sums[k] += warp_shfl_xor(sums[k], d);
      const int lane = threadIdx.x % TE_WARP_SIZE;
      if (lane < kSegsPerRow) {
#pragma unroll
        for (int k = 0; k < kSeg; ++k)
          col_sums[threadIdx.x / TE_WARP_SIZE][lane * kSeg + k] = sums[k];
      }
    }
  }
  __syncthreads();

  // Phase 2: thread (group g = tid % 8, column c) gathers rows g*kSeg .. g*kSeg+kSeg-1.
  const int g = threadIdx.x % kSegsPerRow;
#pragma unroll
  for (int p = 0; p < T::kPasses; ++p) {
    const int c = p * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
    const int chunk = (c / kSeg) ^ g;
    Vec<OutT, kSeg> y;
#pragma unroll
    for (int k = 0; k < kSeg; ++k) y.v[k] = smem[g * kSeg + k][chunk * kSeg + c % kSeg];
    const int64_t gc = col0 + c, gr = row0 + g * kSeg;
    OutT* dst = out_t + gc * ld_t + gr;
    if (kAligned) {
      if (gc < cols && gr < rows) y.store(dst);
    } else {
#pragma unroll
      for (int k = 0; k < kSeg; ++k)
        if (gc < cols && gr + k < rows) dst[k] = y.v[k];
    }
  }

  if constexpr (kSums) {
    if (partial != nullptr) {
      for (int c = threadIdx.x; c < T::kDim; c += kThreads) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += col_sums[w][c];
        if (col0 + c < cols) {
          if (dbias != nullptr)
            store_final_sum(dbias, dbias_dtype, col0 + c, s);
          else
            partial[row_tile * cols + col0 + c] = s;
        }
      }
    }
  }

  if (kCast && amax_ptr != nullptr) {
    amax = block_reduce_max(amax, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax_ptr, amax);
  }
}

template <class Producer, typename OutT, bool kCast, bool kAligned, bool kSums>
__global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<Producer, kSums>()))
tile_transpose_kernel(const Producer prod, OutT* __restrict__ out, OutT* __restrict__ out_t,
                      int64_t rows, int64_t cols, const float* __restrict__ scale_ptr,
                      float* __restrict__ amax_ptr, float* __restrict__ scale_inv_ptr,
                      float* __restrict__ partial, void* __restrict__ dbias, int dbias_dtype,
                      int64_t ld_t) {
  transpose_tile<Producer, OutT, kCast, kAligned, kSums>(prod, out, out_t, rows, cols, scale_ptr,
                                                         amax_ptr, scale_inv_ptr, partial, dbias,
                                                         dbias_dtype, blockIdx.x, ld_t);
}

// ----- several tensors in one launch -----------------------------------------------------------
// The FP8 casts+transposes of one step (a Linear's input and weight) as one grid: on a small,
// host-bound step a launch costs more than the kernel. Tensor i owns tiles [first_tile[i],
// first_tile[i + 1]) of the grid, at least one (an empty tensor's block writes its scale_inv,
// as the single launch does). Each tile is computed exactly as tile_transpose_kernel computes it.
constexpr int kMaxMultiTensors = 4;

template <typename InT, typename OutT>
struct MultiCastTable {
  const InT* in[kMaxMultiTensors];
  OutT* out[kMaxMultiTensors];
  OutT* out_t[kMaxMultiTensors];
  const float* scale[kMaxMultiTensors];
  float* amax[kMaxMultiTensors];
  float* scale_inv[kMaxMultiTensors];
  int64_t rows[kMaxMultiTensors], cols[kMaxMultiTensors];
  int64_t first_tile[kMaxMultiTensors + 1];
  int n;
};

// Float8CurrentScaling inside the cast: the scales come from the amax of the inputs, so every
// block needs the amax of all of its tensor's tiles before it casts. With every block of the
// grid resident at once (a cooperative launch: the host checks that the grid fits), the blocks
// meet at a grid-wide barrier: each maxes its tile into amax[i] and counts itself in; once all
// have, each computes scale[i] the way nvte_current_scaling_scales does (same bits), the first
// tile's block stores it (and counts a non-finite amax, as that function does), and the block
// that counts last a second time leaves amax and counter zero. On a small, host-bound step this
// saves the launch of the scales kernel.
struct GridScaling {
  float* amax;       // [n] zero on entry, left zero
  int* counter;      // zero on entry, left zero
  float* scale;      // [n] read (kept when the amax is 0 or not finite), then written
  float* scale_inv;  // [n] written
  int* skipped;      // [n] +1 for a non-finite amax, or null: not counted
  float fp8_max;
  int n;
};

// This thread's part of the amax of the values its block will quantize (phase 1's positions).
template <class Producer, typename OutT, bool kAligned>
__device__ float tile_amax(const Producer& prod, int64_t rows, int64_t cols, int64_t tile) {
  using T = Tile<OutT>;
  constexpr int kSeg = T::kSeg;
  const int64_t col_tiles = cols > 0 ? (cols + T::kDim - 1) / T::kDim : 1;
  const int64_t row0 = (tile / col_tiles) * T::kDim, col0 = (tile % col_tiles) * T::kDim;
  const int64_t gc = col0 + (threadIdx.x % kSegsPerRow) * kSeg;
  float amax = 0.f;
#pragma unroll
  for (int p = 0; p < T::kPasses; ++p) {
    const int64_t gr = row0 + p * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
    Vec<typename Producer::InT, kSeg> x[Producer::kInputs];
    if (kAligned) {
      if (gr < rows && gc < cols) {
        prod.load_seg(x, gr, gc);
#pragma unroll
        for (int k = 0; k < kSeg; ++k) amax = amax_step(amax, prod.value(x, k, gc));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kSeg; ++k)
        if (gr < rows && gc + k < cols) {
          prod.load_one(x, k, gr, gc + k);
          amax = amax_step(amax, prod.value(x, k, gc + k));
        }
    }
  }
  return amax;
}

// The scale of tensor i for this block, in *s_scale (all blocks co-resident: see above).
__device__ __forceinline__ void grid_current_scale(float amax, int i, int64_t tile,
                                                   const GridScaling& g, float* s_scale,
                                                   float* scratch) {
  amax = block_reduce_max(amax, scratch);
  if (threadIdx.x == 0) {
    const float old = g.scale[i];  // read before the barrier, written only after it
    atomic_max_nonneg(g.amax + i, amax);
    __threadfence();
    const int blocks = int(gridDim.x);
    atomicAdd(g.counter, 1);
    while (atomicOr(g.counter, 0) < blocks) {
    }
    __threadfence();
    const float a = __int_as_float(atomicOr(reinterpret_cast<int*>(g.amax + i), 0));
    float s = old;
    const float candidate = g.fp8_max / a;
    if (a > 0.f && isfinite(a) && isfinite(candidate)) s = candidate;
    *s_scale = s;
    if (tile == 0) {
      g.scale[i] = s;
      g.scale_inv[i] = 1.f / s;
      if (g.skipped != nullptr && !isfinite(a)) g.skipped[i] += 1;  // one block per tensor
    }
    if (atomicAdd(g.counter, 1) == 2 * blocks - 1) {  // every block has read its amax
      for (int j = 0; j < g.n; ++j) atomicExch(g.amax + j, 0.f);
      atomicExch(g.counter, 0);
    }
  }
  __syncthreads();
}

template <typename InT, typename OutT, bool kAligned, bool kCurrent>
__global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<CopyProducer<InT>, false>()))
multi_cast_transpose_kernel(const MultiCastTable<InT, OutT> t, const GridScaling g) {
  int i = 0;
  while (i + 1 < t.n && int64_t(blockIdx.x) >= t.first_tile[i + 1]) ++i;
  const int64_t tile = blockIdx.x - t.first_tile[i];
  const CopyProducer<InT> prod{t.in[i], t.cols[i]};
  const float* scale = t.scale[i];
  if constexpr (kCurrent) {
    __shared__ float s_scale;
    __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
    grid_current_scale(tile_amax<CopyProducer<InT>, OutT, kAligned>(prod, t.rows[i], t.cols[i], tile),
                       i, tile, g, &s_scale, scratch);
    scale = &s_scale;
  }
  transpose_tile<CopyProducer<InT>, OutT, true, kAligned, false>(
      prod, t.out[i], t.out_t[i], t.rows[i], t.cols[i], scale, t.amax[i], t.scale_inv[i],
      nullptr, nullptr, 0, tile, t.rows[i]);
}

// Launches the kernel over the [rows, cols] result. `partial` (kSums only) is null or
// [fp8_row_tiles(rows), cols] fp32. With `dbias` (kSums, one row of tiles only: see
// dbias_sums_are_final) the column sums go to dbias directly instead. ld_t: as transpose_tile's
// (rows when negative).
template <class Producer, typename OutT, bool kCast, bool kSums>
void launch_tiles(const Producer& prod, OutT* out, OutT* out_t, int64_t rows, int64_t cols,
                  const float* scale, float* amax, float* scale_inv, float* partial,
                  cudaStream_t stream, void* dbias = nullptr, NVTEDType dbias_dtype = kNVTEFloat32,
                  int64_t ld_t = -1) {
  using T = Tile<OutT>;
  if (ld_t < 0) ld_t = rows;
  const int64_t tiles = ((rows + T::kDim - 1) / T::kDim) * ((cols + T::kDim - 1) / T::kDim);
  TE_CHECK_ARG(tiles < (int64_t(1) << 31), "tensor of ", rows, " x ", cols, " is too large");
  if (tiles == 0) {
    // An empty tensor still gets its scale_inv written; the one block touches no data.
    if (kCast)
      tile_transpose_kernel<Producer, OutT, kCast, false, kSums><<<1, kThreads, 0, stream>>>(
          prod, out, out_t, 0, 0, scale, amax, scale_inv, nullptr, nullptr, 0, 0);
    check_launch("tile_transpose_kernel");
    return;
  }
  const bool aligned = rows % T::kSeg == 0 && cols % T::kSeg == 0 && ld_t % T::kSeg == 0 &&
                       prod.vector_ok(T::kSeg) && aligned16(out_t) &&
                       (out == nullptr || aligned16(out));
  const unsigned grid = unsigned(tiles);
  if (aligned)
    tile_transpose_kernel<Producer, OutT, kCast, true, kSums><<<grid, kThreads, 0, stream>>>(
        prod, out, out_t, rows, cols, scale, amax, scale_inv, partial, dbias, int(dbias_dtype),
        ld_t);
  else
    tile_transpose_kernel<Producer, OutT, kCast, false, kSums><<<grid, kThreads, 0, stream>>>(
        prod, out, out_t, rows, cols, scale, amax, scale_inv, partial, dbias, int(dbias_dtype),
        ld_t);
  check_launch("tile_transpose_kernel");
}

// ----- a step's scaling inside cast+transpose+dbias ---------------------------------------------
// The FP8 backward of a small, host-bound step casts its output gradient with cast+transpose+
// dbias and then needs, with Float8CurrentScaling, the gradient's scale before the cast (a
// launch of its own), with DelayedScaling, the step's update after the cast (one more launch).
// These kernels fold either into the cast: current scaling through the grid-wide barrier above
// (cooperative launch), the delayed update in the block that finishes last (any grid: the other
// blocks do not wait for it).
constexpr int kStepGroups = 4;

struct StepUpdate {
  NVTEScalingGroup groups[kStepGroups];
  int num_groups;
  int most_recent;
  float margin_pow2;
  int* counter;  // zero on entry, left zero
};

// After this block's amax was recorded: the block that counts itself last runs the update of
// every tensor of every group (each tensor's history row 0 then holds every block's amax).
__device__ __forceinline__ void step_update_if_last(const StepUpdate& u, float* warp_max) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's amax (recorded by thread 0) before its count
    last = atomicAdd(u.counter, 1) == int(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int g = 0; g < u.num_groups; ++g)
    for (int64_t j = 0; j < u.groups[g].num_tensors; ++j)
      delayed_update_tensor(u.groups[g], j, u.most_recent, u.margin_pow2, warp_max);
  if (threadIdx.x == 0) atomicExch(u.counter, 0);
}

enum class DbiasFusion { kCurrentScaling, kStepUpdate };

template <typename InT, typename OutT, bool kAligned, DbiasFusion kFusion>
__global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<CopyProducer<InT>, true>()))
cast_transpose_dbias_fused_kernel(const CopyProducer<InT> prod, OutT* __restrict__ out,
                                  OutT* __restrict__ out_t, int64_t rows, int64_t cols,
                                  const float* scale, float* amax, float* scale_inv,
                                  float* partial, void* dbias, int dbias_dtype,
                                  const GridScaling g, const StepUpdate u) {
  const int64_t tile = blockIdx.x;
  __shared__ float s_scale;
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];
  if constexpr (kFusion == DbiasFusion::kCurrentScaling) {
    grid_current_scale(tile_amax<CopyProducer<InT>, OutT, kAligned>(prod, rows, cols, tile), 0,
                       tile, g, &s_scale, scratch);
    scale = &s_scale;
  }
  transpose_tile<CopyProducer<InT>, OutT, true, kAligned, true>(
      prod, out, out_t, rows, cols, scale, amax, scale_inv, partial, dbias, dbias_dtype, tile,
      rows);
  if constexpr (kFusion == DbiasFusion::kStepUpdate) step_update_if_last(u, scratch);
}

}  // namespace tile_transpose
}  // namespace te
