// Portable attention forward on the tensor cores at register level (portable_tc.cuh), the
// NVIDIA sm_80+ path; forward_tc() declines elsewhere and portable_forward() falls back.
//
// One block per (BQ = 16 * MT * WARPS query rows, query head, sequence); warp w owns the MT row
// blocks of 16 at 16 MT w (MT = 2: every K and V fragment read from shared memory feeds two
// products). Key/value tiles of BK rows stream through two shared-memory stages with cp.async,
// the next tile's copy overlapping this tile's products. Per tile and warp: S = Q K^T in
// accumulator fragments, the online softmax on them (row max and sum over the four lanes of a
// row, log2 domain), P packed in place into A fragments, O += P V. Heavy (late, for causal
// masks) query tiles are scheduled first.
#include "attention/online_softmax.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

// WARPS x MT x 16 query rows, BK keys per tile, MIN_BLOCKS resident blocks per SM (the register
// cap: 65536 / (MIN_BLOCKS * 32 WARPS)).
template <int D, int WARPS_, int MT_, int BK_, int MIN_BLOCKS_, bool SPLIT_MASK_>
struct TcFwdShapeOf {
  static constexpr int WARPS = WARPS_, MT = MT_, BQ = 16 * MT * WARPS, BK = BK_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_, NT = WARPS * tc::kLanes;
  // SPLIT_MASK: tiles without a masked element take a loop without the per-element mask test
  // (a warp-uniform branch), and row max / sum are trees; more code, hence registers
  static constexpr bool SPLIT_MASK = SPLIT_MASK_;
  static constexpr int LD = tc::TileRow<D>::LD;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(BQ) * LD * 2;         // two stages
  static constexpr size_t kV = kK + 2 * size_t(BK) * LD * 2;     // two stages
  static constexpr size_t kBytes = kV + 2 * size_t(BK) * LD * 2;
};
// 8 warps of 16 rows: 128 query rows; two blocks per SM (128 registers a thread). D = 128: 64
// keys per tile, SPLIT_MASK (+8-10%); D = 64: 128 keys per tile (+4-8% over 64), no SPLIT_MASK
// (-40% measured there, with more register spills). Measured on an H100 against 4 warps of 32
// rows (MT = 2: half the shared-memory traffic, but 8 warps an SM instead of 16, and
// latency-bound: 8-15% slower), 4 warps x 3 blocks (slower), and against the scale folded into
// the exponent's multiply-add and a rescale of O skipped while no row max moves (no gain, or
// spills).
template <int D>
using TcFwdShape = TcFwdShapeOf<D, 8, 1, D == 64 ? 128 : 64, 2, D == 128>;

