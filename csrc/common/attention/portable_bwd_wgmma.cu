// Portable attention backward on Hopper's warpgroup MMA (portable_wgmma.cuh), single pass with
// dQ summed in fp32 by the copy engine: the NVIDIA sm_90a form of portable_bwd_tc_atomic.cu, for
// calls that allow non-deterministic results, head dims 64 and 128. backward_atomic_wgmma()
// declines elsewhere (other archs, AMD, where hipify leaves nothing of it) and the mma.sync
// kernel runs instead.
//
// After the delta pass (portable_bwd.cu, which also zeroes dq_acc), one block per (BK = 128 keys,
// kv head, sequence), in grouped order (grouped_pairs: heaviest key tiles first within groups of
// about one wave), warp-specialised:
// - two MMA warpgroups; warpgroup w owns keys 64 w .. 64 w + 63, K and V stay in swizzled shared
//   memory. Per query tile of BQ rows (every tile of every head of the GQA group):
//     S^T  = K Q^T   and  dP^T = V dO^T        (shared x shared, issued together)
//     P^T  = exp2(S^T scale log2(e) - lse log2(e)), masked, packed as the A operand of
//     dV  += P^T dO                            (A from registers; runs while dS^T is computed)
//     dS^T = P^T (dP^T - delta), packed, and stored to a swizzled shared tile
//     dK  += dS^T Q                            (A from registers)
//   then dQ = dS K (A = dS^T read transposed, B = K read transposed) into a row-major fp32
//   [BQ x D] tile in shared memory: at d = 128, once both warpgroups' dS^T rows are in shared
//   memory, warpgroup w computes one [64 queries x 64 columns] piece over all 128 keys; at
//   d = 64 (SPLIT_DQ) each warpgroup multiplies its own 64 keys into a whole [BQ x D] partial,
//   warpgroup 0 stores it and warpgroup 1 adds its own onto it;
// - one producer warp (its warpgroup's other warps exit; setmaxnreg moves their registers to
//   the MMA warpgroups) copies Q, dO, lse and delta of the next steps into STAGES stages
//   (cp.async) and, once a step's dQ tile is complete, adds it to dq_acc with one bulk
//   reduction (cp.reduce.async.bulk .add.f32: the tile's rows are contiguous in dq_acc).
// mbarriers hand stages and the dQ tile between the two roles, so the MMA warpgroups neither
// issue loads nor wait on global memory, and dQ's additions leave their critical path.
// convert_dq_sums writes dq afterwards.
//
// Shared memory changes hands only at named barriers and mbarriers, and each thread that
// accessed a buffer arrives itself (see the barriers in the kernel), so compute-sanitizer's
// racecheck follows every hand-over. It needs room for the block's mbarriers
// (--num-cuda-barriers, .ci/gpu_verify.sh): with too small a table it loses them and reports
// hazards on hand-overs that the mbarriers order.
//
// H100 (NVIDIA H100 80GB HBM3), bf16, backward TFLOP/s (2.5x the forward's FLOPs; delta pass,
// kernel and dq conversion), full / causal, python3 benchmarks/bench_attention.py --quick
// --filter kernels, SDPA cuDNN in the same run, in a build that passed test_attention_kernels.py
// + test_attention.py (304 passed), the C API attention tests (4/4) and compute-sanitizer's four
// tools over them (no finding in this library):
//   4x32x4096x128   316 / 307  (cuDNN 506 / 425: 0.62 / 0.72)
//   1x32x16384x128  341 / 337  (cuDNN 511 / 497: 0.67 / 0.68)
//   8x16x2048x64    278 / 207  (cuDNN 401 / 303: 0.69 / 0.68)
// The choices, each measured with the kernel alone in a standalone harness on the H100:
// - d = 64: the exponentials of unmasked tiles as straight-line code, +9-16% (folded into the
//   masked loop, each element compiled to a branch around its ex2: ~140 BSSY / BSYNC pairs);
//   shared memory addressed from smem_raw, so LDS / STS instead of generic LD / ST, +3-6%;
//   SPLIT_DQ with the grouped order, +3% (without the grouped order no causal gain: there the
//   grid's tail is what grouping removes); 2 stages rather than 3, +3% full.
// - d = 128: the straight-line exponentials ran 6-10% slower (cause not established), so it
//   keeps the masked loop (STRAIGHT_EXP off); SPLIT_DQ (one dS^T tile, 64-register partial) was
//   no faster; 3 stages rather than 2, ~+10% (the dQ reduction costs ~15% at 2 stages).
// - The split form's two roles at the end of a step differ only by predicates: with an if/else
//   around the stores ptxas spilled ~120 bytes in the loop.
// - A whole producer warpgroup: a block of 288 threads (one producer warp, no setmaxnreg) also
//   gets only 168 registers a thread (per-SM-quarter allocation), and the MMA warpgroups then
//   spill ~900 bytes.
// Not faster (the form without a producer warp): red.global.add.v4, one bulk reduction per
// piece issued by the MMA warpgroups themselves, two-CTA clusters summing pieces through
// distributed shared memory, keeping a step's dQ product in flight into the next step.
// Not tried yet: a persistent grid prefetching the next key block's K / V during the last steps
// (at d = 64 a block walks 16 tiles full, ~8.5 causal), a d = 64 shape with two blocks an SM
// (one MMA warpgroup of 64 keys: BQ = 128 needs ~115 KiB a block, just over half the SM;
// BQ = 64 doubles the Q / dO and dQ traffic per FLOP).
#include "attention/online_softmax.cuh"
#include "attention/portable_wgmma.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

