// The load side of the portable attention kernels' main loops: tiles of Q, K, V and dO from a
// [positions, D] head slice into shared memory, and the rows' softmax statistics.
//
// - FMA kernels (portable_fwd.cu, portable_bwd.cu): load_tile, plain loads by every thread,
//   then a barrier; one stage.
// - mma.sync kernels (NVIDIA sm_80+): load_tile_async, cp.async copies into two stages. Every
//   loop iteration waits for its own tile (cp_async_wait<0>), passes a block barrier (after
//   which no warp still reads the other stage), issues the next tile's copies into the other
//   stage and commits them, so the copy of tile t + 1 overlaps the products of tile t. The
//   forward and dQ loops stream K / V tiles (load_kv_async), the dK/dV loops stream Q / dO
//   tiles and their statistics (issue_query_step) while their own K / V stay put
//   (start_kv_block).
// - The Hopper kernels copy into the swizzled layout of portable_wgmma.cuh
//   (load_tile_swizzled), with their own stage counts.
// Rows past the sequence are zero-filled; their statistics are -inf (lse2) and 0 (delta), which
// zero their P and dS.
#pragma once

#include "attention/block_range.cuh"
#include "attention/portable_tc.cuh"

namespace te {
namespace attention {
namespace portable {

// rows [row0, row0 + ROWS) of a [positions, D] slice (stride tok_stride) into smem rows of LD
// elements; rows at or past `valid` are zero. 16-byte global loads, 4-byte shared stores (LD is
// padded by 2 elements so that rows start on different banks).
template <typename T, int ROWS, int D, int LD, int NT>
__device__ __forceinline__ void load_tile(T* smem, const T* gbase, int64_t tok_stride, int row0,
                                          int valid) {
  static_assert(D % 8 == 0 && LD % 2 == 0, "tile rows must hold whole 16-byte chunks");
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += NT) {
    const int r = idx / kChunks, c = idx % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < valid)
      val = *reinterpret_cast<const uint4*>(gbase + int64_t(row0 + r) * tok_stride + c * 8);
    uint32_t* dst = reinterpret_cast<uint32_t*>(smem + r * LD + c * 8);
    dst[0] = val.x;
    dst[1] = val.y;
    dst[2] = val.z;
    dst[3] = val.w;
  }
}

// lse * log2(e) and delta of query rows [q0, q0 + BS) of head h into lse2[0, BS) and
// delta[0, BS), by plain loads (copying these two rows with cp.async as well measured 1-7%
// slower on an H100); rows past the sequence get -inf and 0.
template <int BS, int NT>
__device__ __forceinline__ void load_row_stats(const KernelArgs& a, const SeqGeom& geo, int b,
                                               int h, int q0, float* lse2, float* delta) {
  for (int rr = threadIdx.x; rr < BS; rr += NT) {
    const int i = q0 + rr;
    const int64_t row = stats_row(a, b, h, i);
    lse2[rr] = i < geo.lq ? a.lse[row] * kLog2e : kNegInf;
    delta[rr] = i < geo.lq ? a.delta[row] : 0.f;
  }
}

#if TE_HAS_MMA_SYNC
// Rows [row0, row0 + ROWS) of a [positions, D] slice (stride tok_stride) into shared memory
// rows of tc::TileRow<D>::LD elements, asynchronously (the caller commits and waits); rows at or
// past `valid` are zero-filled.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gbase, int64_t tok_stride,
                                                int row0, int valid) {
  constexpr int kChunks = D / 8, LD = tc::TileRow<D>::LD;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += NT) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool ok = row0 + r < valid;
    // a skipped row reads nothing (size 0) but still needs a valid address
    const T* src = ok ? gbase + int64_t(row0 + r) * tok_stride + c * 8 : gbase;
    mma_sync::cp_async_16(smem + r * LD + c * 8, src, ok ? 16 : 0);
  }
}

// The K and V tiles of key rows [k0, k0 + ROWS) into k_dst and v_dst (cp.async, not committed).
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_kv_async(T* k_dst, T* v_dst, const T* kg, const T* vg,
                                              int64_t tok_stride, int k0, int lk) {
  load_tile_async<T, ROWS, D, NT>(k_dst, kg, tok_stride, k0, lk);
  load_tile_async<T, ROWS, D, NT>(v_dst, vg, tok_stride, k0, lk);
}

// Starts the copies of a dK/dV block's own K and V tiles (not committed) and returns its walk.
template <typename T, int BO, int BS, int D, int NT>
__device__ __forceinline__ KvBlockWalk start_kv_block(const KernelArgs& a, const SeqGeom& geo,
                                                      int hk, int k0, T* k_s, T* v_s) {
  const int64_t kv_head = geo.kv_base + int64_t(hk) * D;
  load_tile_async<T, BO, D, NT>(k_s, static_cast<const T*>(a.k) + kv_head, a.kv_tok_stride, k0,
                                geo.lk);
  load_tile_async<T, BO, D, NT>(v_s, static_cast<const T*>(a.v) + kv_head, a.kv_tok_stride, k0,
                                geo.lk);
  return kv_block_walk<BO, BS>(a, geo, k0);
}

// Issues the copies of step `step` of walk w into stage st: the Q and dO tiles (cp.async, at
// q_s + 2 st BS LD and BS LD further) and the rows' statistics (load_row_stats, lse2 at
// stats_s + 2 st BS, delta BS further).
template <typename T, int BS, int D, int NT>
__device__ __forceinline__ void issue_query_step(const KernelArgs& a, const SeqGeom& geo, int b,
                                                 int hk, const KvBlockWalk& w, int step, int st,
                                                 T* q_s, float* stats_s) {
  constexpr int LD = tc::TileRow<D>::LD;
  const int h = hk * w.group + step / w.tiles_per_head;
  const int q0 = w.q_first + (step % w.tiles_per_head) * BS;
  const int64_t head = geo.q_base + int64_t(h) * D;
  T* dst = q_s + 2 * st * BS * LD;
  load_tile_async<T, BS, D, NT>(dst, static_cast<const T*>(a.q) + head, a.q_tok_stride, q0,
                                geo.lq);
  load_tile_async<T, BS, D, NT>(dst + BS * LD, static_cast<const T*>(a.d_o) + head,
                                a.q_tok_stride, q0, geo.lq);
  float* stats = stats_s + 2 * st * BS;
  load_row_stats<BS, NT>(a, geo, b, h, q0, stats, stats + BS);
}
#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
