// Portable attention backward on the tensor cores at register level (portable_tc.cuh), the
// NVIDIA sm_80+ path; backward_tc() declines elsewhere and the caller falls back. Same
// deterministic, atomic-free scheme as the other portable backward kernels: after the delta pass
// (portable_bwd.cu),
//   dK/dV: one block per (16 * WARPS keys, kv head, sequence); warp w owns 16 keys and walks
//          every query tile of the heads of its GQA group: P^T = exp2(K Q^T - lse), dV += P^T dO,
//          dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q
//   dQ:    one block per (16 * WARPS queries, query head, sequence); warp w owns 16 queries and
//          walks the key tiles: P, dP = dO V^T, dS, dQ += dS K
// P and dS go from accumulators to A fragments in registers; query (dK/dV) and key (dQ) tiles
// stream through two shared-memory stages with cp.async.
#include "attention/online_softmax.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

template <int D>
struct TcBwdShape {
  static constexpr int WARPS = 4, BO = 16 * WARPS;  // rows the block owns (keys or queries)
  static constexpr int BS = 64;                     // rows of a streamed tile
  static constexpr int NT = WARPS * tc::kLanes;
  static constexpr int LD = tc::TileRow<D>::LD;
  static constexpr size_t kOwnTile = size_t(BO) * LD * 2;
  static constexpr size_t kStreamTile = size_t(BS) * LD * 2;
  // two owned tiles, then two streamed tiles per stage, then per stage BS floats of lse2 and of
  // delta (dK/dV only)
  static constexpr size_t kStream = 2 * kOwnTile;
  static constexpr size_t kRowStats = kStream + 4 * kStreamTile;
  static constexpr size_t kBytes = kRowStats + 4 * size_t(BS) * 4;
};

template <typename T, int D>
__global__ void __launch_bounds__(TcBwdShape<D>::NT) attention_dkdv_tc_kernel(KernelArgs a) {
  using Shape = TcBwdShape<D>;
  constexpr int BO = Shape::BO, BS = Shape::BS, NT = Shape::NT, LD = Shape::LD;
  constexpr int SN = BS / 8, ON = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kOwnTile);
  T* q_s = reinterpret_cast<T*>(smem + Shape::kStream);  // stage st at q_s + 2 st BS LD
  float* stats_s = reinterpret_cast<float*>(smem + Shape::kRowStats);  // stage st: lse2, delta
  const int warp = threadIdx.x / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;

  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * BO;
  const SeqGeom geo = seq_geom(a, b);
  if (k0 >= geo.lk) return;
  const KvBlockWalk w = start_kv_block<T, BO, BS, D, NT>(a, geo, hk, k0, k_s, v_s);
  const int k1 = w.k1, off = w.off, q_first = w.q_first, tiles_per_head = w.tiles_per_head,
            steps = w.steps;
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
  for (int step = 0; step < steps; ++step) {
    const int st = step & 1;
    mma_sync::cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; every warp is done with the other stage
    if (step + 1 < steps) issue(step + 1, st ^ 1);
    mma_sync::cp_async_commit();
    const int q0 = q_first + (step % tiles_per_head) * BS;
    const T* qt = q_s + 2 * st * BS * LD;
    const T* dot = qt + BS * LD;
    const float* lse2 = stats_s + 2 * st * BS;
    const float* delta = lse2 + BS;

    // P^T [16 keys x BS queries]
    float s[SN][4];
    tc::zero_acc(s);
    tc::mma_rows_rows<T, D, BS>(s, k_w, qt, lane);
    const bool full = tile_all_visible(a, off, q0, q0 + BS, k0, k1, geo.lk);
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + 2 * quad + (e % 2);
        const int i = q0 + col, j = j0 + 8 * (e / 2);
        const float l2 = lse2[col];
        const bool live = l2 != kNegInf && (full || visible(a, off, i, j, geo.lq, geo.lk));
        s[n][e] = live ? fast_exp2_ftz(fmaf(s[n][e], a.scale_log2, -l2)) : 0.f;
      }
    uint32_t p[BS / 16][4];
    tc::pack_a<T, BS>(p, s);
    tc::mma_frag_rows<T, D, BS>(dv, p, dot, lane);
    // dP^T [16 keys x BS queries], then dS^T = P^T (dP^T - delta), reusing s
    tc::zero_acc(s);
    tc::mma_rows_rows<T, D, BS>(s, v_w, dot, lane);
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 pv = tc::packed_pair<T, BS>(p, n, half);
        const int col = n * 8 + 2 * quad;
        s[n][2 * half] = pv.x * (s[n][2 * half] - delta[col]);
        s[n][2 * half + 1] = pv.y * (s[n][2 * half + 1] - delta[col + 1]);
      }
    tc::pack_a<T, BS>(p, s);
    tc::mma_frag_rows<T, D, BS>(dk, p, qt, lane);
  }
  mma_sync::cp_async_wait<0>();

  tc::store_acc<T, D>(dk, static_cast<T*>(a.dk) + geo.kv_base + int64_t(hk) * D,
                      a.kv_tok_stride, k0 + warp * 16, geo.lk, a.scale, a.scale, lane);
  tc::store_acc<T, D>(dv, static_cast<T*>(a.dv) + geo.kv_base + int64_t(hk) * D,
                      a.kv_tok_stride, k0 + warp * 16, geo.lk, 1.f, 1.f, lane);
}

