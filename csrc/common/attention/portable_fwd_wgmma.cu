// Portable attention forward on Hopper's warpgroup MMA (portable_wgmma.cuh), the NVIDIA sm_90a
// path; forward_wgmma() declines elsewhere and portable_forward() runs the mma.sync kernel
// (portable_fwd_tc.cu), which also keeps every other NVIDIA arch.
//
// One block per (BQ = 64 WARPGROUPS query rows, query head, sequence); warpgroup w owns rows
// 64 w .. 64 w + 63. The Q tile stays in shared memory; K and V tiles of BK rows stream through
// STAGES shared-memory stages each (3 at D = 128, 2 at D = 64; cp.async by every thread, one
// commit group per tile).
// Per key tile t and warpgroup, software-pipelined so that the softmax overlaps a product:
//   issue S_t = Q K_t^T and O += P_{t-1} V_{t-1}   (asynchronous, in this order)
//   wait for S_t; online softmax of S_t in fp32 registers, the row maxima's rescale factor
//   alpha_t (exp2, the scale folded into one FMA)
//   wait for the P V product; O *= alpha_t (skipped by a warpgroup whose row maxima all stayed)
//   pack P_t to 16 bits (the A operand of the next P V)
// so the exponentials of tile t run while the tensor cores still multiply tile t - 1. ptxas
// schedules a wgmma wait freely inside its basic block (at the top of the softmax, before the
// first max) and gives a second fragment set the registers the product still reads, so the wait
// for P_{t-1} V_{t-1} sits after the rescale branch (a block boundary) and P_t is packed after
// it: in the SASS all 34 MUFU.EX2 of a tile (32 scores, 2 rescale factors) come before the
// WARPGROUP.DEPBAR.
// Every wgmma.fence / mma_async / commit_group / wait_group runs in all four warps of a
// warpgroup at the same instruction (.aligned; synccheck checks it): the conditions around them
// are equal across the warpgroup, the rescale skip by one bar.red.or vote of its 128 threads
// (wgmma::warpgroup_any), the tile skip by a key bound computed from the warpgroup's rows.
// The mask of a partly visible tile is a per-row key interval (two compares and a select per
// element), and every shared-memory pointer is an offset from smem_raw (LDS / STS, no
// generic-to-shared conversions in the loop).
// Scheduling: the grid is one-dimensional, query tiles heaviest first (the late ones of a causal
// mask) across groups of 8 (sequence, head) pairs, so the last blocks to start are short ones; a
// warpgroup stops issuing products after its own last visible key tile (the diagonal block's
// fully masked tiles of the early warpgroups) and only keeps taking part in the copies. The
// softmax statistics (LSE) are written in the layout the backward reads.
//
// H100 (NVIDIA H100 80GB HBM3), bf16, forward TFLOP/s, ours / SDPA cuDNN in the same run:
// python3 benchmarks/bench_attention.py --quick --filter kernels, in a build (NVTE_CUDA_ARCHS=90a)
// that passed test_attention_kernels.py + test_attention.py (304 passed), the C API attention
// tests (4/4) and compute-sanitizer's four tools over them (no finding in this library):
//   4x32x4096x128   full 388 / 585 = 0.66   causal 349 / 548 = 0.64
//   8x16x2048x64    full 273 / 458 = 0.60   causal 250 / 376 = 0.67
//   1x32x16384x128  full 383 / 610 = 0.63   causal 404 / 592 = 0.68
// Measured on the H100 and not taken (the bar: +2% in every row of the head dim): turns between
// the warpgroups (named barriers, so that one softmax runs while the others' products do), at
// both head dims; D = 128 as 2 warpgroups x 128 keys, with or without turns; groups of 16 pairs;
// the tile skip without the conditional rescale (ptxas then serialises the products, C7513).
// Not tried: heaviest first over all heads at once (128 heads' K and V streamed at once, no L2
// reuse). Likely the next limit: every tile ends in a __syncthreads of all warpgroups (the
// copies by every thread), so their softmaxes line up instead of overlapping each other's
// products; a producer warp with TMA and mbarriers (as in the backward) would let them drift.
#include "attention/online_softmax.cuh"
#include "attention/portable_wgmma.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