// ---- warp-specialised form: two MMA warpgroups and one producer warp ---------------------------
// Synchronisation inside the block (mbarriers in shared memory, PTX ISA "mbarrier"): the k-th
// completion of a barrier's phase is awaited with parity k & 1.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mma_sync::smem_addr(bar)),
               "r"(count)
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   mma_sync::smem_addr(bar))
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile(
      "{\n.reg .pred done;\nTE_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra TE_MBAR_WAIT;\n}\n" ::"r"(mma_sync::smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// dst[0 .. bytes/4) += src[...] (fp32), read from shared memory by the copy engine; completion
// of the read (the source may be overwritten) at bulk_wait_read.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, int bytes) {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(mma_sync::smem_addr(src)), "r"(bytes)
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_all() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// 4 bytes global -> shared (zero-filled when src_bytes is 0)
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, int src_bytes) {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                   mma_sync::smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes)
               : "memory");
#endif
}

// Hands registers between warpgroups (all warps of a warpgroup execute it).
template <int N>
__device__ __forceinline__ void set_max_registers_dec() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void set_max_registers_inc() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// A warpgroup's own barrier (ids 3 and 4; constant ids let the compiler count them).
__device__ __forceinline__ void wgmma_barrier_own(int wg) {
  if (wg == 0) wgmma::barrier_sync(3, wgmma::kWarpgroup);
  else wgmma::barrier_sync(4, wgmma::kWarpgroup);
}

// Named barrier `id` between `threads` threads, entered only where `pred` holds (uniform across
// each warp): one asm with a guard predicate rather than a branch.
__device__ __forceinline__ void barrier_sync_if(int id, int threads, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.sync %0, %1;\n}\n" ::"r"(id),
               "r"(threads), "r"(int(pred))
               : "memory");
}
__device__ __forceinline__ void barrier_arrive_if(int id, int threads, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id),
               "r"(threads), "r"(int(pred))
               : "memory");
}

