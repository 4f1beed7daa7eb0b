// Portable attention backward on Hopper's warpgroup MMA (portable_wgmma.cuh), single pass with
// dQ summed by fp32 atomics: the NVIDIA sm_90a form of portable_bwd_tc_atomic.cu, for calls that
// allow non-deterministic results. backward_atomic_wgmma() declines elsewhere (other archs, AMD,
// where hipify leaves nothing of it) and the mma.sync kernel runs instead.
//
// After the delta pass (portable_bwd.cu, which also zeroes dq_acc), one block per (BK = 64
// WARPGROUPS keys, kv head, sequence); warpgroup w owns keys 64 w .. 64 w + 63. K and V stay in
// swizzled shared memory; Q and dO tiles of BQ queries (every query tile of every head of the
// GQA group) and their rows' lse and delta stream through two stages. Per step and warpgroup:
//   S^T  = K Q^T   and  dP^T = V dO^T        (shared x shared, issued together)
//   P^T  = exp2(S^T scale log2(e) - lse2), masked, packed as the A operand of
//   dV  += P^T dO                            (A from registers; runs while dS^T is computed)
//   dS^T = P^T (dP^T - delta), packed, and stored to a swizzled shared tile
//   dK  += dS^T Q                            (A from registers)
// then, once both warpgroups' dS^T rows are in shared memory, warpgroup w computes one
// [64 queries x DQN columns] piece of dQ = dS K (A = dS^T read transposed, B = K read
// transposed) and adds it to dq_acc (red.global.add); convert_dq_sums writes dq afterwards.
//
// H100, bf16, backward TFLOP/s (2.5x the forward's FLOPs; delta pass, kernel and dq conversion),
// full / causal, two runs: 4x32x4096x128 244-249 / 232-235, 1x32x16384x128 241-244 / 267-271
// (the mma.sync kernel: 198-201 / 180-182, 203-206 / 199-204). Adding dQ costs a quarter of the
// time: without the additions (a wrong dQ) it runs at 340-345 / 304-307, 336-343 / 360-365.
// Tried and not faster: red.global.add.v4 (quad shuffles; the same), one bulk reduction per
// piece from shared memory (cp.reduce.async.bulk; 2-3% slower, across runs), on top of that
// two-CTA clusters summing their pieces through distributed shared memory before one reduction
// (half the global reductions; 2-14% slower than the bulk form in the same run), keeping a step's
// dQ product in flight into the next step (ptxas serialises the products across the loop; 3-5%
// slower).
#include "attention/portable_wgmma.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

template <int D, int BQ_>
struct WgmmaBwdShapeOf {
  static constexpr int WARPGROUPS = 2, BK = 64 * WARPGROUPS, BQ = BQ_;
  static constexpr int NT = WARPGROUPS * wgmma::kWarpgroup;
  // the step's dQ tile [BQ x D] in WARPGROUPS pieces of 64 queries x DQN columns
  static constexpr int DQN = D * (BQ / 64) / WARPGROUPS;
  static_assert(DQN == 64 || DQN == 128, "dQ pieces: N of 64 or 128");
  // swizzled tiles, every one on a 1024-byte boundary (sizes are multiples of 1024)
  static constexpr size_t kOwnTile = size_t(BK) * D * 2;
  static constexpr size_t kStreamTile = size_t(BQ) * D * 2;
  static constexpr size_t kK = 0, kV = kOwnTile;
  static constexpr size_t kStages = 2 * kOwnTile;  // stage st: Q, then dO
  static constexpr size_t kDs = kStages + 4 * kStreamTile;      // dS^T [BK x BQ]
  static constexpr size_t kStats = kDs + size_t(BK) * BQ * 2;  // per stage: lse2, delta
  static constexpr size_t kBytes = kStats + 4 * size_t(BQ) * 4;
  static constexpr size_t kAlign = 1024;  // requested past the dynamic-smem base, see kernel
  // an MN-major operand (dO, Q, K as B; dS^T as A): 64-column blocks `rows` rows apart,
  // 8-row atoms 1024 bytes apart
  static constexpr uint32_t kAtomStride = 1024;
};
// D = 128: 64-query steps (S^T and dP^T of 32 registers each beside dK and dV's 128). D = 64
// (128-query steps) compiles but is not used: measured on an H100 (bf16, TFLOP/s, full /
// causal, 8x16x2048x64) at 178-180 / 144-148 against the mma.sync kernel's 185-187 / 146-149.
template <int D>
using WgmmaBwdShape = WgmmaBwdShapeOf<D, D == 128 ? 64 : 128>;