template <int D, int WARPGROUPS_, int BK_, bool TAKE_TURNS_, int MIN_BLOCKS_ = 1, int STAGES_ = 2>
struct WgmmaFwdShapeOf {
  static constexpr int WARPGROUPS = WARPGROUPS_, BQ = 64 * WARPGROUPS, BK = BK_;
  // shared-memory stages of K and V each: the copies of K_{t + STAGES - 1} and V_{t + STAGES - 2}
  // start at key tile t
  static constexpr int STAGES = STAGES_;
  static_assert(STAGES == 2 || STAGES == 3, "two or three K / V stages");
  // blocks an SM (registers: 65536 / (NT MIN_BLOCKS) per thread at most)
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  // query tiles are handed out heaviest first across groups of this many (sequence, head)
  // pairs: one group's K and V stay in L2 while its blocks run (heaviest first over all heads
  // would stream every head's K and V at once)
  static constexpr int LPT_GROUP = 8;
  // TAKE_TURNS: the warpgroups issue their products of a tile one after another (named
  // barriers), so the first one's scores are ready first and its softmax runs while the tensor
  // cores still work for the others, instead of every softmax starting at once
  static constexpr bool TAKE_TURNS = TAKE_TURNS_;
  static constexpr int NT = WARPGROUPS * wgmma::kWarpgroup;
  // swizzled tiles: every one starts on a 1024-byte boundary (sizes are multiples of 1024)
  static constexpr size_t kTileK = size_t(BK) * D * 2;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(BQ) * D * 2;
  static constexpr size_t kV = kK + STAGES * kTileK;
  static constexpr size_t kBytes = kV + STAGES * kTileK;
  static constexpr size_t kAlign = 1024;  // requested past the dynamic-smem base, see kernel
  // V as the MN-major B operand of P V (portable_wgmma.cuh): 64-column blocks BK rows apart,
  // 8-row atoms 1024 bytes apart
  static constexpr uint32_t kVLead = uint32_t(BK) * wgmma::kRowBytes, kVStride = 1024;
};
// Shapes, measured on an H100 (bf16; D = 128 at 4x32x4096 and 1x32x16384, D = 64 at 8x16x2048):
//   D = 128: 3 warpgroups (192 rows), 64-key tiles, no turns, one block an SM, 3 K / V stages
//            (144 KiB of shared memory; 158 registers, no spills): 64-key S tiles keep O, S and P
//            within the registers; 2 x 128 keys, with or without turns, ran slower, and a third
//            stage gained the causal rows 3-4%.
//   D = 64:  2 warpgroups, 64-key tiles, two blocks an SM (120 registers): the two blocks never
//            wait for each other, so one block's load waits, __syncthreads and prologue overlap
//            the other's products; ahead of one block of 2 x 128 keys with turns, 4 x 64 with
//            turns, one warpgroup a block, and 2 blocks of 128 keys.
using WgmmaFwdShape128 = WgmmaFwdShapeOf<128, 3, 64, false, 1, 3>;
using WgmmaFwdShape64 = WgmmaFwdShapeOf<64, 2, 64, false, 2, 2>;
template <int D>
using WgmmaFwdShape = typename std::conditional<D == 128, WgmmaFwdShape128, WgmmaFwdShape64>::type;

