// The softmax of the portable attention kernels, in the log2 domain (scores scaled by
// scale * log2(e), exponentials as exp2).
//
// Forward, online: key tiles arrive one at a time; each row keeps a running max m and a running
// sum l of exp2(s - m). A tile folds its row max into m (update_row_max), which shrinks the
// earlier sum and output rows by alpha = exp2(m_old - m_new); the output is divided by the sum
// once, at the end (row_inverse), and the row's log-sum-exp (natural log) goes to the
// statistics the backward reads (store_row_lse). A row that has seen no visible key yet keeps
// m = -inf and subtracts 0, so its scores (-inf) give p = 0 rather than NaN; a row that never
// sees one ends with sum 0, output 0 and lse -inf.
//
// Backward: P is recomputed from the stored statistics, p = exp2(s scale log2(e) - lse log2(e))
// (prob_from_lse; zero where the score is masked or its row saw nothing),
// and dS = P (dP - delta) with delta = rowsum(dO O) (score_grad).
//
// Row reductions: in the FMA kernels a row spans TX consecutive lanes (group_max / group_sum),
// in an mma accumulator the four lanes of a quad (quad_max / quad_sum); within a thread, trees
// (log2 N dependent steps instead of N).
#pragma once

#include "attention/mask.cuh"

namespace te {
namespace attention {
namespace portable {

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

// Max / sum over the four lanes of a quad (one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, warp_shfl_xor(x, 1));
  return fmaxf(x, warp_shfl_xor(x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += warp_shfl_xor(x, 1);
  return x + warp_shfl_xor(x, 2);
}

// Max / sum of N values as a tree; v is overwritten.
template <int N>
__device__ __forceinline__ float tree_max(float (&v)[N]) {
#pragma unroll
  for (int w = N / 2; w > 0; w /= 2)
#pragma unroll
    for (int n = 0; n < w; ++n) v[n] = fmaxf(v[n], v[n + w]);
  return v[0];
}
template <int N>
__device__ __forceinline__ float tree_sum(float (&v)[N]) {
#pragma unroll
  for (int w = N / 2; w > 0; w /= 2)
#pragma unroll
    for (int n = 0; n < w; ++n) v[n] += v[n + w];
  return v[0];
}

// Folds a tile's row max (scaled, log2 domain) into the running max m. Returns the value this
// tile's scores subtract before exp2 (0 while the row has seen no visible key) and sets alpha,
// the factor for the row's earlier sum and output.
__device__ __forceinline__ float update_row_max(float& m, float tile_max, float& alpha) {
  const float m_new = fmaxf(m, tile_max);
  const float m_use = m_new == kNegInf ? 0.f : m_new;
  alpha = fast_exp2_ftz(m - m_use);
  m = m_new;
  return m_use;
}

// 1 / the row's final sum; 0 for a row that saw no visible key.
__device__ __forceinline__ float row_inverse(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

// The row's log-sum-exp (natural log) from its running max and final sum, into the statistics
// rows ([b, hq, sq_max], stats_row); -inf for a row that saw no visible key.
__device__ __forceinline__ void store_row_lse(const KernelArgs& a, int b, int h, int i, float m,
                                              float sum) {
  a.lse[stats_row(a, b, h, i)] = sum > 0.f ? (m + log2f(sum)) / kLog2e : kNegInf;
}

// Backward: p of a raw score s from its row's lse2 = lse * log2(e).
__device__ __forceinline__ float prob_from_lse(float s, float scale_log2, float lse2) {
  return fast_exp2_ftz(fmaf(s, scale_log2, -lse2));
}

// Backward: dS of one score from its p, dP and its row's delta.
__device__ __forceinline__ float score_grad(float p, float dp, float delta) {
  return p * (dp - delta);
}

}  // namespace portable
}  // namespace attention
}  // namespace te