template <typename T, int D, typename Shape>
__global__ void __launch_bounds__(Shape::NT, 1) attention_bwd_wgmma_kernel(KernelArgs a) {
  constexpr int BK = Shape::BK, BQ = Shape::BQ, NT = Shape::NT, DQN = Shape::DQN;
  constexpr int KSTEPS = D / 16, QSTEPS = BQ / 16, SN = BQ / 8;
  constexpr uint32_t kRow = wgmma::kRowBytes;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle atoms need 1024-byte alignment; the launch asks for kAlign bytes of slack
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + Shape::kAlign - 1) & ~uintptr_t(Shape::kAlign - 1));
  auto q_stage = [&](int st) { return smem + Shape::kStages + 2 * st * Shape::kStreamTile; };
  auto do_stage = [&](int st) { return q_stage(st) + Shape::kStreamTile; };
  float* stats_s = reinterpret_cast<float*>(smem + Shape::kStats);

  const int wg = threadIdx.x / wgmma::kWarpgroup;
  const int warp = (threadIdx.x % wgmma::kWarpgroup) / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * BK;  // early keys (the most queries under a causal mask) first
  const SeqGeom geo = seq_geom(a, b);
  if (k0 >= geo.lk) return;
  const tc::KvBlockWalk w = tc::kv_block_walk<BK, BQ>(a, geo, k0);
  const int64_t kv_head = geo.kv_base + int64_t(hk) * D;
  wgmma::load_tile_swizzled<T, BK, D, NT>(reinterpret_cast<T*>(smem + Shape::kK),
                                          static_cast<const T*>(a.k) + kv_head, a.kv_tok_stride,
                                          k0, geo.lk);
  wgmma::load_tile_swizzled<T, BK, D, NT>(reinterpret_cast<T*>(smem + Shape::kV),
                                          static_cast<const T*>(a.v) + kv_head, a.kv_tok_stride,
                                          k0, geo.lk);
  auto issue = [&](int step, int st) {
    const int h = hk * w.group + step / w.tiles_per_head;
    const int q0 = w.q_first + (step % w.tiles_per_head) * BQ;
    const int64_t head = geo.q_base + int64_t(h) * D;
    wgmma::load_tile_swizzled<T, BQ, D, NT>(reinterpret_cast<T*>(q_stage(st)),
                                            static_cast<const T*>(a.q) + head, a.q_tok_stride,
                                            q0, geo.lq);
    wgmma::load_tile_swizzled<T, BQ, D, NT>(reinterpret_cast<T*>(do_stage(st)),
                                            static_cast<const T*>(a.d_o) + head, a.q_tok_stride,
                                            q0, geo.lq);
    tc::load_row_stats<BQ, NT>(a, geo, b, h, q0, stats_s + 2 * st * BQ);
  };
  if (w.steps > 0) issue(0, 0);
  mma_sync::cp_async_commit();

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int key_row0 = wg * 64 + warp * 16;  // this warp's first key row in the block's tile
  const int j0 = k0 + key_row0 + g;          // this lane's keys: j0, j0 + 8
  // this warpgroup's key rows of K and V: column block c at + c BK 128 bytes
  const unsigned char* k_wg = smem + Shape::kK + wg * 64 * kRow;
  const unsigned char* v_wg = smem + Shape::kV + wg * 64 * kRow;
  // this warpgroup's dQ piece: queries 64 rb .. of the step, columns DQN cb ..
  constexpr int kColPieces = D / DQN;
  const int rb = wg / kColPieces, cb = wg % kColPieces;

  // [64 keys x BQ] = rows of A (K or V, this warpgroup's) . rows of B (Q or dO)^T, over D
  auto rows_product = [&](float (&acc)[BQ / 2], const unsigned char* a_rows,
                          const unsigned char* b_rows) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int blk = kk / 4, within = (kk % 4) * 32;
      wgmma::mma_ss<T, BQ>(acc, wgmma::kmajor_desc(a_rows + blk * BK * kRow + within),
                           wgmma::kmajor_desc(b_rows + blk * BQ * kRow + within), kk > 0);
    }
  };
  // acc [64 keys x D] += packed A [64 keys x BQ] . B [BQ x D] (dO or Q, read transposed)
  auto frag_product = [&](float (&acc)[D / 2], const uint32_t (&af)[QSTEPS][4],
                          const unsigned char* b_rows) {
#pragma unroll
    for (int kk = 0; kk < QSTEPS; ++kk)
      wgmma::mma_rs<T, D>(acc, af[kk],
                          wgmma::descriptor(b_rows + kk * 16 * kRow, BQ * kRow,
                                            Shape::kAtomStride),
                          1);
  };

  // dQ piece [64 queries x DQN] of a step over the block's BK keys. Keys past the sequence have
  // dS^T rows from zero-filled K and V rows; their K rows are zero, so they add nothing.
  float dq[DQN / 2];
  auto dq_product = [&](const unsigned char* ds_s) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      wgmma::mma_ss<T, DQN, 1, 1>(
          dq,
          wgmma::descriptor(ds_s + rb * BK * kRow + kk * 16 * kRow, BK * kRow,
                            Shape::kAtomStride),
          wgmma::descriptor(smem + Shape::kK + (cb * DQN / 64) * BK * kRow + kk * 16 * kRow,
                            BK * kRow, Shape::kAtomStride),
          kk > 0);
  };
  auto add_dq = [&](int h, int q0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = q0 + rb * 64 + warp * 16 + g + 8 * half;
      if (i >= geo.lq) continue;
      float* row =
          a.dq_acc + ((int64_t(b) * a.hq + h) * a.sq_max + i) * D + cb * DQN + 2 * quad;
#pragma unroll
      for (int n = 0; n < DQN / 8; ++n)
        tc::red_add_pair(row + n * 8, dq[4 * n + 2 * half], dq[4 * n + 2 * half + 1]);
    }
  };

  for (int step = 0; step < w.steps; ++step) {
    const int st = step & 1;
    mma_sync::cp_async_wait<0>();  // this thread's copies of the step landed
    wgmma::fence_async_shared();
    __syncthreads();  // ... every thread's; both warpgroups are done with the other stage, ds_s
    if (step + 1 < w.steps) issue(step + 1, st ^ 1);
    mma_sync::cp_async_commit();
    const int h = hk * w.group + step / w.tiles_per_head;
    const int q0 = w.q_first + (step % w.tiles_per_head) * BQ;
    const unsigned char* q_t = q_stage(st);
    const unsigned char* do_t = do_stage(st);
    const float* lse2 = stats_s + 2 * st * BQ;  // lse * log2(e); -inf past the sequence
    const float* delta = lse2 + BQ;
    unsigned char* ds_s = smem + Shape::kDs;

    float s[BQ / 2], dp[BQ / 2];
    wgmma::fence();
    rows_product(s, k_wg, q_t);
    wgmma::commit();
    rows_product(dp, v_wg, do_t);
    wgmma::commit();
    wgmma::wait<1>();  // S^T done; dP^T may still run
    wgmma::pin(s);
    // P^T: s[4 n + e] is key j0 + 8 (e / 2), query q0 + 8 n + 2 quad + (e % 2)
    const bool full = tc::tile_all_visible(a, w.off, q0, q0 + BQ, k0, w.k1, geo.lk);
#pragma unroll
    for (int n = 0; n < SN; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse2 + n * 8 + 2 * quad);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + 2 * quad + (e % 2);
        const float l = e % 2 ? l2.y : l2.x;
        const bool live = l != kNegInf &&
                          (full || visible(a, w.off, q0 + col, j0 + 8 * (e / 2), geo.lq, geo.lk));
        s[4 * n + e] = live ? fast_exp2_ftz(fmaf(s[4 * n + e], a.scale_log2, -l)) : 0.f;
      }
    }
    uint32_t p[QSTEPS][4];
    tc::pack_a<T, BQ>(p, reinterpret_cast<const float(&)[SN][4]>(s));
    wgmma::fence();
    frag_product(dv, p, do_t);
    wgmma::commit();
    wgmma::wait<1>();  // dP^T done; dV may still run
    wgmma::pin(dp);
    // dS^T = P^T (dP^T - delta), P^T read back from its packed (rounded) form
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
    // dS^T rows of this warp's keys into the swizzled [BK x BQ] tile: word (n, half) of the
    // packed rows is row g + 8 half, queries 8 n + 2 quad .. +1 (pack_a's layout); the eight
    // rows g of one store sit in eight different 16-byte chunk positions, so no bank conflicts
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = key_row0 + g + 8 * half;
        *reinterpret_cast<uint32_t*>(ds_s + (n / 8) * BK * kRow + r * kRow +
                                     (((n % 8) ^ (r % 8)) * 16) + 4 * quad) =
            ds[n / 2][(n % 2) * 2 + half];
      }
    wgmma::fence();
    frag_product(dk, ds, q_t);
    wgmma::commit();
    wgmma::fence_async_shared();  // the dS^T stores, visible to the tensor cores ...
    __syncthreads();              // ... of both warpgroups

    dq_product(ds_s);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(dq);
    wgmma::pin(dk);
    wgmma::pin(dv);
    wgmma::pin(p);
    wgmma::pin(ds);
    add_dq(h, q0);
  }
  mma_sync::cp_async_wait<0>();  // nothing may be in flight when the block exits
  tc::store_acc<T, D>(reinterpret_cast<const float(&)[D / 8][4]>(dk),
                      static_cast<T*>(a.dk) + kv_head, a.kv_tok_stride, k0 + key_row0, geo.lk,
                      a.scale, a.scale, lane);
  tc::store_acc<T, D>(reinterpret_cast<const float(&)[D / 8][4]>(dv),
                      static_cast<T*>(a.dv) + kv_head, a.kv_tok_stride, k0 + key_row0, geo.lk,
                      1.f, 1.f, lane);
}

