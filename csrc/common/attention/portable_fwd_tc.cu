// Portable attention forward on the tensor cores at register level (portable_tc.cuh), the
// NVIDIA sm_80+ path; forward_tc() declines elsewhere and portable_forward() falls back.
//
// One block per (BQ = 16 * WARPS query rows, query head, sequence); warp w owns rows 16w..16w+15.
// Key/value tiles of 64 rows stream through two shared-memory stages with cp.async, the next
// tile's copy overlapping this tile's products. Per tile and warp: S = Q K^T in accumulator
// fragments, the online softmax on them (row max and sum over the four lanes of a row, log2
// domain), P packed in place into A fragments, O += P V. Heavy (late, for causal masks) query
// tiles are scheduled first.
#include "attention/portable_tc.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_MMA_SYNC
namespace {

template <int D>
struct TcFwdShape {
  static constexpr int WARPS = 8, BQ = 16 * WARPS, BK = 64, NT = WARPS * tc::kLanes;
  static constexpr int LD = tc::TileRow<D>::LD;
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(BQ) * LD * 2;         // two stages
  static constexpr size_t kV = kK + 2 * size_t(BK) * LD * 2;     // two stages
  static constexpr size_t kBytes = kV + 2 * size_t(BK) * LD * 2;
};

template <typename T, int D>
__global__ void __launch_bounds__(TcFwdShape<D>::NT, 2) attention_fwd_tc_kernel(KernelArgs a) {
  using Shape = TcFwdShape<D>;
  constexpr int BQ = Shape::BQ, BK = Shape::BK, NT = Shape::NT, LD = Shape::LD;
  constexpr int SN = BK / 8, ON = D / 8;  // fragments per S row, per O row
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + Shape::kQ);
  T* k_s = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kV);
  const int warp = threadIdx.x / tc::kLanes, lane = threadIdx.x % tc::kLanes;
  const int g = lane / 4, quad = lane % 4;

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const SeqGeom geo = seq_geom(a, b);
  if (q0 >= geo.lq) return;
  const int hk = h / (a.hq / a.hkv);
  const int off = diag_offset(a, geo);
  const T* qg = static_cast<const T*>(a.q) + geo.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + geo.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + geo.kv_base + int64_t(hk) * D;
  const int q1 = min(q0 + BQ, geo.lq);
  int lo, hi;
  key_range(a, off, q0, q1, geo.lk, &lo, &hi);
  const int k_first = (lo / BK) * BK;

  tc::load_tile_async<T, BQ, D, NT>(q_s, qg, a.q_tok_stride, q0, geo.lq);
  if (k_first < hi) {
    tc::load_tile_async<T, BK, D, NT>(k_s, kg, a.kv_tok_stride, k_first, geo.lk);
    tc::load_tile_async<T, BK, D, NT>(v_s, vg, a.kv_tok_stride, k_first, geo.lk);
  }
  mma_sync::cp_async_commit();

  float o[ON][4];
  tc::zero_acc(o);
  float m_row[2] = {kNegInf, kNegInf}, l_row[2] = {0.f, 0.f};  // rows g and g + 8
  const int i0 = q0 + warp * 16 + g;
  const T* q_w = q_s + warp * 16 * LD;
  int stage = 0;
  for (int k0 = k_first; k0 < hi; k0 += BK, stage ^= 1) {
    mma_sync::cp_async_wait<0>();
    __syncthreads();  // tile k0 landed for every thread; every warp is done with the other stage
    if (k0 + BK < hi) {
      tc::load_tile_async<T, BK, D, NT>(k_s + (stage ^ 1) * BK * LD, kg, a.kv_tok_stride,
                                        k0 + BK, geo.lk);
      tc::load_tile_async<T, BK, D, NT>(v_s + (stage ^ 1) * BK * LD, vg, a.kv_tok_stride,
                                        k0 + BK, geo.lk);
    }
    mma_sync::cp_async_commit();

    float s[SN][4];
    tc::zero_acc(s);
    tc::mma_rows_rows<T, D, BK>(s, q_w, k_s + stage * BK * LD, lane);
    const bool full = tc::tile_all_visible(a, off, q0, q1, k0, k0 + BK, geo.lk);
#pragma unroll
    for (int n = 0; n < SN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + 8 * (e / 2), j = k0 + n * 8 + 2 * quad + (e % 2);
        s[n][e] = (full || visible(a, off, i, j, geo.lq, geo.lk)) ? s[n][e] * a.scale_log2
                                                                  : kNegInf;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = kNegInf;
#pragma unroll
      for (int n = 0; n < SN; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      const float m_new = fmaxf(m_row[r], tc::quad_max(mx));
      const float m_use = m_new == kNegInf ? 0.f : m_new;  // a row with nothing visible yet
      const float alpha = fast_exp2_ftz(m_row[r] - m_use);
      m_row[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        s[n][2 * r] = fast_exp2_ftz(s[n][2 * r] - m_use);
        s[n][2 * r + 1] = fast_exp2_ftz(s[n][2 * r + 1] - m_use);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l_row[r] = l_row[r] * alpha + sum;
#pragma unroll
      for (int n = 0; n < ON; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
    uint32_t p[BK / 16][4];
    tc::pack_a<T, BK>(p, s);
    tc::mma_frag_rows<T, D, BK>(o, p, v_s + stage * BK * LD, lane);
  }
  mma_sync::cp_async_wait<0>();  // nothing may be in flight when the block exits

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = tc::quad_sum(l_row[r]);
    inv[r] = sum > 0.f ? 1.f / sum : 0.f;
    const int i = i0 + 8 * r;
    if (quad == 0 && i < geo.lq)
      a.lse[(int64_t(b) * a.hq + h) * a.sq_max + i] =
          sum > 0.f ? (m_row[r] + log2f(sum)) / kLog2e : kNegInf;
  }
  tc::store_acc<T, D>(o, static_cast<T*>(a.o) + geo.q_base + int64_t(h) * D, a.q_tok_stride,
                      q0 + warp * 16, geo.lq, inv[0], inv[1], lane);
}

template <typename T, int D>
void launch_fwd_tc(const AttnArgs& args) {
  using Shape = TcFwdShape<D>;
  auto kernel = attention_fwd_tc_kernel<T, D>;
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
