// The tile scheduler of the portable attention kernels: which tile a block owns, in what order
// the grid hands tiles out, and which tiles of the other side a block visits.
//
// A forward or dQ block owns a query tile of one query head and walks the key tiles that some
// of its queries see (key_range); a dK/dV block owns a key tile of one kv head and walks the
// query tiles that see some of its keys (query_range) in every query head of its GQA group
// (KvBlockWalk). Walks start at the tile boundary at or below the first visible position, so
// the visited tiles are the same tiles a full walk would use, minus the ones the mask hides.
//
// Order: under a causal mask the late query tiles (early key tiles) see the most keys
// (queries). Grids hand those heaviest tiles out first, so that the last blocks to start are
// short ones; the Hopper kernels' one-dimensional grids do it within groups of (head, sequence)
// pairs about one wave wide, so that the blocks in flight share a few heads' K and V (Q, dO)
// in L2.
#pragma once

#include "attention/mask.cuh"

namespace te {
namespace attention {
namespace portable {

// The kv head that query head h reads (GQA: hq / hkv query heads per kv head).
__device__ __forceinline__ int kv_head(const KernelArgs& a, int h) { return h / (a.hq / a.hkv); }

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

// Start of the B-row tile that holds position lo: where a walk over [lo, hi) begins.
template <int B>
__device__ __forceinline__ int tile_start(int lo) {
  return (lo / B) * B;
}

// First row of this block's tile along grid x, the last tile first (heaviest under a causal
// mask).
template <int B>
__device__ __forceinline__ int heaviest_first_start() {
  return (gridDim.x - 1 - blockIdx.x) * B;
}

// ----- the walk of a backward K/V block ---------------------------------------------------------
// A block owns BO keys [k0, k1) of one kv head and walks the BS-row query tiles of [q_first, hi)
// in every query head of its GQA group: `steps` tiles in all, step s = head s / tiles_per_head,
// tile s % tiles_per_head.
struct KvBlockWalk {
  int k1, off, q_first, group, tiles_per_head, steps;
};

// The walk of the block that owns keys [k0, k0 + BO) (sequence geometry and masks only).
template <int BO, int BS>
__device__ __forceinline__ KvBlockWalk kv_block_walk(const KernelArgs& a, const SeqGeom& geo,
                                                     int k0) {
  KvBlockWalk w;
  w.k1 = min(k0 + BO, geo.lk);
  w.off = diag_offset(a, geo);
  int lo, hi;
  query_range(a, w.off, k0, w.k1, geo.lq, &lo, &hi);
  w.q_first = (lo / BS) * BS;
  w.group = a.hq / a.hkv;
  w.tiles_per_head = hi > w.q_first ? (hi - w.q_first + BS - 1) / BS : 0;
  w.steps = w.tiles_per_head * w.group;
  return w;
}

// ----- grouped orders of one-dimensional grids (the Hopper kernels) ----------------------------
// A block's tile: its first row (q0 or k0), its head (query or kv head) and its sequence.
struct BlockTile {
  int row0, head, seq;
};

// Forward: n = ceil(sq_max / BQ) query tiles for each of the hq * batch (head, sequence) pairs;
// block L -> group of GROUP pairs, then the tile's rank in it (heaviest first), then the pair.
template <int BQ, int GROUP>
__device__ __forceinline__ BlockTile grouped_query_tile(const KernelArgs& a) {
  const int n = (a.sq_max + BQ - 1) / BQ, hb_total = gridDim.x / n;
  const int L = blockIdx.x, grp = L / (GROUP * n), gsize = min(GROUP, hb_total - grp * GROUP);
  const int within = L - grp * GROUP * n, rank = within / gsize, hb = grp * GROUP + within % gsize;
  BlockTile t;
  t.row0 = (n - 1 - rank) * BQ;
  t.head = hb % a.hq;
  t.seq = hb / a.hq;
  return t;
}

// Backward: (kv head, sequence) pairs in groups of kKeyGroupSpan / k_tiles (at least one), so
// that a group's blocks are about one wave of a 132-SM chip, and a group's key tiles
// interleaved lowest first (the lowest key tile sees the most query rows under a causal mask).
constexpr int kKeyGroupSpan = 128;
__host__ __device__ __forceinline__ int grouped_pairs(int k_tiles) {
  return k_tiles >= kKeyGroupSpan ? 1 : (kKeyGroupSpan + k_tiles - 1) / k_tiles;
}

// Block of a grid of ceil(skv_max / BK) x hkv x batch blocks: group, then key tile, then
// (kv head, sequence) pair within the group (grouped_pairs).
template <int BK>
__device__ __forceinline__ BlockTile grouped_key_tile(const KernelArgs& a) {
  const int k_tiles = (a.skv_max + BK - 1) / BK;
  const int pairs = static_cast<int>(gridDim.x / k_tiles), span = grouped_pairs(k_tiles);
  const int group = static_cast<int>(blockIdx.x / (k_tiles * span));
  const int within = static_cast<int>(blockIdx.x % (k_tiles * span));
  const int size = min(span, pairs - group * span);  // the last group may hold fewer pairs
  const int pair = group * span + within % size;
  BlockTile t;
  t.head = pair % a.hkv;
  t.seq = pair / a.hkv;
  t.row0 = (within / size) * BK;
  return t;
}

}  // namespace portable
}  // namespace attention
}  // namespace te