template <typename T, int D, typename Shape = WgmmaBwdShape<D>>
void launch_bwd_wgmma(const AttnArgs& args, const KernelArgs& k) {
  auto kernel = attention_bwd_wgmma_kernel<T, D, Shape>;
  const size_t bytes = Shape::kBytes + Shape::kAlign;
  // Every call, not once: the attribute belongs to the current device's context.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", bytes,
                                         " bytes of shared memory to attention_bwd_wgmma_kernel"));
  const unsigned k_tiles =
      static_cast<unsigned>((args.p.max_seqlen_kv + Shape::BK - 1) / Shape::BK);
  kernel<<<dim3(k_tiles, static_cast<unsigned>(args.p.num_heads_kv),
                static_cast<unsigned>(args.p.batch)),
           Shape::NT, bytes, to_stream(args.stream)>>>(k);
  check_launch("attention_bwd_wgmma_kernel");
  convert_dq_sums(args, k);
}

}  // namespace

bool backward_atomic_wgmma(const AttnArgs& args, const KernelArgs& k) {
  int device = 0;
  // D = 64: the mma.sync kernel (WgmmaBwdShape)
  if (k.dq_acc == nullptr || args.p.head_dim_qk != 128 || cudaGetDevice(&device) != cudaSuccess ||
      !wgmma::usable(device))
    return false;
  if (args.p.dtype == kNVTEFloat16) launch_bwd_wgmma<fp16, 128>(args, k);
  else launch_bwd_wgmma<bf16, 128>(args, k);
  return true;
}

#else

bool backward_atomic_wgmma(const AttnArgs&, const KernelArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
