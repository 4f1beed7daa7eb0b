// Portable attention backward on the tensor cores, single pass, for calls that allow
// non-deterministic results (params.deterministic false): dQ is summed with fp32 atomics inside
// the dK/dV pass instead of a second pass that computes S and dP again. Five products per
// (query tile, key tile) pair instead of the deterministic scheme's seven (portable_bwd_tc.cu);
// the order of the atomic additions, hence dQ's last bits, varies from run to run.
//
// After the delta pass (portable_bwd.cu, which also zeroes the fp32 dQ accumulator
// dq_acc [b, hq, sq_max, D] in the workspace), one block per (BO = 16 * WARPS keys, kv head,
// sequence); warp w owns 16 keys and walks every 64-query tile of the heads of its GQA group
// (Q, dO and their row statistics stream through two shared-memory stages with cp.async):
//   P^T = exp2(K Q^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
//   dK += dS^T Q, all in registers (portable_tc.cuh); then dS^T goes to shared memory (16-bit)
//   and, after a block barrier, warp w computes dQ_part = dS K for 16 queries x D / 2 columns of
//   the tile over the block's BO keys and adds it to dq_acc (red.global.add).
// A last kernel writes dq = scale * dq_acc in the output dtype.
#include "attention/online_softmax.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

template <int D, int MIN_BLOCKS_, int BS_ = 64>
struct TcAtomicShapeOf {
  static constexpr int WARPS = 8, BO = 16 * WARPS;  // keys the block owns
  static constexpr int BS = BS_;                    // queries per streamed tile
  static constexpr int NT = WARPS * tc::kLanes;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // resident blocks per SM: the register cap
  static constexpr int LD = tc::TileRow<D>::LD;
  static constexpr int LDS = BS + 8;  // dS^T rows: 16 bytes apart in bank terms, as LD
  static constexpr size_t kOwnTile = size_t(BO) * LD * 2;
  static constexpr size_t kStreamTile = size_t(BS) * LD * 2;
  static constexpr size_t kStream = 2 * kOwnTile;                  // K, V, then the stages
  static constexpr size_t kRowStats = kStream + 4 * kStreamTile;   // per stage: Q, dO
  static constexpr size_t kDs = kRowStats + 4 * size_t(BS) * 4;    // per stage: lse2, delta
  static constexpr size_t kBytes = kDs + size_t(BO) * LDS * 2;
  // the dQ part [BS x D] of a step splits into WARPS pieces of 16 queries x DQ_COLS columns
  static constexpr int DQ_COLS = D * (BS / 16) / WARPS;
  static_assert(DQ_COLS % 16 == 0 && WARPS % (BS / 16) == 0, "dQ part split");
};
// D = 64 fits two blocks per SM in shared memory (~92 KB each); D = 128 one (~160 KB)
template <int D>
using TcAtomicShape = TcAtomicShapeOf<D, D == 64 ? 2 : 1>;