// Block shape: BK = 128 keys (64 per MMA warpgroup) against query tiles of BQ rows, STAGES
// stages of Q / dO / row statistics in flight, DS_BUFFERS dS^T tiles (two let a warpgroup write
// the next step's dS^T while the other still reads the last one; one costs a second barrier).
// SPLIT_DQ: each warpgroup multiplies only its own dS^T rows (its 64 keys) into a whole
// [BQ x D] dQ partial; warpgroup 0 stores its partial, warpgroup 1 adds its own onto it. The
// warpgroups then share no dS^T tile and meet once a step in one direction only (1 waits for
// 0), so they drift apart and one's exponentials overlap the other's products.
// STRAIGHT_EXP: tiles without a masked score take a separate, branch-free exponential loop
// (d = 64: +9-16%; d = 128: 6-10% slower, cause not established, so off there).
template <int D, int BQ_, int STAGES_, int DS_BUFFERS_, bool SPLIT_DQ_, bool STRAIGHT_EXP_>
struct WgmmaBwdShape {
  static constexpr int WARPGROUPS = 2, BK = 64 * WARPGROUPS, BQ = BQ_, STAGES = STAGES_;
  static constexpr int DS_BUFFERS = DS_BUFFERS_;
  static constexpr bool SPLIT_DQ = SPLIT_DQ_, STRAIGHT_EXP = STRAIGHT_EXP_;
  static constexpr int NT_MMA = WARPGROUPS * wgmma::kWarpgroup;
  // + a producer warpgroup of which one warp works: registers are granted per warpgroup (a
  // block of 288 threads would get 168 a thread, like 384), so the producer drops to 24 a thread
  // and the MMA warpgroups rise to 240 (setmaxnreg; 2 x 128 x 240 + 128 x 24 = 384 x 168)
  static constexpr int NT = NT_MMA + wgmma::kWarpgroup;
  // the step's dQ tile [BQ x D]: split, one [BQ x D] partial a warpgroup in DQ_MB row blocks of
  // 64; else WARPGROUPS pieces of 64 queries x DQN columns
  static constexpr int DQ_MB = SPLIT_DQ ? BQ / 64 : 1;
  static constexpr int DQN = SPLIT_DQ ? D : D * (BQ / 64) / WARPGROUPS;
  static_assert(SPLIT_DQ || DQN == 64, "dQ pieces: 64 queries x 64 columns");
  static_assert(!SPLIT_DQ || DS_BUFFERS == 1, "split dQ: one dS^T tile a warpgroup");
  // rows of one dS^T tile: split, a warpgroup's own 64 keys (tile wg at kDs + wg kDsTile / 2)
  static constexpr int DS_ROWS = SPLIT_DQ ? 64 : BK;
  // swizzled tiles, every one on a 1024-byte boundary (sizes are multiples of 1024)
  static constexpr size_t kOwnTile = size_t(BK) * D * 2;
  static constexpr size_t kStreamTile = size_t(BQ) * D * 2;
  static constexpr size_t kDsTile = size_t(BK) * BQ * 2;
  static constexpr size_t kK = 0, kV = kOwnTile;
  static constexpr size_t kStages = 2 * kOwnTile;                     // stage st: Q, then dO
  static constexpr size_t kDs = kStages + STAGES * 2 * kStreamTile;   // dS^T [BK x BQ]
  static constexpr size_t kDq = kDs + DS_BUFFERS * kDsTile;           // dQ [BQ x D] fp32, rows
  static constexpr size_t kStats = kDq + size_t(BQ) * D * 4;          // per stage: lse, delta
  static constexpr size_t kBars = kStats + size_t(STAGES) * 2 * BQ * 4;
  static constexpr size_t kBytes = kBars + 8 * (2 * STAGES + 2);
  static constexpr size_t kAlign = 1024;  // requested past the dynamic-smem base, see kernel
  // an MN-major operand (dO, Q, K as B; dS^T as A): 64-column blocks `rows` rows apart,
  // 8-row atoms 1024 bytes apart
  static constexpr uint32_t kAtomStride = 1024;
  static_assert(kBytes + kAlign <= 232448, "shared memory of one block (227 KiB)");
};

