// Portable attention forward on the warp matrix units (te::warp_mma in util/arch.h), where the
// vendor has them; elsewhere forward_mma() declines and the FMA kernel of portable_fwd.cu runs.
//
// One block per (64 query rows, query head, sequence); each warp owns 16 rows. Per 64-key tile:
// S = Q K^T into fragments, S to a per-warp shared scratch, online softmax by the warp's lanes
// (two lanes per row) writing P in the input dtype, the output fragments rescaled through the
// scratch only when a row maximum moved, then O += P V. Fragments never expose a register
// layout, so the same code is valid for any WMMA-style mapping.
#include "attention/portable_common.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_WARP_MMA
namespace {

template <int D>
struct MmaFwdShape {
  static constexpr int BQ = 64, BK = 64, WARPS = BQ / 16;
  static constexpr int NT = WARPS * warp_mma::kLanes;
  static constexpr int LDH = D + 8;   // 16-bit elements per Q/K/V row: rows stay 32-byte aligned
  static constexpr int LDP = BK + 8;  // per P row
  static constexpr int SCR = (D > BK ? D : BK) + 4;  // floats per scratch row
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(BQ) * LDH * 2;
  static constexpr size_t kV = kK + size_t(BK) * LDH * 2;
  static constexpr size_t kP = kV + size_t(BK) * LDH * 2;
  static constexpr size_t kScratch = kP + size_t(BQ) * LDP * 2;
  static constexpr size_t kBytes = kScratch + size_t(BQ) * SCR * 4;
};

template <typename T, int D>
__global__ void __launch_bounds__(MmaFwdShape<D>::NT) attention_fwd_mma_kernel(KernelArgs a) {
  using Shape = MmaFwdShape<D>;
  constexpr int BQ = Shape::BQ, BK = Shape::BK, NT = Shape::NT, LDH = Shape::LDH,
                LDP = Shape::LDP, SCR = Shape::SCR;
  constexpr int DF = D / 16, KF = BK / 16;
  constexpr int kHalfBK = BK / 2, kHalfD = D / 2;  // each lane: half a row
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + Shape::kQ);
  T* k_s = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kV);
  const int warp = threadIdx.x / warp_mma::kLanes, lane = threadIdx.x % warp_mma::kLanes;
  T* p_w = reinterpret_cast<T*>(smem + Shape::kP) + warp * 16 * LDP;
  float* scr = reinterpret_cast<float*>(smem + Shape::kScratch) + warp * 16 * SCR;
  const T* q_w = q_s + warp * 16 * LDH;

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * BQ;
  const SeqGeom g = seq_geom(a, b);
  if (q0 >= g.lq) return;
  const int hk = h / (a.hq / a.hkv);
  const int off = diag_offset(a, g);
  const T* qg = static_cast<const T*>(a.q) + g.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + g.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + g.kv_base + int64_t(hk) * D;
  load_tile<T, BQ, D, LDH, NT>(q_s, qg, a.q_tok_stride, q0, g.lq);

  warp_mma::FragC o[DF];