template <typename T, int D, typename Shape>
__global__ void __launch_bounds__(Shape::NT, Shape::MIN_BLOCKS)
    attention_bwd_atomic_tc_kernel(KernelArgs a) {
  constexpr int BO = Shape::BO, BS = Shape::BS, NT = Shape::NT, LD = Shape::LD,
                LDS = Shape::LDS;
  constexpr int SN = BS / 8, ON = D / 8, DQC = Shape::DQ_COLS;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kOwnTile);
  T* q_s = reinterpret_cast<T*>(smem + Shape::kStream);  // stage st: Q at q_s + 2 st BS LD, dO
  float* stats_s = reinterpret_cast<float*>(smem + Shape::kRowStats);  // stage st: lse2, delta
  T* ds_s = reinterpret_cast<T*>(smem + Shape::kDs);  // dS^T [BO keys x BS queries]
  const int warp = threadIdx.x / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;

  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * BO;  // early keys (the most queries under a causal mask) first
  const SeqGeom geo = seq_geom(a, b);
  if (k0 >= geo.lk) return;
  const KvBlockWalk w = start_kv_block<T, BO, BS, D, NT>(a, geo, hk, k0, k_s, v_s);
  const int k1 = w.k1, off = w.off, q_first = w.q_first, group = w.group,
            tiles_per_head = w.tiles_per_head, steps = w.steps;
  const int64_t kv_head = geo.kv_base + int64_t(hk) * D;
  auto issue = [&](int step, int st) {
    issue_query_step<T, BS, D, NT>(a, geo, b, hk, w, step, st, q_s, stats_s);
  };
  if (steps > 0) issue(0, 0);
  mma_sync::cp_async_commit();

  float dk[ON][4], dv[ON][4];
  tc::zero_acc(dk);
  tc::zero_acc(dv);
  const int j0 = k0 + warp * 16 + g;  // this lane's keys: j0, j0 + 8
  const T* k_w = k_s + warp * 16 * LD;
  const T* v_w = v_s + warp * 16 * LD;
  // the dQ part of this warp: queries 16 qm .. +15 of the tile, columns DQC dh .. +DQC - 1
  // (DQC = D / 2 with 64-query tiles and 8 warps)
  const int qm = warp % (BS / 16), dh = warp / (BS / 16);
  // A = dS [16 queries x 16 keys] from dS^T rows (keys) read transposed: matrix m = lane / 8
  // holds keys 8 (m / 2) .., queries 8 (m % 2) ..
  const T* ds_row = ds_s + ((lane % 8) + 8 * (lane / 16)) * LDS + qm * 16 + 8 * ((lane / 8) % 2);
  // B = K [16 keys x 16 columns], read transposed as in mma_frag_rows
  const T* kb_row = k_s + (lane % 16) * LD + 8 * (lane / 16) + dh * DQC;
  for (int step = 0; step < steps; ++step) {
    const int st = step & 1;
    mma_sync::cp_async_wait<0>();
    __syncthreads();  // tiles landed; every warp is done with the other stage and with ds_s
    if (step + 1 < steps) issue(step + 1, st ^ 1);
    mma_sync::cp_async_commit();
    const int h = hk * group + step / tiles_per_head;
    const int q0 = q_first + (step % tiles_per_head) * BS;
    const T* qt = q_s + 2 * st * BS * LD;
    const T* dot = qt + BS * LD;
    const float* lse2 = stats_s + 2 * st * BS;  // lse * log2(e); -inf past the sequence
    const float* delta = lse2 + BS;

    // P^T [16 keys x BS queries] = exp2(S^T scale log2(e) - lse2), masked
    auto probabilities = [&](float (&s)[SN][4]) {
      const bool full = tile_all_visible(a, off, q0, q0 + BS, k0, k1, geo.lk);
#pragma unroll
      for (int n = 0; n < SN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * 8 + 2 * quad + (e % 2);
          const float l2 = lse2[col];
          const bool live = l2 != kNegInf &&
                            (full || visible(a, off, q0 + col, j0 + 8 * (e / 2), geo.lq, geo.lk));
          s[n][e] = live ? fast_exp2_ftz(fmaf(s[n][e], a.scale_log2, -l2)) : 0.f;
        }
    };
    // dS^T = P^T (dP^T - delta) in place of dP^T, P^T read back from its packed (rounded) form
    auto score_grads = [&](float (&dp)[SN][4], const uint32_t (&p)[BS / 16][4]) {
#pragma unroll
      for (int n = 0; n < SN; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 pv = tc::packed_pair<T, BS>(p, n, half);
          const int col = n * 8 + 2 * quad;
          dp[n][2 * half] = pv.x * (dp[n][2 * half] - delta[col]);
          dp[n][2 * half + 1] = pv.y * (dp[n][2 * half + 1] - delta[col + 1]);
        }
    };
    // dS^T rows of this warp's keys into ds_s: word (n, half) of the packed rows holds row
    // g + 8 half, columns 8 n + 2 quad .. +1 (pack_a's layout)
    auto publish = [&](const uint32_t (&ds)[BS / 16][4]) {
#pragma unroll
      for (int n = 0; n < SN; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<uint32_t*>(ds_s + (warp * 16 + g + 8 * half) * LDS + n * 8 +
                                       2 * quad) = ds[n / 2][(n % 2) * 2 + half];
    };
    float s[SN][4];
    tc::zero_acc(s);
    tc::mma_rows_rows<T, D, BS>(s, k_w, qt, lane);
    probabilities(s);
    uint32_t p[BS / 16][4];
    tc::pack_a<T, BS>(p, s);
    tc::mma_frag_rows<T, D, BS>(dv, p, dot, lane);
    tc::zero_acc(s);  // dP^T, then dS^T in place
    tc::mma_rows_rows<T, D, BS>(s, v_w, dot, lane);
    score_grads(s, p);
    tc::pack_a<T, BS>(p, s);
    publish(p);
    tc::mma_frag_rows<T, D, BS>(dk, p, qt, lane);
    __syncthreads();  // every warp's dS^T rows are in ds_s

    // dQ_part [16 queries x DQC] over the block's BO keys. Keys past the sequence have dS^T
    // rows from zero-filled K rows; their K rows in k_s are zero, so they add nothing.
    float dq[DQC / 8][4];
    tc::zero_acc(dq);
#pragma unroll
    for (int kb = 0; kb < BO / 16; ++kb) {
      uint32_t af[4];
      mma_sync::ldmatrix_x4_trans(af, ds_row + kb * 16 * LDS);
#pragma unroll
      for (int dp = 0; dp < DQC / 16; ++dp) {
        uint32_t bf[4];
        mma_sync::ldmatrix_x4_trans(bf, kb_row + kb * 16 * LD + 16 * dp);
        mma_sync::mma16816<T>(dq[2 * dp], af, bf[0], bf[1]);
        mma_sync::mma16816<T>(dq[2 * dp + 1], af, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = q0 + qm * 16 + g + 8 * half;
      if (i >= geo.lq) continue;
      float* row =
          a.dq_acc + ((int64_t(b) * a.hq + h) * a.sq_max + i) * D + dh * DQC + 2 * quad;
#pragma unroll
      for (int n = 0; n < DQC / 8; ++n)
        tc::red_add_pair(row + n * 8, dq[n][2 * half], dq[n][2 * half + 1]);
    }
  }
  mma_sync::cp_async_wait<0>();
  tc::store_acc<T, D>(dk, static_cast<T*>(a.dk) + kv_head, a.kv_tok_stride, k0 + warp * 16,
                      geo.lk, a.scale, a.scale, lane);
  tc::store_acc<T, D>(dv, static_cast<T*>(a.dv) + kv_head, a.kv_tok_stride, k0 + warp * 16,
                      geo.lk, 1.f, 1.f, lane);
}

// dq = scale * dq_acc, four elements per thread; rows past a sequence's length are left alone.
template <typename T, int D>
__global__ void __launch_bounds__(256) attention_dq_convert_kernel(KernelArgs a) {
  constexpr int kQuads = D / 4;
  const int h = blockIdx.y, b = blockIdx.z;
  const int idx = blockIdx.x * 256 + threadIdx.x;
  const int i = idx / kQuads, c = (idx % kQuads) * 4;
  const SeqGeom geo = seq_geom(a, b);
  if (i >= geo.lq) return;
  const float4 v = *reinterpret_cast<const float4*>(
      a.dq_acc + ((int64_t(b) * a.hq + h) * a.sq_max + i) * D + c);
  uint32_t* out = reinterpret_cast<uint32_t*>(static_cast<T*>(a.dq) + geo.q_base +
                                              int64_t(i) * a.q_tok_stride + int64_t(h) * D + c);
  out[0] = mma_sync::pack2<T>(v.x * a.scale, v.y * a.scale);
  out[1] = mma_sync::pack2<T>(v.z * a.scale, v.w * a.scale);
}

template <typename T, int D, typename Shape = TcAtomicShape<D>>
void launch_bwd_atomic_tc(const AttnArgs& args, const KernelArgs& k) {
  const cudaStream_t stream = to_stream(args.stream);
  auto kernel = attention_bwd_atomic_tc_kernel<T, D, Shape>;
  // Every call: the attribute belongs to the current device's context.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Shape::kBytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", Shape::kBytes,
                                         " bytes of shared memory to "
                                         "attention_bwd_atomic_tc_kernel"));
  const unsigned batch = static_cast<unsigned>(args.p.batch);
  const unsigned k_tiles =
      static_cast<unsigned>((args.p.max_seqlen_kv + Shape::BO - 1) / Shape::BO);
  kernel<<<dim3(k_tiles, static_cast<unsigned>(args.p.num_heads_kv), batch), Shape::NT,
           Shape::kBytes, stream>>>(k);
  check_launch("attention_bwd_atomic_tc_kernel");
  convert_dq_sums(args, k);
}