template <typename T, int D>
__global__ void __launch_bounds__(TcBwdShape<D>::NT) attention_dq_tc_kernel(KernelArgs a) {
  using Shape = TcBwdShape<D>;
  constexpr int BO = Shape::BO, BS = Shape::BS, NT = Shape::NT, LD = Shape::LD;
  constexpr int SN = BS / 8, ON = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = reinterpret_cast<T*>(smem + Shape::kOwnTile);
  T* k_s = reinterpret_cast<T*>(smem + Shape::kStream);  // stage st at k_s + 2 st BS LD
  const int warp = threadIdx.x / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = heaviest_first_start<BO>();
  const SeqGeom geo = seq_geom(a, b);
  if (q0 >= geo.lq) return;
  const int q1 = min(q0 + BO, geo.lq);
  const int hk = kv_head(a, h);
  const int off = diag_offset(a, geo);
  const int64_t head = geo.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + geo.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + geo.kv_base + int64_t(hk) * D;
  load_tile_async<T, BO, D, NT>(q_s, static_cast<const T*>(a.q) + head, a.q_tok_stride, q0,
                                    geo.lq);
  load_tile_async<T, BO, D, NT>(do_s, static_cast<const T*>(a.d_o) + head, a.q_tok_stride,
                                    q0, geo.lq);
  int lo, hi;
  key_range(a, off, q0, q1, geo.lk, &lo, &hi);
  const int k_first = tile_start<BS>(lo);
  if (k_first < hi)
    load_kv_async<T, BS, D, NT>(k_s, k_s + BS * LD, kg, vg, a.kv_tok_stride, k_first, geo.lk);
  mma_sync::cp_async_commit();

  const int i0 = q0 + warp * 16 + g;  // this lane's queries: i0, i0 + 8
  float lse2[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + 8 * r;
    const int64_t row = stats_row(a, b, h, i);
    lse2[r] = i < geo.lq ? a.lse[row] * kLog2e : kNegInf;
    dlt[r] = i < geo.lq ? a.delta[row] : 0.f;
  }
  float dq[ON][4];
  tc::zero_acc(dq);
  const T* q_w = q_s + warp * 16 * LD;
  const T* do_w = do_s + warp * 16 * LD;
  int stage = 0;
  for (int k0 = k_first; k0 < hi; k0 += BS, stage ^= 1) {
    mma_sync::cp_async_wait<0>();
    __syncthreads();
    if (k0 + BS < hi) {
      T* dst = k_s + 2 * (stage ^ 1) * BS * LD;
      load_kv_async<T, BS, D, NT>(dst, dst + BS * LD, kg, vg, a.kv_tok_stride, k0 + BS, geo.lk);
    }
    mma_sync::cp_async_commit();
    const T* kt = k_s + 2 * stage * BS * LD;
    const T* vt = kt + BS * LD;

    float s[SN][4];
    tc::zero_acc(s);
    tc::mma_rows_rows<T, D, BS>(s, q_w, kt, lane);
    const bool full = tile_all_visible(a, off, q0, q1, k0, k0 + BS, geo.lk);
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, i = i0 + 8 * r, j = k0 + n * 8 + 2 * quad + (e % 2);
        const bool live = lse2[r] != kNegInf && (full || visible(a, off, i, j, geo.lq, geo.lk));
        s[n][e] = live ? prob_from_lse(s[n][e], a.scale_log2, lse2[r]) : 0.f;
      }
    float dp[SN][4];
    tc::zero_acc(dp);
    tc::mma_rows_rows<T, D, BS>(dp, do_w, vt, lane);
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - dlt[e / 2];
    uint32_t ds[BS / 16][4];
    tc::pack_a<T, BS>(ds, s);
    tc::mma_frag_rows<T, D, BS>(dq, ds, kt, lane);
  }
  mma_sync::cp_async_wait<0>();
  tc::store_acc<T, D>(dq, static_cast<T*>(a.dq) + head, a.q_tok_stride, q0 + warp * 16, geo.lq,
                      a.scale, a.scale, lane);
}

template <typename Kernel>
void grant_smem_tc(Kernel kernel, size_t bytes, const char* name) {
  // Every call: the attribute belongs to the current device's context.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", bytes, " bytes of shared memory to ",
                                         name));
}

template <typename T, int D>
void launch_bwd_tc(const AttnArgs& args, const KernelArgs& k) {
  using Shape = TcBwdShape<D>;
  const cudaStream_t stream = to_stream(args.stream);
  const unsigned batch = static_cast<unsigned>(args.p.batch);
  const unsigned k_tiles =
      static_cast<unsigned>((args.p.max_seqlen_kv + Shape::BO - 1) / Shape::BO);
  const unsigned q_tiles =
      static_cast<unsigned>((args.p.max_seqlen_q + Shape::BO - 1) / Shape::BO);
  auto dkdv = attention_dkdv_tc_kernel<T, D>;
  grant_smem_tc(dkdv, Shape::kBytes, "attention_dkdv_tc_kernel");
  dkdv<<<dim3(k_tiles, static_cast<unsigned>(args.p.num_heads_kv), batch), Shape::NT,
         Shape::kBytes, stream>>>(k);
  check_launch("attention_dkdv_tc_kernel");
  if (q_tiles == 0) return;
  auto dq = attention_dq_tc_kernel<T, D>;
  grant_smem_tc(dq, Shape::kBytes, "attention_dq_tc_kernel");
  dq<<<dim3(q_tiles, static_cast<unsigned>(args.p.num_heads_q), batch), Shape::NT, Shape::kBytes,
       stream>>>(k);
  check_launch("attention_dq_tc_kernel");
}

}  // namespace

bool backward_tc(const AttnArgs& args, const KernelArgs& k) {
  if (!tensor_cores_usable()) return false;
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_bwd_tc<fp16, 64>(args, k);
    else launch_bwd_tc<fp16, 128>(args, k);
  } else {
    if (d64) launch_bwd_tc<bf16, 64>(args, k);
    else launch_bwd_tc<bf16, 128>(args, k);
  }
  return true;
}

#else

bool backward_tc(const AttnArgs&, const KernelArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
