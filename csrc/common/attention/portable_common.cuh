// What every portable attention kernel shares beyond its role pieces: the kernel arguments,
// the sequence geometry of a batch entry, the layout of the softmax statistics rows, and the
// register-tiled FMA product of the FMA kernels; the host-side entry points of the kernel
// files. The role pieces have headers of their own: mask.cuh (which pairs are visible),
// online_softmax.cuh (the softmax and its backward), block_range.cuh (which tiles a block
// owns and visits, in what order), tile_pipeline.cuh (the tile loads of the main loops).
//
// Thread layout of every [rows x cols] tile of the FMA kernels: thread t = ty * TX + tx owns
// rows ty*RM .. +RM-1 and the columns tx + TX * c. The TX threads of a row are consecutive lanes
// of one warp (TX divides 32), so row reductions are shuffles over TX lanes: correct on 32-lane
// warps and on 64-lane wavefronts alike (an xor below TX never leaves the group).
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

// Index of query row i of head h of sequence b in the softmax statistics ([b, hq, sq_max]:
// lse, delta) and, times D, in the single-pass backward's dQ sums.
__device__ __forceinline__ int64_t stats_row(const KernelArgs& a, int b, int h, int i) {
  return (int64_t(b) * a.hq + h) * a.sq_max + i;
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
