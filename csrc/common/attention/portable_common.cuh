// Building blocks of the portable attention kernels (forward and backward): sequence geometry,
// the mask rule of attention.h, tile loads into padded shared memory and a register-tiled
// FMA product over shared-memory tiles.
//
// Thread layout of every [rows x cols] tile: thread t = ty * TX + tx owns rows ty*RM .. +RM-1 and
// the columns tx + TX * c. The TX threads of a row are consecutive lanes of one warp (TX divides
// 32), so row reductions are shuffles over TX lanes: correct on 32-lane warps and on 64-lane
// wavefronts alike (an xor below TX never leaves the group).
#pragma once

#include <math.h>
#include <stdint.h>

#include "attention/attention_backend.h"
#include "util/arch.h"
#include "util/device_utils.cuh"

namespace te {
namespace attention {
namespace portable {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;

// Everything the kernels read; element strides, per layout (see make_kernel_args).
struct KernelArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  const void* d_o;
  float* lse;
  float* delta;  // backward: rowsum(dO * O), [b, hq, sq_max]
  float* dq_acc;  // single-pass backward: fp32 dQ sums, [b, hq, sq_max, D]; else null
  void* dq;
  void* dk;
  void* dv;
  const int32_t* cu_q;
  const int32_t* cu_kv;
  int64_t q_tok_stride, kv_tok_stride;      // elements between consecutive positions
  int64_t q_batch_stride, kv_batch_stride;  // elements between sequences (padded layouts)
  int hq, hkv, sq_max, skv_max;
  int packed;  // THD: sequence starts from cu_seqlens
  float scale, scale_log2;
  int left, right;  // effective window, -1 = unbounded
  int bottom_right;
};

struct SeqGeom {
  int64_t q_base, kv_base;  // element offset of position 0, head 0
  int lq, lk;
};

__device__ __forceinline__ SeqGeom seq_geom(const KernelArgs& a, int b) {
  SeqGeom g;
  if (a.cu_q != nullptr) {
    const int q_start = a.cu_q[b], kv_start = a.cu_kv[b];
    g.lq = min(max(a.cu_q[b + 1] - q_start, 0), a.sq_max);
    g.lk = min(max(a.cu_kv[b + 1] - kv_start, 0), a.skv_max);
    g.q_base = a.packed ? int64_t(q_start) * a.q_tok_stride : int64_t(b) * a.q_batch_stride;
    g.kv_base = a.packed ? int64_t(kv_start) * a.kv_tok_stride : int64_t(b) * a.kv_batch_stride;
  } else {
    g.lq = a.sq_max;
    g.lk = a.skv_max;
    g.q_base = int64_t(b) * a.q_batch_stride;
    g.kv_base = int64_t(b) * a.kv_batch_stride;
  }
  return g;
}

__device__ __forceinline__ int diag_offset(const KernelArgs& a, const SeqGeom& g) {
  return a.bottom_right ? g.lk - g.lq : 0;
}

__device__ __forceinline__ bool visible(const KernelArgs& a, int off, int i, int j, int lq,
                                        int lk) {
  if (i >= lq || j >= lk) return false;
  if (a.right >= 0 && j > i + off + a.right) return false;
  if (a.left >= 0 && j < i + off - a.left) return false;
  return true;
}

// Keys [lo, hi) that some query of [q0, q1) may see.
__device__ __forceinline__ void key_range(const KernelArgs& a, int off, int q0, int q1, int lk,
                                          int* lo, int* hi) {
  *lo = a.left >= 0 ? max(0, q0 + off - a.left) : 0;
  *hi = a.right >= 0 ? min(lk, q1 - 1 + off + a.right + 1) : lk;
}

// Queries [lo, hi) that may see some key of [k0, k1).
__device__ __forceinline__ void query_range(const KernelArgs& a, int off, int k0, int k1, int lq,
                                            int* lo, int* hi) {
  *lo = a.right >= 0 ? max(0, k0 - off - a.right) : 0;
  *hi = a.left >= 0 ? min(lq, k1 - 1 - off + a.left + 1) : lq;
}

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

// acc[r][c] += sum_k a(r, k) * b(k, c): the FMA core of every product of the kernels.
template <int RM, int CN, int K, typename LoadA, typename LoadB>
__device__ __forceinline__ void tile_fma(float (&acc)[RM][CN], LoadA a, LoadB b) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[RM], bv[CN];
#pragma unroll
    for (int r = 0; r < RM; ++r) av[r] = a(r, k);
#pragma unroll
    for (int c = 0; c < CN; ++c) bv[c] = b(k, c);
#pragma unroll
    for (int r = 0; r < RM; ++r)
#pragma unroll
      for (int c = 0; c < CN; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
  }
}

template <int TX>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int o = TX / 2; o > 0; o /= 2) x = fmaxf(x, warp_shfl_xor(x, o));
  return x;
}

template <int TX>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = TX / 2; o > 0; o /= 2) x += warp_shfl_xor(x, o);
  return x;
}

template <int RM, int CN>
__device__ __forceinline__ void zero(float (&acc)[RM][CN]) {
#pragma unroll
  for (int r = 0; r < RM; ++r)
#pragma unroll
    for (int c = 0; c < CN; ++c) acc[r][c] = 0.f;
}

// Host side: strides and pointers of a validated call.
KernelArgs make_kernel_args(const AttnArgs& a);

// Bytes of the backward workspace's delta rows (256-byte multiple); the rest of it is dQ sums.
size_t delta_workspace_bytes(const NVTEAttnParams& p);
// Whether the matrix-unit kernels may run (nvte_attention_set_portable_variant).
bool matrix_units_allowed();
// The tensor-core kernels (portable_fwd_tc.cu, portable_bwd_tc.cu: NVIDIA sm_80+, util/arch.h's
// te::mma_sync); false where they cannot run (AMD: no MFMA path yet; an older NVIDIA device),
// and the caller runs the FMA kernels. dK/dV and dQ run after the delta pass.
bool tensor_cores_usable();
bool forward_tc(const AttnArgs& a);
// The forward on Hopper's warpgroup MMA (portable_fwd_wgmma.cu: NVIDIA sm_90a code on a
// compute capability 9.0 device); false elsewhere, and the caller runs forward_tc.
bool forward_wgmma(const AttnArgs& a);
bool backward_tc(const AttnArgs& a, const KernelArgs& k);
// The single-pass tensor-core backward (portable_bwd_tc_atomic.cu): dQ summed with fp32 atomics
// into k.dq_acc, which the delta pass zeroes; false where it cannot run (no accumulator: a
// deterministic call; no tensor cores).
bool backward_atomic_tc(const AttnArgs& a, const KernelArgs& k);
// The same scheme on Hopper's warpgroup MMA (portable_bwd_wgmma.cu: NVIDIA sm_90a code on a
// compute capability 9.0 device); false elsewhere, and the caller runs backward_atomic_tc.
bool backward_atomic_wgmma(const AttnArgs& a, const KernelArgs& k);

}  // namespace portable
}  // namespace attention
}  // namespace te