template <typename T, int D, typename Shape>
__global__ void __launch_bounds__(Shape::NT, 1) attention_bwd_wgmma_kernel(KernelArgs a) {
  constexpr int BK = Shape::BK, BQ = Shape::BQ, DQN = Shape::DQN, STAGES = Shape::STAGES;
  constexpr int KSTEPS = D / 16, QSTEPS = BQ / 16, SN = BQ / 8;
  constexpr uint32_t kRow = wgmma::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // aligned as an offset from smem_raw (not through an integer): the compiler then still knows
  // every pointer below is shared memory and emits LDS / STS instead of generic LD / ST
  unsigned char* smem =
      smem_raw + (Shape::kAlign - mma_sync::smem_addr(smem_raw) % Shape::kAlign) % Shape::kAlign;
  auto q_stage = [&](int st) { return smem + Shape::kStages + 2 * st * Shape::kStreamTile; };
  auto do_stage = [&](int st) { return q_stage(st) + Shape::kStreamTile; };
  auto stats_stage = [&](int st) {
    return reinterpret_cast<float*>(smem + Shape::kStats) + 2 * st * BQ;
  };
  float* dq_s = reinterpret_cast<float*>(smem + Shape::kDq);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Shape::kBars);
  uint64_t* full = bars;                 // stage st loaded: the producer warp's 32 lanes
  // every thread that read a stage or wrote the dQ tile arrives itself: each of its accesses
  // is then ordered before the producer's next write / read by its own release (one arrival a
  // warp after __syncwarp orders them too, through the warp barrier's memory ordering; one per
  // thread needs no such chain, for a reader or a checking tool)
  uint64_t* empty = bars + STAGES;       // stage st read: the 256 MMA threads
  uint64_t* dq_full = bars + 2 * STAGES;  // dQ tile written: the 256 MMA threads (split: wg 1's)
  uint64_t* dq_empty = dq_full + 1;       // dQ tile read by the reduction: the producer

  // 1D grid of k_tiles x pairs blocks in grouped order (block_range.cuh, grouped_key_tile)
  const BlockTile tile = grouped_key_tile<BK>(a);
  const int hk = tile.head, b = tile.seq, k0 = tile.row0;
  const SeqGeom geo = seq_geom(a, b);
  if (k0 >= geo.lk) return;
  const KvBlockWalk w = kv_block_walk<BK, BQ>(a, geo, k0);
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full + st, tc::kLanes);
      mbar_init(empty + st, Shape::NT_MMA);
    }
    mbar_init(dq_full, Shape::SPLIT_DQ ? wgmma::kWarpgroup : Shape::NT_MMA);
    mbar_init(dq_empty, 1);
  }
  __syncthreads();
  const int lane = threadIdx.x % tc::kLanes;
  auto step_head = [&](int step) { return hk * w.group + step / w.tiles_per_head; };
  auto step_q0 = [&](int step) { return w.q_first + (step % w.tiles_per_head) * BQ; };

  if (threadIdx.x >= Shape::NT_MMA) {
    set_max_registers_dec<24>();
    if (threadIdx.x >= Shape::NT_MMA + tc::kLanes) return;
    // ---- producer warp: Q, dO and row statistics in; dQ tiles out (bulk reductions)
    auto load = [&](int step) {
      const int st = step % STAGES, h = step_head(step), q0 = step_q0(step);
      const int64_t head = geo.q_base + int64_t(h) * D;
      constexpr int kChunks = D / 8, kRowsPerPass = tc::kLanes / kChunks;
      const int c = lane % kChunks;
      const T* q_src = static_cast<const T*>(a.q) + head + c * 8;
      const T* do_src = static_cast<const T*>(a.d_o) + head + c * 8;
#pragma unroll 4
      for (int r = lane / kChunks; r < BQ; r += kRowsPerPass) {
        const bool ok = q0 + r < geo.lq;
        const int64_t off = ok ? int64_t(q0 + r) * a.q_tok_stride : 0;
        const int dst = wgmma::swizzled_offset<BQ>(r, c);
        mma_sync::cp_async_16(q_stage(st) + dst, q_src + off, ok ? 16 : 0);
        mma_sync::cp_async_16(do_stage(st) + dst, do_src + off, ok ? 16 : 0);
      }
      // lse as stored (the MMA warpgroups scale it by log2(e)) and delta; zeros past the
      // sequence
      float* stats = stats_stage(st);
      for (int r = lane; r < BQ; r += tc::kLanes) {
        const bool ok = q0 + r < geo.lq;
        const int64_t row = stats_row(a, b, h, ok ? q0 + r : 0);
        cp_async_4(stats + r, a.lse + row, ok ? 4 : 0);
        cp_async_4(stats + BQ + r, a.delta + row, ok ? 4 : 0);
      }
      mma_sync::cp_async_commit();
      mma_sync::cp_async_wait<0>();
      wgmma::fence_async_shared();  // the copies, visible to the tensor cores
      mbar_arrive(full + st);
    };
    for (int step = 0; step < w.steps && step < STAGES - 1; ++step) load(step);
    for (int step = 0; step < w.steps; ++step) {
      const int next = step + STAGES - 1;
      if (next < w.steps) {
        // stage next % STAGES was last read by step next - STAGES
        if (next >= STAGES) mbar_wait(empty + next % STAGES, (next / STAGES - 1) & 1);
        load(next);
      }
      mbar_wait(dq_full, step & 1);
      if (lane == 0) {
        const int q0 = step_q0(step);
        const int rows = min(BQ, geo.lq - q0);
        float* dst = a.dq_acc + stats_row(a, b, step_head(step), q0) * D;
        bulk_reduce_add_f32(dst, dq_s, rows * D * 4);
        bulk_wait_read();
        mbar_arrive(dq_empty);
      }
    }
    if (lane == 0) bulk_wait_all();
    return;
  }

  // ---- the MMA warpgroups
  set_max_registers_inc<240>();
  const int wg = threadIdx.x / wgmma::kWarpgroup;
  const int warp = (threadIdx.x % wgmma::kWarpgroup) / tc::kLanes;
  const int g = lane / 4, quad = lane % 4;
  const int64_t kv_head = geo.kv_base + int64_t(hk) * D;
  wgmma::load_tile_swizzled<T, BK, D, Shape::NT_MMA>(reinterpret_cast<T*>(smem + Shape::kK),
                                                     static_cast<const T*>(a.k) + kv_head,
                                                     a.kv_tok_stride, k0, geo.lk);
  wgmma::load_tile_swizzled<T, BK, D, Shape::NT_MMA>(reinterpret_cast<T*>(smem + Shape::kV),
                                                     static_cast<const T*>(a.v) + kv_head,
                                                     a.kv_tok_stride, k0, geo.lk);
  mma_sync::cp_async_commit();
  mma_sync::cp_async_wait<0>();
  wgmma::fence_async_shared();
  wgmma::barrier_sync(1, Shape::NT_MMA);

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int key_row0 = wg * 64 + warp * 16;
  const int j0 = k0 + key_row0 + g;
  const unsigned char* k_wg = smem + Shape::kK + wg * 64 * kRow;
  const unsigned char* v_wg = smem + Shape::kV + wg * 64 * kRow;
  constexpr int kColPieces = D / DQN;
  const int rb = wg / kColPieces, cb = wg % kColPieces;

  auto rows_product = [&](float (&acc)[BQ / 2], const unsigned char* a_rows,
                          const unsigned char* b_rows) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int blk = kk / 4, within = (kk % 4) * 32;
      wgmma::mma_ss<T, BQ>(acc, wgmma::kmajor_desc(a_rows + blk * BK * kRow + within),
                           wgmma::kmajor_desc(b_rows + blk * BQ * kRow + within), kk > 0);
    }
  };
  auto frag_product = [&](float (&acc)[D / 2], const uint32_t (&af)[QSTEPS][4],
                          const unsigned char* b_rows) {
#pragma unroll
    for (int kk = 0; kk < QSTEPS; ++kk)
      wgmma::mma_rs<T, D>(acc, af[kk],
                          wgmma::descriptor(b_rows + kk * 16 * kRow, BQ * kRow,
                                            Shape::kAtomStride),
                          1);
  };
  constexpr int DQ_MB = Shape::DQ_MB;
  // split: [BQ x D] partial over this warpgroup's 64 keys (A = its dS^T tile read transposed,
  // B = its K rows read transposed); else piece (rb, cb) over all BK keys
  auto dq_product = [&](float (&dq)[DQ_MB][DQN / 2], const unsigned char* ds_s) {
    if constexpr (Shape::SPLIT_DQ) {
#pragma unroll
      for (int mb = 0; mb < DQ_MB; ++mb)
#pragma unroll
        for (int kk = 0; kk < 64 / 16; ++kk)
          wgmma::mma_ss<T, DQN, 1, 1>(
              dq[mb],
              wgmma::descriptor(ds_s + mb * 64 * kRow + kk * 16 * kRow, 64 * kRow,
                                Shape::kAtomStride),
              wgmma::descriptor(k_wg + kk * 16 * kRow, BK * kRow, Shape::kAtomStride), kk > 0);
    } else {
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma::mma_ss<T, DQN, 1, 1>(
            dq[0],
            wgmma::descriptor(ds_s + rb * BK * kRow + kk * 16 * kRow, BK * kRow,
                              Shape::kAtomStride),
            wgmma::descriptor(smem + Shape::kK + (cb * DQN / 64) * BK * kRow + kk * 16 * kRow,
                              BK * kRow, Shape::kAtomStride),
            kk > 0);
    }
  };
  // This warp's dQ rows into the [BQ x D] fp32 tile (row-major: the bulk reduction's source is
  // contiguous), stored, or added to what is there (add). Column block m of lane (g, quad) goes
  // out at turn m ^ (g % 4): the 16 lanes of one 8-byte store phase then cover 32 different
  // banks instead of four lanes per bank.
  auto store_dq = [&](float (&dq)[DQ_MB][DQN / 2], bool add) {
    const int rot = g % 4;
#pragma unroll
    for (int mb = 0; mb < DQ_MB; ++mb) {
      float t[DQN / 2];
#pragma unroll
      for (int n = 0; n < DQN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          t[4 * n + e] = (rot & 1) ? dq[mb][4 * (n ^ 1) + e] : dq[mb][4 * n + e];
#pragma unroll
      for (int n = 0; n < DQN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dq[mb][4 * n + e] = (rot & 2) ? t[4 * (n ^ 2) + e] : t[4 * n + e];
      const int row_block = Shape::SPLIT_DQ ? mb : rb, col0 = Shape::SPLIT_DQ ? 0 : cb * DQN;
#pragma unroll
      for (int n = 0; n < DQN / 8; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row_block * 64 + warp * 16 + g + 8 * half;
          const int col = col0 + 8 * (n ^ rot) + 2 * quad;
          float2* dst = reinterpret_cast<float2*>(dq_s + row * D + col);
          float2 v = make_float2(dq[mb][4 * n + 2 * half], dq[mb][4 * n + 2 * half + 1]);
          if (add) {
            const float2 o = *dst;
            v.x += o.x;
            v.y += o.y;
          }
          *dst = v;
        }
    }
  };

  for (int step = 0; step < w.steps; ++step) {
    const int st = step % STAGES;
    const int q0 = step_q0(step);
    const unsigned char* q_t = q_stage(st);
    const unsigned char* do_t = do_stage(st);
    const float* lse = stats_stage(st);
    const float* delta = lse + BQ;
    // split: this warpgroup's own [64 x BQ] tile
    unsigned char* ds_s = smem + Shape::kDs + (step % Shape::DS_BUFFERS) * Shape::kDsTile +
                          (Shape::SPLIT_DQ ? wg * Shape::kDsTile / 2 : 0);
    mbar_wait(full + st, (step / STAGES) & 1);

    float s[BQ / 2], dp[BQ / 2];
    wgmma::fence();
    rows_product(s, k_wg, q_t);
    wgmma::commit();
    rows_product(dp, v_wg, do_t);
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::pin(s);
    const bool full_tile = tile_all_visible(a, w.off, q0, q0 + BQ, k0, w.k1, geo.lk) &&
                           q0 + BQ <= geo.lq;
    if (Shape::STRAIGHT_EXP && full_tile) {
      // every score of the tile is visible and every row has a finite lse: straight-line code
      // (folded into the loop below, each element becomes a branch around its exponential)
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse + n * 8 + 2 * quad);
        const float b0 = -l2.x * kLog2e, b1 = -l2.y * kLog2e;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[4 * n + e] = fast_exp2_ftz(fmaf(s[4 * n + e], a.scale_log2, e % 2 ? b1 : b0));
      }
    } else {
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse + n * 8 + 2 * quad);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * quad + (e % 2);
          const float l = e % 2 ? l2.y : l2.x;
          // rows past the sequence (lse zero-filled) are never full_tile and never visible()
          const bool live =
              l != kNegInf && ((!Shape::STRAIGHT_EXP && full_tile) ||
                               visible(a, w.off, q0 + col, j0 + 8 * (e / 2), geo.lq, geo.lk));
          s[4 * n + e] = live ? fast_exp2_ftz(fmaf(s[4 * n + e], a.scale_log2, -l * kLog2e)) : 0.f;
        }
      }
    }
    uint32_t p[QSTEPS][4];
    tc::pack_a<T, BQ>(p, reinterpret_cast<const float(&)[SN][4]>(s));
    wgmma::fence();
    frag_product(dv, p, do_t);
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::pin(dp);
#pragma unroll
    for (int n = 0; n < SN; ++n) {
      const float2 dl = *reinterpret_cast<const float2*>(delta + n * 8 + 2 * quad);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 pv = tc::packed_pair<T, BQ>(p, n, half);
        dp[4 * n + 2 * half] = pv.x * (dp[4 * n + 2 * half] - dl.x);
        dp[4 * n + 2 * half + 1] = pv.y * (dp[4 * n + 2 * half + 1] - dl.y);
      }
    }
    uint32_t ds[QSTEPS][4];
    tc::pack_a<T, BQ>(ds, reinterpret_cast<const float(&)[SN][4]>(dp));
    // one dS^T tile: the last dQ product that reads these rows (split: this warpgroup's own;
    // else the other warpgroup's too) is done once its warps reach this barrier
    if constexpr (Shape::SPLIT_DQ) wgmma_barrier_own(wg);
    else if (Shape::DS_BUFFERS == 1) wgmma::barrier_sync(2, Shape::NT_MMA);
    // dS^T rows of this warp's keys into the swizzled [DS_ROWS x BQ] tile: word (n, half) of the
    // packed rows is row g + 8 half, queries 8 n + 2 quad .. +1 (pack_a's layout); the eight
    // rows g of one store sit in eight different 16-byte chunk positions, so no bank conflicts
    constexpr int DS_ROWS = Shape::DS_ROWS;
    const int ds_row0 = Shape::SPLIT_DQ ? warp * 16 : key_row0;
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = ds_row0 + g + 8 * half;
        *reinterpret_cast<uint32_t*>(ds_s + (n / 8) * DS_ROWS * kRow + r * kRow +
                                     (((n % 8) ^ (r % 8)) * 16) + 4 * quad) =
            ds[n / 2][(n % 2) * 2 + half];
      }
    if constexpr (Shape::SPLIT_DQ) {
      // dV's product (long issued) is done: P's registers are free for the dQ partial's
      wgmma::wait<0>();
      wgmma::pin(p);
    }
    wgmma::fence();
    frag_product(dk, ds, q_t);
    wgmma::commit();
    wgmma::fence_async_shared();  // the dS^T stores, visible to the tensor cores ...
    // ... of this warpgroup (split) or of both
    if constexpr (Shape::SPLIT_DQ) wgmma_barrier_own(wg);
    else wgmma::barrier_sync(1, Shape::NT_MMA);

    // declared here, not before the loop: the products read their accumulators (asm "+f"), so
    // an array that outlived the step would hold its registers through the whole next step
    float dq[DQ_MB][DQN / 2];
    // an opaque copy of the tile address: its descriptors are built here, each step, rather
    // than hoisted out of the loop into registers held through the whole step (added while
    // hunting the split form's spills; the form measured and kept has it, not timed alone)
    const unsigned char* ds_opaque = ds_s;
    asm volatile("" : "+l"(ds_opaque));
    dq_product(dq, ds_opaque);
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int mb = 0; mb < DQ_MB; ++mb) wgmma::pin(dq[mb]);
    wgmma::pin(dk);
    wgmma::pin(dv);
    wgmma::pin(p);
    wgmma::pin(ds);
    mbar_arrive(empty + st);  // this thread is done with the stage
    // split: warpgroup 1 adds its partial to the one warpgroup 0 stored. The two roles differ
    // only by predicates (no branch around the stores: two code paths here cost the register
    // allocator ~30 spilled registers in the loop)
    const bool adds = Shape::SPLIT_DQ && wg == 1;
    // the tile is free once the reduction of the last step read it (split: warpgroup 0 waited
    // for that before it stored its partial)
    if (step > 0 && !adds) mbar_wait(dq_empty, (step - 1) & 1);
    if constexpr (Shape::SPLIT_DQ) barrier_sync_if(5, Shape::NT_MMA, adds);
    store_dq(dq, adds);
    wgmma::fence_async_shared();  // the dQ tile, visible to the bulk reduction
    if constexpr (Shape::SPLIT_DQ) barrier_arrive_if(5, Shape::NT_MMA, !adds);
    if (adds || !Shape::SPLIT_DQ) mbar_arrive(dq_full);
  }
  tc::store_acc<T, D>(reinterpret_cast<const float(&)[D / 8][4]>(dk),
                      static_cast<T*>(a.dk) + kv_head, a.kv_tok_stride, k0 + key_row0, geo.lk,
                      a.scale, a.scale, lane);
  tc::store_acc<T, D>(reinterpret_cast<const float(&)[D / 8][4]>(dv),
                      static_cast<T*>(a.dv) + kv_head, a.kv_tok_stride, k0 + key_row0, geo.lk,
                      1.f, 1.f, lane);
}

