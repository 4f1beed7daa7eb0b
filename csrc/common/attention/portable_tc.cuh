// The products of the register-level tensor-core attention kernels (portable_fwd_tc.cu,
// portable_bwd_tc.cu, portable_bwd_tc_atomic.cu) and their fragment layout: NVIDIA-only, on
// te::mma_sync of util/arch.h (mma.sync m16n8k16, ldmatrix). Every product is one warp's: a
// [16 x N] accumulator is a row of N/8 fragments of [16 x 8] floats, laid out as arch.h
// documents, so row statistics are quad shuffles (online_softmax.cuh) and the packed
// accumulator is directly the A operand of the next product (P and dS never touch shared
// memory). The tiles' cp.async loads are in tile_pipeline.cuh.
//
// Shared-memory tiles hold [rows x D] 16-bit elements with rows of D + 8 elements: a row starts
// 16 bytes (four banks) after the previous one, so the eight 16-byte rows an ldmatrix phase reads
// fall on distinct banks, and every row stays 16-byte aligned for cp.async.
#pragma once

#include "attention/portable_common.cuh"

#if TE_HAS_MMA_SYNC
namespace te {
namespace attention {
namespace portable {
namespace tc {

using mma_sync::ldmatrix_x4;
using mma_sync::ldmatrix_x4_trans;
using mma_sync::pack2;
using mma_sync::unpack2;

constexpr int kLanes = 32;

template <int D>
struct TileRow {
  static constexpr int LD = D + 8;  // elements per shared row
};

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
}

// acc[m][16 x N] += A[16 x D] . B[N x D]^T for the MT row blocks m of 16 rows of A (a warp that
// owns MT * 16 rows); A's rows and B's N rows in shared memory. Every B fragment read from shared
// memory feeds MT products instead of one, which halves (MT = 2) the shared-memory traffic per
// product; that traffic, not the tensor cores, bounds the MT = 1 form.
template <typename T, int D, int N, int MT>
__device__ __forceinline__ void mma_rows_rows_mt(float (&acc)[MT][N / 8][4], const T* a_s,
                                                 const T* b_s, int lane) {
  constexpr int LD = TileRow<D>::LD;
  // A: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15), lane l gives row l % 16, col 8 (l / 16)
  const T* a_row = a_s + (lane % 16) * LD + 8 * (lane / 16);
  // B: lane l gives row (l % 8) + 8 (l / 16), col 8 ((l / 8) % 2): words 0, 1 are b0, b1 of
  // the first 8 rows, words 2, 3 those of the next 8
  const T* b_row = b_s + ((lane % 8) + 8 * (lane / 16)) * LD + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) ldmatrix_x4(a[m], a_row + 16 * m * LD + 16 * kk);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_row + 16 * np * LD + 16 * kk);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma_sync::mma16816<T>(acc[m][2 * np], a[m], b[0], b[1]);
        mma_sync::mma16816<T>(acc[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// acc[m][16 x D] += P_m[16 x N] . B[N x D] for MT row blocks; P as A fragments in registers
// (pack_a), B's N rows of D in shared memory (read transposed).
template <typename T, int D, int N, int MT>
__device__ __forceinline__ void mma_frag_rows_mt(float (&acc)[MT][D / 8][4],
                                                 const uint32_t (&p)[MT][N / 16][4],
                                                 const T* b_s, int lane) {
  constexpr int LD = TileRow<D>::LD;
  // matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) transposed: words 0, 1 are b0, b1 of the
  // first 8 columns, words 2, 3 those of the next 8
  const T* b_row = b_s + (lane % 16) * LD + 8 * (lane / 16);
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_row + 16 * kk * LD + 16 * dp);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma_sync::mma16816<T>(acc[m][2 * dp], p[m][kk], b[0], b[1]);
        mma_sync::mma16816<T>(acc[m][2 * dp + 1], p[m][kk], b[2], b[3]);
      }
    }
  }
}

// The same products for a warp that owns one row block of 16.
template <typename T, int D, int N>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[N / 8][4], const T* a_s, const T* b_s,
                                              int lane) {
  mma_rows_rows_mt<T, D, N, 1>(reinterpret_cast<float(&)[1][N / 8][4]>(acc), a_s, b_s, lane);
}
template <typename T, int D, int N>
__device__ __forceinline__ void mma_frag_rows(float (&acc)[D / 8][4], const uint32_t (&p)[N / 16][4],
                                              const T* b_s, int lane) {
  mma_frag_rows_mt<T, D, N, 1>(reinterpret_cast<float(&)[1][D / 8][4]>(acc),
                               reinterpret_cast<const uint32_t(&)[1][N / 16][4]>(p), b_s, lane);
}

// The accumulator [16 x N] as A fragments of a product over its N columns, in T.
template <typename T, int N>
__device__ __forceinline__ void pack_a(uint32_t (&p)[N / 16][4], const float (&s)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    p[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Value e of fragment n of a packed A row: inverse of pack_a for one element pair.
template <typename T, int N>
__device__ __forceinline__ float2 packed_pair(const uint32_t (&p)[N / 16][4], int n, int half) {
  return unpack2<T>(p[n / 2][(n % 2) * 2 + half]);
}

// dst[0] += x, dst[1] += y (8-byte aligned), without reading the result back.
__device__ __forceinline__ void red_add_pair(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// Writes a [16 x D] accumulator * scale as rows row0 + g, row0 + g + 8 of a [positions, D] slice
// (rows < valid): each lane stores two elements per fragment and row.
template <typename T, int D>
__device__ __forceinline__ void store_acc(const float (&acc)[D / 8][4], T* base,
                                          int64_t tok_stride, int row0, int valid, float scale0,
                                          float scale1, int lane) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= valid) continue;
    const float s = half ? scale1 : scale0;
    uint32_t* out = reinterpret_cast<uint32_t*>(base + int64_t(row) * tok_stride + 2 * q);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      out[4 * n] = pack2<T>(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
  }
}

}  // namespace tc

// dq = scale * dq_acc in the output dtype, after a single-pass backward summed dQ into k.dq_acc
// (portable_bwd_tc_atomic.cu, portable_bwd_wgmma.cu).
void convert_dq_sums(const AttnArgs& args, const KernelArgs& k);

}  // namespace portable
}  // namespace attention
}  // namespace te
#endif  // TE_HAS_MMA_SYNC
