// The mask of the portable attention kernels: which (query i, key j) pairs of a sequence are
// visible, by the rule of attention.h (inside both lengths; a sliding window of `left` keys
// before and `right` keys after the diagonal, -1 = unbounded; the diagonal moved to the
// bottom-right corner when asked). Two forms:
// - per element (visible), the reference form;
// - per tile (tile_all_visible): a tile that holds no masked element skips the per-element
//   test, the common case away from the diagonal and the sequence ends.
// The Hopper forward masks a partly visible tile by one key interval per row (the same rule,
// two compares and a select per element), written in its softmax.
#pragma once

#include "attention/portable_common.cuh"

namespace te {
namespace attention {
namespace portable {

// Key index of query 0's diagonal: 0 top-left, lk - lq bottom-right.
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

// Whether every (query, key) of [q0, q1) x [k0, k1) is visible, keys inside [0, lk): such a tile
// skips the per-element mask. Rows past the sequence may be counted as visible: their results
// are never stored.
__device__ __forceinline__ bool tile_all_visible(const KernelArgs& a, int off, int q0, int q1,
                                                 int k0, int k1, int lk) {
  if (k1 > lk) return false;
  if (a.right >= 0 && k1 - 1 > q0 + off + a.right) return false;
  if (a.left >= 0 && k0 < q1 - 1 + off - a.left) return false;
  return true;
}

}  // namespace portable
}  // namespace attention
}  // namespace te