// Online softmax of one warp's [16 x BK] rows of S (raw Q K^T) for key tile k0: masks what the
// rows cannot see, updates the running row max m (log2 domain, scaled) and the thread's partial
// row sum l, overwrites s with P = exp2(S scale_log2 - m) (fp32) and returns the factor alpha by
// which the previous O rows shrink. The caller packs P into A fragments (pack_p) only once the
// previous P V product, which reads the A fragments, is done.
template <typename T, int BK>
__device__ __forceinline__ void softmax_tile(float (&s)[BK / 2], float (&m_row)[2],
                                             float (&l_row)[2], float (&alpha)[2],
                                             const KernelArgs& a, const SeqGeom& geo, int off,
                                             int row0, int k0, int lane) {
  constexpr int SN = BK / 8;
  const int g = lane / 4, quad = lane % 4;
  if (!tile_all_visible(a, off, row0, row0 + 16, k0, k0 + BK, geo.lk)) {
    // visible() as one key interval [j_lo, j_hi] per row, so that each element is two compares
    // and a select (visible()'s early returns compiled each element into a branch)
    int j_lo[2], j_hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + g + 8 * r;
      j_lo[r] = a.left >= 0 ? i + off - a.left : 0;
      j_hi[r] = i >= geo.lq ? -1 : a.right >= 0 ? min(geo.lk - 1, i + off + a.right) : geo.lk - 1;
    }
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = k0 + n * 8 + 2 * quad + (e % 2);
        if (j < j_lo[e / 2] || j > j_hi[e / 2]) s[4 * n + e] = kNegInf;
      }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // four independent chains per reduction (constant indices: an array indexed by a loop
    // counter that the compiler does not unroll goes to the stack)
    float acc[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
#pragma unroll
    for (int n = 0; n < SN; ++n)
      acc[n % 4] = fmaxf(acc[n % 4], fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
    const float mx = fmaxf(fmaxf(acc[0], acc[1]), fmaxf(acc[2], acc[3]));
    // the max of the raw scores, scaled once: scale_log2 > 0 (forward_wgmma declines others)
    const float m_use = update_row_max(m_row[r], quad_max(mx) * a.scale_log2, alpha[r]);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = 0.f;
#pragma unroll
    for (int n = 0; n < SN; ++n) {
      s[4 * n + 2 * r] = fast_exp2_ftz(fmaf(s[4 * n + 2 * r], a.scale_log2, -m_use));
      s[4 * n + 2 * r + 1] = fast_exp2_ftz(fmaf(s[4 * n + 2 * r + 1], a.scale_log2, -m_use));
      acc[n % 4] += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
    }
    l_row[r] = l_row[r] * alpha[r] + ((acc[0] + acc[1]) + (acc[2] + acc[3]));
  }
}

template <typename T, int BK>
__device__ __forceinline__ void pack_p(uint32_t (&p)[BK / 16][4], const float (&s)[BK / 2]) {
  tc::pack_a<T, BK>(p, reinterpret_cast<const float(&)[BK / 8][4]>(s));
}