template <typename T, int D>
void launch_dq_convert(const AttnArgs& args, const KernelArgs& k) {
  const unsigned row_blocks =
      static_cast<unsigned>((args.p.max_seqlen_q * (D / 4) + 255) / 256);
  if (row_blocks == 0) return;
  attention_dq_convert_kernel<T, D>
      <<<dim3(row_blocks, static_cast<unsigned>(args.p.num_heads_q),
              static_cast<unsigned>(args.p.batch)),
         256, 0, to_stream(args.stream)>>>(k);
  check_launch("attention_dq_convert_kernel");
}

}  // namespace

void convert_dq_sums(const AttnArgs& args, const KernelArgs& k) {
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_dq_convert<fp16, 64>(args, k);
    else launch_dq_convert<fp16, 128>(args, k);
  } else {
    if (d64) launch_dq_convert<bf16, 64>(args, k);
    else launch_dq_convert<bf16, 128>(args, k);
  }
}

bool backward_atomic_tc(const AttnArgs& args, const KernelArgs& k) {
  if (k.dq_acc == nullptr || !tensor_cores_usable()) return false;
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_bwd_atomic_tc<fp16, 64>(args, k);
    else launch_bwd_atomic_tc<fp16, 128>(args, k);
  } else {
    if (d64) launch_bwd_atomic_tc<bf16, 64>(args, k);
    else launch_bwd_atomic_tc<bf16, 128>(args, k);
  }
  return true;
}

#else

bool backward_atomic_tc(const AttnArgs&, const KernelArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