#pragma unroll
  for (int c = 0; c < DF; ++c) warp_mma::zero(o[c]);
  const int r = lane / 2, half = lane % 2;  // this lane's row of the warp's 16, and its half
  const int i = q0 + warp * 16 + r;
  float m_row = kNegInf, l_row = 0.f;
  int lo, hi;
  key_range(a, off, q0, min(q0 + BQ, g.lq), g.lk, &lo, &hi);
  for (int k0 = (lo / BK) * BK; k0 < hi; k0 += BK) {
    __syncthreads();  // every warp is done with the previous k_s / v_s
    load_tile<T, BK, D, LDH, NT>(k_s, kg, a.kv_tok_stride, k0, g.lk);
    load_tile<T, BK, D, LDH, NT>(v_s, vg, a.kv_tok_stride, k0, g.lk);
    __syncthreads();
    {
      warp_mma::FragC s[KF];
#pragma unroll
      for (int j = 0; j < KF; ++j) warp_mma::zero(s[j]);
#pragma unroll
      for (int kk = 0; kk < DF; ++kk) {
        warp_mma::FragA<T> qa;
        warp_mma::load(qa, q_w + 16 * kk, LDH);
#pragma unroll
        for (int j = 0; j < KF; ++j) {
          warp_mma::FragBCol<T> kb;
          warp_mma::load(kb, k_s + 16 * j * LDH + 16 * kk, LDH);
          warp_mma::mma(s[j], qa, kb);
        }
      }
#pragma unroll
      for (int j = 0; j < KF; ++j) warp_mma::store_c(scr + 16 * j, s[j], SCR);
    }
    warp_mma::sync_lanes();
    float vals[kHalfBK];
    float tile_max = kNegInf;
#pragma unroll
    for (int c = 0; c < kHalfBK; ++c) {
      const int col = half * kHalfBK + c;
      const float x = scr[r * SCR + col];
      vals[c] = visible(a, off, i, k0 + col, g.lq, g.lk) ? x * a.scale_log2 : kNegInf;
      tile_max = fmaxf(tile_max, vals[c]);
    }
    tile_max = fmaxf(tile_max, warp_shfl_xor(tile_max, 1));
    const float m_new = fmaxf(m_row, tile_max);
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    const float alpha = fast_exp2_ftz(m_row - m_use);
    l_row *= alpha;
#pragma unroll
    for (int c = 0; c < kHalfBK; ++c) {
      const float p = fast_exp2_ftz(vals[c] - m_use);
      l_row += p;
      p_w[r * LDP + half * kHalfBK + c] = from_float<T>(p);
    }
    // rows whose maximum moved rescale their output; skipped while no row needs it
    const bool moved = m_row != kNegInf && alpha != 1.f;
    m_row = m_new;
    if (group_max<warp_mma::kLanes>(moved ? 1.f : 0.f) != 0.f) {
      warp_mma::sync_lanes();  // the S values in scratch were read above
#pragma unroll
      for (int c = 0; c < DF; ++c) warp_mma::store_c(scr + 16 * c, o[c], SCR);
      warp_mma::sync_lanes();
#pragma unroll 8
      for (int c = 0; c < kHalfD; ++c) scr[r * SCR + half * kHalfD + c] *= alpha;
      warp_mma::sync_lanes();
#pragma unroll
      for (int c = 0; c < DF; ++c) warp_mma::load_c(o[c], scr + 16 * c, SCR);
    }
    warp_mma::sync_lanes();  // P complete for the warp
#pragma unroll
    for (int j = 0; j < KF; ++j) {
      warp_mma::FragA<T> pa;
      warp_mma::load(pa, p_w + 16 * j, LDP);
#pragma unroll
      for (int c = 0; c < DF; ++c) {
        warp_mma::FragBRow<T> vb;
        warp_mma::load(vb, v_s + 16 * j * LDH + 16 * c, LDH);
        warp_mma::mma(o[c], pa, vb);
      }
    }
  }

  warp_mma::sync_lanes();
#pragma unroll
  for (int c = 0; c < DF; ++c) warp_mma::store_c(scr + 16 * c, o[c], SCR);
  warp_mma::sync_lanes();
  const float sum = l_row + warp_shfl_xor(l_row, 1);
  if (i < g.lq) {
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* og = static_cast<T*>(a.o) + g.q_base + int64_t(i) * a.q_tok_stride + int64_t(h) * D;
#pragma unroll 8
    for (int c = 0; c < kHalfD; ++c)
      og[half * kHalfD + c] = from_float<T>(scr[r * SCR + half * kHalfD + c] * inv);
    if (half == 0)
      a.lse[(int64_t(b) * a.hq + h) * a.sq_max + i] =
          sum > 0.f ? (m_row + log2f(sum)) / kLog2e : kNegInf;
  }
}

template <typename T, int D>
void launch_fwd_mma(const AttnArgs& args) {
  using Shape = MmaFwdShape<D>;
  auto kernel = attention_fwd_mma_kernel<T, D>;
  // Every call, not once: the attribute belongs to the current device's context. The const
  // void* form: HIP has no templated overload taking the kernel itself.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Shape::kBytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", Shape::kBytes,
                                         " bytes of shared memory to attention_fwd_mma_kernel"));
  const KernelArgs k = make_kernel_args(args);
  dim3 grid(static_cast<unsigned>((args.p.max_seqlen_q + Shape::BQ - 1) / Shape::BQ),
            static_cast<unsigned>(args.p.num_heads_q), static_cast<unsigned>(args.p.batch));
  kernel<<<grid, Shape::NT, Shape::kBytes, to_stream(args.stream)>>>(k);
  check_launch("attention_fwd_mma_kernel");
}

template <typename T>
void forward_mma_for_type(const AttnArgs& args) {
  if (args.p.head_dim_qk == 64) launch_fwd_mma<T, 64>(args);
  else launch_fwd_mma<T, 128>(args);
}

}  // namespace

bool forward_mma(const AttnArgs& args) {
  if (args.p.dtype == kNVTEFloat16) forward_mma_for_type<fp16>(args);
  else forward_mma_for_type<bf16>(args);
  return true;
}

#else

bool forward_mma(const AttnArgs&) { return false; }

#endif  // TE_HAS_WARP_MMA

}  // namespace portable
}  // namespace attention
}  // namespace te