template <typename T, int D, typename Shape>
__global__ void __launch_bounds__(Shape::NT, Shape::MIN_BLOCKS)
    attention_fwd_wgmma_kernel(KernelArgs a) {
  constexpr int BQ = Shape::BQ, BK = Shape::BK, NT = Shape::NT;
  constexpr int KSTEPS = D / 16, PSTEPS = BK / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle atoms need 1024-byte alignment; the launch asks for kAlign bytes of slack. An
  // offset from smem_raw (not an aligned integer cast back): the compiler then knows every
  // pointer below is shared memory and converts none back from a generic address in the loop
  unsigned char* smem =
      smem_raw + (Shape::kAlign - mma_sync::smem_addr(smem_raw) % Shape::kAlign) % Shape::kAlign;
  T* q_s = reinterpret_cast<T*>(smem + Shape::kQ);
  auto k_stage = [&](int st) { return smem + Shape::kK + st * Shape::kTileK; };
  auto v_stage = [&](int st) { return smem + Shape::kV + st * Shape::kTileK; };

  const int wg = threadIdx.x / wgmma::kWarpgroup;
  const int warp = (threadIdx.x % wgmma::kWarpgroup) / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  int h, b, q0;
  if (gridDim.y == 1 && gridDim.z == 1) {  // the launch's one-dimensional grid:
    // block L -> group of LPT_GROUP (sequence, head) pairs, then the tile's rank in it (the
    // latest, heaviest query tiles first), then the pair
    const BlockTile t = grouped_query_tile<BQ, Shape::LPT_GROUP>(a);
    q0 = t.row0;
    h = t.head;
    b = t.seq;
  } else {
    h = blockIdx.y;
    b = blockIdx.z;
    q0 = heaviest_first_start<BQ>();
  }
  const SeqGeom geo = seq_geom(a, b);
  if (q0 >= geo.lq) return;
  const int hk = kv_head(a, h);
  const int off = diag_offset(a, geo);
  const T* qg = static_cast<const T*>(a.q) + geo.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + geo.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + geo.kv_base + int64_t(hk) * D;
  int lo, hi;
  key_range(a, off, q0, min(q0 + BQ, geo.lq), geo.lk, &lo, &hi);
  const int k_first = tile_start<BK>(lo);
  const int tiles = k_first < hi ? (hi - k_first + BK - 1) / BK : 0;
  int my_tiles = tiles;
  {  // this warpgroup's own last key tile: past it, all its rows are masked
    const int wg_lo = q0 + wg * 64;
    int lo_w, hi_w;
    key_range(a, off, wg_lo, min(wg_lo + 64, geo.lq), geo.lk, &lo_w, &hi_w);
    my_tiles = wg_lo >= geo.lq || hi_w <= k_first ? 0 : min(tiles, (hi_w - k_first + BK - 1) / BK);
  }

  constexpr int STAGES = Shape::STAGES;
  auto load_k = [&](int t) {
    wgmma::load_tile_swizzled<T, BK, D, NT>(reinterpret_cast<T*>(k_stage(t % STAGES)), kg,
                                            a.kv_tok_stride, k_first + t * BK, geo.lk);
  };
  auto load_v = [&](int t) {
    wgmma::load_tile_swizzled<T, BK, D, NT>(reinterpret_cast<T*>(v_stage(t % STAGES)), vg,
                                            a.kv_tok_stride, k_first + t * BK, geo.lk);
  };
  // STAGES - 1 commit groups ahead of the loop: Q with K_0, then (three stages) K_1 with V_0
  wgmma::load_tile_swizzled<T, BQ, D, NT>(q_s, qg, a.q_tok_stride, q0, geo.lq);
  if (tiles > 0) load_k(0);
  mma_sync::cp_async_commit();
#pragma unroll
  for (int u = 1; u < STAGES - 1; ++u) {
    if (u < tiles) load_k(u);
    if (u - 1 < tiles) load_v(u - 1);
    mma_sync::cp_async_commit();
  }

  // this warpgroup's Q rows: column block c of D / 64 at q_s + c BQ 128 + wg 64 128 bytes
  const unsigned char* q_wg = smem + Shape::kQ + wg * 64 * wgmma::kRowBytes;
  auto qk_product = [&](float (&s)[BK / 2], int st) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int blk = kk / 4, within = (kk % 4) * 32;
      wgmma::mma_ss<T, BK>(
          s, wgmma::kmajor_desc(q_wg + blk * BQ * wgmma::kRowBytes + within),
          wgmma::kmajor_desc(k_stage(st) + blk * BK * wgmma::kRowBytes + within), kk > 0);
    }
  };
  auto pv_product = [&](float (&o)[D / 2], const uint32_t (&p)[PSTEPS][4], int st) {
#pragma unroll
    for (int kk = 0; kk < PSTEPS; ++kk)
      wgmma::mma_rs<T, D>(o, p[kk],
                          wgmma::descriptor(v_stage(st) + kk * 16 * wgmma::kRowBytes,
                                            Shape::kVLead, Shape::kVStride),
                          1);
  };

  float o[D / 2], s[BK / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  uint32_t p[PSTEPS][4];
  float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.f, 0.f}, alpha[2];
  const int row0 = q0 + wg * 64 + warp * 16;  // this warp's first query row

  // Copies of tile t: waits for K_t and V_{t-1} (one commit group a tile, the latest one may
  // stay in flight with three stages), then starts K_{t+STAGES-1} and V_{t+STAGES-2} into the
  // stages that K_{t-1} and V_{t-2} held.
  auto next_copies = [&](int t) {
    mma_sync::cp_async_wait<STAGES - 2>();  // this thread's copies of K_t and V_{t-1} landed
    wgmma::fence_async_shared();
    __syncthreads();  // ... every thread's; every warpgroup is done with K_{t-1} and V_{t-2}
    if (t + STAGES - 1 < tiles) load_k(t + STAGES - 1);
    if (t + STAGES - 2 < tiles) load_v(t + STAGES - 2);
    mma_sync::cp_async_commit();
  };
  // The first tile apart and no branch around the products in the loop: ptxas tracks which
  // registers an in-flight product still reads only through straight-line commit / wait pairs.
  // turn-taking: warpgroup w waits on barrier 1 + w, then hands the turn to the next one; the
  // last one hands the first tile's turn to warpgroup 0 in advance
  constexpr int kTurnThreads = 2 * wgmma::kWarpgroup, NWG = Shape::WARPGROUPS;
  auto take_turn = [&] {
    if constexpr (Shape::TAKE_TURNS) wgmma::barrier_sync(1 + wg, kTurnThreads);
  };
  auto pass_turn = [&] {
    if constexpr (Shape::TAKE_TURNS) wgmma::barrier_arrive(1 + (wg + 1) % NWG, kTurnThreads);
  };
  // whether any row of this warpgroup needs its O rescaled: one answer for its four warps, on
  // barrier kVote + wg (past the turns' barriers; constant ids let ptxas count them).
  // __any_sync only tells the compiler that the answer is uniform across the warp.
  constexpr int kVote = Shape::TAKE_TURNS ? 1 + NWG : 1;
  static_assert(NWG == 2 || NWG == 3, "vote barriers for two or three warpgroups");
  auto rescale_any = [&](bool mine) {
    const bool any = wg == 0                ? wgmma::warpgroup_any(kVote, mine)
                     : NWG == 2 || wg == 1 ? wgmma::warpgroup_any(kVote + 1, mine)
                                           : wgmma::warpgroup_any(kVote + 2, mine);
    return __any_sync(0xffffffffu, any);
  };
  if (tiles > 0) {
    if (Shape::TAKE_TURNS && wg == NWG - 1) pass_turn();
    next_copies(0);
    take_turn();
    if (my_tiles > 0) {
      wgmma::fence();
      qk_product(s, 0);
      wgmma::commit();
      pass_turn();
      wgmma::wait<0>();
      wgmma::pin(s);
      softmax_tile<T, BK>(s, m_row, l_row, alpha, a, geo, off, row0, k_first, lane);
      pack_p<T, BK>(p, s);
    } else {
      pass_turn();
    }
  }
  for (int t = 1; t < tiles; ++t) {
    next_copies(t);
    take_turn();
    if (t < my_tiles) {
      wgmma::fence();
      qk_product(s, t % STAGES);
      wgmma::commit();
      pv_product(o, p, (t - 1) % STAGES);
      wgmma::commit();
      pass_turn();
      wgmma::wait<1>();  // S_t done; P_{t-1} V_{t-1} may still run
      wgmma::pin(s);
      softmax_tile<T, BK>(s, m_row, l_row, alpha, a, geo, off, row0, k_first + t * BK, lane);
      // The wait for P_{t-1} V_{t-1} sits in the blocks after the branch below, not in the
      // softmax's block: there ptxas scheduled it to the top, before the first max (SASS:
      // WARPGROUP.DEPBAR.LE gsb0, 0x0 ahead of every MUFU.EX2), so the exponentials never
      // overlapped the P V product. A block boundary is what keeps it after them.
      // alpha is exactly 1 where the row max did not move (most tiles after the first few):
      // the warpgroup skips the multiply then (also keeps ptxas from serialising the products,
      // C7513). The branch holds a wait_group, so the whole warpgroup decides together
      // (rescale_any); a warp's own vote let one warp wait here and another below.
      if (rescale_any(alpha[0] != 1.f || alpha[1] != 1.f)) {
        wgmma::wait<0>();
        wgmma::pin(o);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[4 * n] *= alpha[0];
          o[4 * n + 1] *= alpha[0];
          o[4 * n + 2] *= alpha[1];
          o[4 * n + 3] *= alpha[1];
        }
      }
      wgmma::wait<0>();  // (nothing left to wait for where the branch above was taken)
      wgmma::pin(o);
      // P_t into the A fragments only now that P_{t-1} V_{t-1}, which reads them, is done:
      // packed inside the softmax into a second set that was copied over afterwards, ptxas gave
      // both sets the same registers (a write to them also pulls the wait up)
      pack_p<T, BK>(p, s);
    } else {
      pass_turn();
      if (t == my_tiles) {  // this warpgroup's last P V; its later tiles are all masked
        wgmma::fence();
        pv_product(o, p, (t - 1) % STAGES);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(o);
      }
    }
  }
  if (tiles > 0) {  // the last tile's P V
    if (Shape::TAKE_TURNS && wg == 0) take_turn();  // the turn the last warpgroup passed on
    mma_sync::cp_async_wait<0>();
    wgmma::fence_async_shared();
    __syncthreads();
    if (my_tiles == tiles) {
      wgmma::fence();
      pv_product(o, p, (tiles - 1) % STAGES);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::pin(o);
    }
  }
  mma_sync::cp_async_wait<0>();  // nothing may be in flight when the block exits

  const int g = lane / 4, quad = lane % 4;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l_row[r]);
    inv[r] = row_inverse(sum);
    const int i = row0 + g + 8 * r;
    if (quad == 0 && i < geo.lq) store_row_lse(a, b, h, i, m_row[r], sum);
  }
  T* og = static_cast<T*>(a.o) + geo.q_base + int64_t(h) * D;
  tc::store_acc<T, D>(reinterpret_cast<const float(&)[D / 8][4]>(o), og, a.q_tok_stride, row0,
                      geo.lq, inv[0], inv[1], lane);
}