template <typename T, int D, typename Shape>
void launch_bwd_wgmma(const AttnArgs& args, const KernelArgs& k) {
  auto kernel = attention_bwd_wgmma_kernel<T, D, Shape>;
  const size_t bytes = Shape::kBytes + Shape::kAlign;
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", bytes,
                                         " bytes of shared memory to attention_bwd_wgmma_kernel"));
  const unsigned k_tiles =
      static_cast<unsigned>((args.p.max_seqlen_kv + Shape::BK - 1) / Shape::BK);
  // grouped order (grouped_pairs), one dimension
  const unsigned blocks = k_tiles * static_cast<unsigned>(args.p.num_heads_kv) *
                          static_cast<unsigned>(args.p.batch);
  kernel<<<blocks, Shape::NT, bytes, to_stream(args.stream)>>>(k);
  check_launch("attention_bwd_wgmma_kernel");
  convert_dq_sums(args, k);
}

}  // namespace

bool backward_atomic_wgmma(const AttnArgs& args, const KernelArgs& k) {
  int device = 0;
  const int d = args.p.head_dim_qk;
  if (k.dq_acc == nullptr || (d != 128 && d != 64) || cudaGetDevice(&device) != cudaSuccess ||
      !wgmma::usable(device))
    return false;
  const bool f16 = args.p.dtype == kNVTEFloat16;
  if (d == 64) {
    using S = WgmmaBwdShape<64, 128, 2, 1, true, true>;
    if (f16) launch_bwd_wgmma<fp16, 64, S>(args, k);
    else launch_bwd_wgmma<bf16, 64, S>(args, k);
  } else {
    using S = WgmmaBwdShape<128, 64, 3, 2, false, false>;
    if (f16) launch_bwd_wgmma<fp16, 128, S>(args, k);
    else launch_bwd_wgmma<bf16, 128, S>(args, k);
  }
  return true;
}

#else

bool backward_atomic_wgmma(const AttnArgs&, const KernelArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