template <typename T, int D, typename Shape>
__global__ void __launch_bounds__(Shape::NT, Shape::MIN_BLOCKS)
    attention_fwd_tc_kernel(KernelArgs a) {
  constexpr int BQ = Shape::BQ, BK = Shape::BK, NT = Shape::NT, LD = Shape::LD, MT = Shape::MT;
  constexpr int SN = BK / 8, ON = D / 8;  // fragments per S row, per O row
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + Shape::kQ);
  T* k_s = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kV);
  const int warp = threadIdx.x / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = heaviest_first_start<BQ>();
  const SeqGeom geo = seq_geom(a, b);
  if (q0 >= geo.lq) return;
  const int hk = kv_head(a, h);
  const int off = diag_offset(a, geo);
  const T* qg = static_cast<const T*>(a.q) + geo.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + geo.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + geo.kv_base + int64_t(hk) * D;
  const int q1 = min(q0 + BQ, geo.lq);
  int lo, hi;
  key_range(a, off, q0, q1, geo.lk, &lo, &hi);
  const int k_first = tile_start<BK>(lo);

  load_tile_async<T, BQ, D, NT>(q_s, qg, a.q_tok_stride, q0, geo.lq);
  if (k_first < hi) load_kv_async<T, BK, D, NT>(k_s, v_s, kg, vg, a.kv_tok_stride, k_first, geo.lk);
  mma_sync::cp_async_commit();

  float o[MT][ON][4];
  // rows g and g + 8 of each row block: running max (log2 domain, scaled) and sum
  float m_row[MT][2], l_row[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    tc::zero_acc(o[m]);
    m_row[m][0] = m_row[m][1] = kNegInf;
    l_row[m][0] = l_row[m][1] = 0.f;
  }
  const int w0 = warp * 16 * MT;  // the warp's first row in the tile
  const int i0 = q0 + w0 + g;
  const T* q_w = q_s + w0 * LD;
  int stage = 0;
  for (int k0 = k_first; k0 < hi; k0 += BK, stage ^= 1) {
    mma_sync::cp_async_wait<0>();
    __syncthreads();  // tile k0 landed for every thread; every warp is done with the other stage
    if (k0 + BK < hi)
      load_kv_async<T, BK, D, NT>(k_s + (stage ^ 1) * BK * LD, v_s + (stage ^ 1) * BK * LD, kg, vg,
                                  a.kv_tok_stride, k0 + BK, geo.lk);
    mma_sync::cp_async_commit();

    float s[MT][SN][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) tc::zero_acc(s[m]);
    tc::mma_rows_rows_mt<T, D, BK, MT>(s, q_w, k_s + stage * BK * LD, lane);
    const bool full = tile_all_visible(a, off, q0 + w0, q0 + w0 + 16 * MT, k0, k0 + BK,
                                           geo.lk);
    if (Shape::SPLIT_MASK && full) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < SN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[m][n][e] *= a.scale_log2;
    } else {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < SN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = i0 + 16 * m + 8 * (e / 2), j = k0 + n * 8 + 2 * quad + (e % 2);
            s[m][n][e] = ((!Shape::SPLIT_MASK && full) || visible(a, off, i, j, geo.lq, geo.lk))
                             ? s[m][n][e] * a.scale_log2
                             : kNegInf;
          }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float v[SN];  // row max, then row sum (trees with SPLIT_MASK, else running)
        float mx = kNegInf;
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          v[n] = fmaxf(s[m][n][2 * r], s[m][n][2 * r + 1]);
          if (!Shape::SPLIT_MASK) mx = fmaxf(mx, v[n]);
        }
        if (Shape::SPLIT_MASK) mx = tree_max(v);
        float alpha;
        const float m_use = update_row_max(m_row[m][r], quad_max(mx), alpha);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          s[m][n][2 * r] = fast_exp2_ftz(s[m][n][2 * r] - m_use);
          s[m][n][2 * r + 1] = fast_exp2_ftz(s[m][n][2 * r + 1] - m_use);
          v[n] = s[m][n][2 * r] + s[m][n][2 * r + 1];
          if (!Shape::SPLIT_MASK) sum += v[n];
        }
        if (Shape::SPLIT_MASK) sum = tree_sum(v);
        l_row[m][r] = l_row[m][r] * alpha + sum;
#pragma unroll
        for (int n = 0; n < ON; ++n) {
          o[m][n][2 * r] *= alpha;
          o[m][n][2 * r + 1] *= alpha;
        }
      }
    uint32_t p[MT][BK / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) tc::pack_a<T, BK>(p[m], s[m]);
    tc::mma_frag_rows_mt<T, D, BK, MT>(o, p, v_s + stage * BK * LD, lane);
  }
  mma_sync::cp_async_wait<0>();  // nothing may be in flight when the block exits

  T* og = static_cast<T*>(a.o) + geo.q_base + int64_t(h) * D;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(l_row[m][r]);
      inv[r] = row_inverse(sum);
      const int i = i0 + 16 * m + 8 * r;
      if (quad == 0 && i < geo.lq) store_row_lse(a, b, h, i, m_row[m][r], sum);
    }
    tc::store_acc<T, D>(o[m], og, a.q_tok_stride, q0 + w0 + 16 * m, geo.lq, inv[0], inv[1],
                        lane);
  }
}

template <typename T, int D, typename Shape = TcFwdShape<D>>
void launch_fwd_tc(const AttnArgs& args) {
  auto kernel = attention_fwd_tc_kernel<T, D, Shape>;
  // Every call, not once: the attribute belongs to the current device's context.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Shape::kBytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", Shape::kBytes,
                                         " bytes of shared memory to attention_fwd_tc_kernel"));
  const KernelArgs k = make_kernel_args(args);
  dim3 grid(static_cast<unsigned>((args.p.max_seqlen_q + Shape::BQ - 1) / Shape::BQ),
            static_cast<unsigned>(args.p.num_heads_q), static_cast<unsigned>(args.p.batch));
  kernel<<<grid, Shape::NT, Shape::kBytes, to_stream(args.stream)>>>(k);
  check_launch("attention_fwd_tc_kernel");
}

}  // namespace

bool tensor_cores_usable() {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && mma_sync::device_supported(device);
}

bool forward_tc(const AttnArgs& args) {
  if (!tensor_cores_usable()) return false;
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_fwd_tc<fp16, 64>(args);
    else launch_fwd_tc<fp16, 128>(args);
  } else {
    if (d64) launch_fwd_tc<bf16, 64>(args);
    else launch_fwd_tc<bf16, 128>(args);
  }
  return true;
}

#else

bool tensor_cores_usable() { return false; }
bool forward_tc(const AttnArgs&) { return false; }

#endif  // TE_HAS_MMA_SYNC

}  // namespace portable
}  // namespace attention
}  // namespace te