template <typename T, int D, typename Shape = WgmmaFwdShape<D>>
void launch_fwd_wgmma(const AttnArgs& args) {
  auto kernel = attention_fwd_wgmma_kernel<T, D, Shape>;
  const size_t bytes = Shape::kBytes + Shape::kAlign;
  // Every call, not once: the attribute belongs to the current device's context.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", bytes,
                                         " bytes of shared memory to attention_fwd_wgmma_kernel"));
  if (Shape::MIN_BLOCKS > 1)  // room for MIN_BLOCKS blocks an SM: the largest carveout
    cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                         cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  const KernelArgs k = make_kernel_args(args);
  // one dimension (the kernel's heaviest-first order) where the block count allows
  const unsigned n = static_cast<unsigned>((args.p.max_seqlen_q + Shape::BQ - 1) / Shape::BQ);
  dim3 grid(n, static_cast<unsigned>(args.p.num_heads_q), static_cast<unsigned>(args.p.batch));
  const uint64_t blocks = uint64_t(n) * uint64_t(args.p.num_heads_q) * uint64_t(args.p.batch);
  if (blocks <= 0x7FFFFFFFu) grid = dim3(static_cast<unsigned>(blocks), 1, 1);
  kernel<<<grid, Shape::NT, bytes, to_stream(args.stream)>>>(k);
  check_launch("attention_fwd_wgmma_kernel");
}

}  // namespace

bool forward_wgmma(const AttnArgs& args) {
  int device = 0;
  // the softmax takes the row max of the unscaled scores: a positive scale keeps it the max
  if (!(args.p.softmax_scale > 0.f) || cudaGetDevice(&device) != cudaSuccess ||
      !wgmma::usable(device))
    return false;
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_fwd_wgmma<fp16, 64>(args);
    else launch_fwd_wgmma<fp16, 128>(args);
  } else {
    if (d64) launch_fwd_wgmma<bf16, 64>(args);
    else launch_fwd_wgmma<bf16, 128>(args);
  }
  return true;
}

#else

bool forward_wgmma(const AttnArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
