// Portable attention backward on the warp matrix units (te::warp_mma in util/arch.h), where the
// vendor has them; elsewhere backward_mma() declines and the FMA kernels of portable_bwd.cu run.
// Same three-pass, atomic-free scheme as the FMA path (deterministic): delta (shared with the FMA
// path), then dK/dV per key tile and dQ per query tile. Each warp owns 16 rows (keys or queries)
// of its block's 64; products go through fragments, the elementwise softmax gradient through a
// per-warp shared scratch, two lanes per row.
#include "attention/portable_common.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

#if TE_HAS_WARP_MMA
namespace {

template <int D>
struct MmaBwdShape {
  static constexpr int B = 64, WARPS = B / 16;  // tile of queries and of keys
  static constexpr int NT = WARPS * warp_mma::kLanes;
  static constexpr int LDH = D + 8;  // 16-bit elements per Q/K/V/dO row
  static constexpr int LDT = B + 8;  // per row of the P / dS tiles (16-bit)
  static constexpr int SCR = B + 4;  // floats per scratch row
  static constexpr size_t kTile = size_t(B) * LDH * 2;
  // four [B x D] tiles, then per warp: a [16 x B] float scratch and two [16 x B] 16-bit tiles
  static constexpr size_t kScratch = 4 * kTile;
  static constexpr size_t kSmall = kScratch + size_t(B) * SCR * 4;
  static constexpr size_t kRowStats = kSmall + 2 * size_t(B) * LDT * 2;
  static constexpr size_t kBytes = kRowStats + 2 * size_t(B) * 4;
};

// Lane layout of the elementwise steps: row r = lane / 2 of the warp's 16, columns
// half * 32 .. +31 of the 64.
struct LaneRow {
  int r, half;
  __device__ LaneRow() : r(threadIdx.x % warp_mma::kLanes / 2), half(threadIdx.x % 2) {}
};

// acc[16 x 64] = a_rows[16 x D] . b_rows[64 x D]^T, stored to scr (ld SCR).
template <typename T, int D, int SCR, int LDH>
__device__ __forceinline__ void rows_dot_rows(float* scr, const T* a_rows, const T* b_rows) {
  constexpr int DF = D / 16, NF = 4;
  warp_mma::FragC acc[NF];
#pragma unroll
  for (int j = 0; j < NF; ++j) warp_mma::zero(acc[j]);
#pragma unroll
  for (int kk = 0; kk < DF; ++kk) {
    warp_mma::FragA<T> fa;
    warp_mma::load(fa, a_rows + 16 * kk, LDH);
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      warp_mma::FragBCol<T> fb;
      warp_mma::load(fb, b_rows + 16 * j * LDH + 16 * kk, LDH);
      warp_mma::mma(acc[j], fa, fb);
    }
  }
#pragma unroll
  for (int j = 0; j < NF; ++j) warp_mma::store_c(scr + 16 * j, acc[j], SCR);
}

// acc[c] (16 x D as D/16 fragments) += left[16 x 64] (ld LDT) . right[64 x D] (ld LDH).
template <typename T, int D, int LDT, int LDH>
__device__ __forceinline__ void accumulate_product(warp_mma::FragC (&acc)[D / 16], const T* left,
                                                   const T* right) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    warp_mma::FragA<T> fa;
    warp_mma::load(fa, left + 16 * j, LDT);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      warp_mma::FragBRow<T> fb;
      warp_mma::load(fb, right + 16 * j * LDH + 16 * c, LDH);
      warp_mma::mma(acc[c], fa, fb);
    }
  }
}

// Writes acc (16 x D) * scale to rows [row0, row0 + 16) of a [positions, D] slice, rows < valid.
template <typename T, int D, int SCR_D>
__device__ __forceinline__ void store_rows(warp_mma::FragC (&acc)[D / 16], float* scr, T* base,
                                           int64_t tok_stride, int row0, int valid, float scale) {
  warp_mma::sync_lanes();
#pragma unroll
  for (int c = 0; c < D / 16; ++c) warp_mma::store_c(scr + 16 * c, acc[c], SCR_D);
  warp_mma::sync_lanes();
  const LaneRow lr;
  const int row = row0 + lr.r;
  if (row < valid) {
    T* out = base + int64_t(row) * tok_stride + lr.half * (D / 2);
#pragma unroll 8
    for (int c = 0; c < D / 2; ++c)
      out[c] = from_float<T>(scr[lr.r * SCR_D + lr.half * (D / 2) + c] * scale);
  }
  warp_mma::sync_lanes();
}

template <typename T, int D>
__global__ void __launch_bounds__(MmaBwdShape<D>::NT) attention_dkdv_mma_kernel(KernelArgs a) {
  using Shape = MmaBwdShape<D>;
  constexpr int B = Shape::B, NT = Shape::NT, LDH = Shape::LDH, LDT = Shape::LDT,
                SCR = Shape::SCR;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = reinterpret_cast<T*>(smem + Shape::kTile);
  T* q_s = reinterpret_cast<T*>(smem + 2 * Shape::kTile);
  T* do_s = reinterpret_cast<T*>(smem + 3 * Shape::kTile);
  const int warp = threadIdx.x / warp_mma::kLanes;
  float* scr = reinterpret_cast<float*>(smem + Shape::kScratch) + warp * 16 * SCR;
  T* pt_w = reinterpret_cast<T*>(smem + Shape::kSmall) + warp * 16 * LDT;           // P^T
  T* dst_w = reinterpret_cast<T*>(smem + Shape::kSmall) + (B + warp * 16) * LDT;    // dS^T
  float* lse2_s = reinterpret_cast<float*>(smem + Shape::kRowStats);
  float* delta_s = lse2_s + B;

  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * B;
  const SeqGeom g = seq_geom(a, b);
  if (k0 >= g.lk) return;
  const int off = diag_offset(a, g);
  load_tile<T, B, D, LDH, NT>(k_s, static_cast<const T*>(a.k) + g.kv_base + int64_t(hk) * D,
                              a.kv_tok_stride, k0, g.lk);
  load_tile<T, B, D, LDH, NT>(v_s, static_cast<const T*>(a.v) + g.kv_base + int64_t(hk) * D,
                              a.kv_tok_stride, k0, g.lk);
  warp_mma::FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int c = 0; c < D / 16; ++c) {
    warp_mma::zero(dk[c]);
    warp_mma::zero(dv[c]);
  }
  const LaneRow lr;
  const int j = k0 + warp * 16 + lr.r;  // this lane's key
  int lo, hi;
  query_range(a, off, k0, min(k0 + B, g.lk), g.lq, &lo, &hi);
  const int group = a.hq / a.hkv;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t head = int64_t(h) * D;
    for (int q0 = (lo / B) * B; q0 < hi; q0 += B) {
      __syncthreads();
      load_tile<T, B, D, LDH, NT>(q_s, static_cast<const T*>(a.q) + g.q_base + head,
                                  a.q_tok_stride, q0, g.lq);
      load_tile<T, B, D, LDH, NT>(do_s, static_cast<const T*>(a.d_o) + g.q_base + head,
                                  a.q_tok_stride, q0, g.lq);
      for (int rr = threadIdx.x; rr < B; rr += NT) {
        const int i = q0 + rr;
        const int64_t row = (int64_t(b) * a.hq + h) * a.sq_max + i;
        lse2_s[rr] = i < g.lq ? a.lse[row] * kLog2e : kNegInf;
        delta_s[rr] = i < g.lq ? a.delta[row] : 0.f;
      }
      __syncthreads();
      // P^T[key, query]
      rows_dot_rows<T, D, SCR, LDH>(scr, k_s + warp * 16 * LDH, q_s);
      warp_mma::sync_lanes();
      float p[32];
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = lr.half * 32 + c, i = q0 + col;
        const float l2 = lse2_s[col];
        const bool live = l2 != kNegInf && visible(a, off, i, j, g.lq, g.lk);
        p[c] = live ? fast_exp2_ftz(scr[lr.r * SCR + col] * a.scale_log2 - l2) : 0.f;
        pt_w[lr.r * LDT + col] = from_float<T>(p[c]);
      }
      warp_mma::sync_lanes();
      // dP^T[key, query] = V dO^T, then dS^T = P^T (dP^T - delta)
      rows_dot_rows<T, D, SCR, LDH>(scr, v_s + warp * 16 * LDH, do_s);
      warp_mma::sync_lanes();
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = lr.half * 32 + c;
        dst_w[lr.r * LDT + col] = from_float<T>(p[c] * (scr[lr.r * SCR + col] - delta_s[col]));
      }
      warp_mma::sync_lanes();
      accumulate_product<T, D, LDT, LDH>(dv, pt_w, do_s);
      accumulate_product<T, D, LDT, LDH>(dk, dst_w, q_s);
    }
  }
  __syncthreads();  // the q_s / do_s area becomes the output scratch below
  float* out_scr = reinterpret_cast<float*>(smem + 2 * Shape::kTile) + warp * 16 * (D + 4);
  store_rows<T, D, D + 4>(dk, out_scr, static_cast<T*>(a.dk) + g.kv_base + int64_t(hk) * D,
                          a.kv_tok_stride, k0 + warp * 16, g.lk, a.scale);
  store_rows<T, D, D + 4>(dv, out_scr, static_cast<T*>(a.dv) + g.kv_base + int64_t(hk) * D,
                          a.kv_tok_stride, k0 + warp * 16, g.lk, 1.f);
}

template <typename T, int D>
__global__ void __launch_bounds__(MmaBwdShape<D>::NT) attention_dq_mma_kernel(KernelArgs a) {
  using Shape = MmaBwdShape<D>;
  constexpr int B = Shape::B, NT = Shape::NT, LDH = Shape::LDH, LDT = Shape::LDT,
                SCR = Shape::SCR;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = reinterpret_cast<T*>(smem + Shape::kTile);
  T* k_s = reinterpret_cast<T*>(smem + 2 * Shape::kTile);
  T* v_s = reinterpret_cast<T*>(smem + 3 * Shape::kTile);
  const int warp = threadIdx.x / warp_mma::kLanes;
  float* scr = reinterpret_cast<float*>(smem + Shape::kScratch) + warp * 16 * SCR;
  T* ds_w = reinterpret_cast<T*>(smem + Shape::kSmall) + warp * 16 * LDT;
  float* lse2_s = reinterpret_cast<float*>(smem + Shape::kRowStats);
  float* delta_s = lse2_s + B;

  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * B;
  const SeqGeom g = seq_geom(a, b);
  if (q0 >= g.lq) return;
  const int hk = h / (a.hq / a.hkv);
  const int off = diag_offset(a, g);
  const int64_t head = int64_t(h) * D;
  load_tile<T, B, D, LDH, NT>(q_s, static_cast<const T*>(a.q) + g.q_base + head, a.q_tok_stride,
                              q0, g.lq);
  load_tile<T, B, D, LDH, NT>(do_s, static_cast<const T*>(a.d_o) + g.q_base + head,
                              a.q_tok_stride, q0, g.lq);
  for (int rr = threadIdx.x; rr < B; rr += NT) {
    const int i = q0 + rr;
    const int64_t row = (int64_t(b) * a.hq + h) * a.sq_max + i;
    lse2_s[rr] = i < g.lq ? a.lse[row] * kLog2e : kNegInf;
    delta_s[rr] = i < g.lq ? a.delta[row] : 0.f;
  }
  warp_mma::FragC dq[D / 16];
#pragma unroll
  for (int c = 0; c < D / 16; ++c) warp_mma::zero(dq[c]);
  const LaneRow lr;
  const int row_local = warp * 16 + lr.r, i = q0 + row_local;
  int lo, hi;
  key_range(a, off, q0, min(q0 + B, g.lq), g.lk, &lo, &hi);
  const T* kg = static_cast<const T*>(a.k) + g.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + g.kv_base + int64_t(hk) * D;
  for (int k0 = (lo / B) * B; k0 < hi; k0 += B) {
    __syncthreads();
    load_tile<T, B, D, LDH, NT>(k_s, kg, a.kv_tok_stride, k0, g.lk);
    load_tile<T, B, D, LDH, NT>(v_s, vg, a.kv_tok_stride, k0, g.lk);
    __syncthreads();
    rows_dot_rows<T, D, SCR, LDH>(scr, q_s + warp * 16 * LDH, k_s);  // S
    warp_mma::sync_lanes();
    const float l2 = lse2_s[row_local];
    float p[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = lr.half * 32 + c;
      const bool live = l2 != kNegInf && visible(a, off, i, k0 + col, g.lq, g.lk);
      p[c] = live ? fast_exp2_ftz(scr[lr.r * SCR + col] * a.scale_log2 - l2) : 0.f;
    }
    warp_mma::sync_lanes();
    rows_dot_rows<T, D, SCR, LDH>(scr, do_s + warp * 16 * LDH, v_s);  // dP
    warp_mma::sync_lanes();
    const float dlt = delta_s[row_local];
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = lr.half * 32 + c;
      ds_w[lr.r * LDT + col] = from_float<T>(p[c] * (scr[lr.r * SCR + col] - dlt));
    }
    warp_mma::sync_lanes();
    accumulate_product<T, D, LDT, LDH>(dq, ds_w, k_s);
  }
  __syncthreads();  // k_s / v_s become the output scratch
  float* out_scr = reinterpret_cast<float*>(smem + 2 * Shape::kTile) + warp * 16 * (D + 4);
  store_rows<T, D, D + 4>(dq, out_scr, static_cast<T*>(a.dq) + g.q_base + head, a.q_tok_stride,
                          q0 + warp * 16, g.lq, a.scale);
}

template <typename Kernel>
void grant_smem(Kernel kernel, size_t bytes, const char* name) {
  // Every call: the attribute belongs to the current device's context. The const void* form:
  // HIP has no templated overload taking the kernel itself.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", bytes, " bytes of shared memory to ",
                                         name));
}

template <typename T, int D>
void launch_bwd_mma(const AttnArgs& args, const KernelArgs& k) {
  using Shape = MmaBwdShape<D>;
  static_assert(2 * MmaBwdShape<D>::kTile >= size_t(MmaBwdShape<D>::B) * (D + 4) * 4,
                "two tiles hold the output scratch");
  const cudaStream_t stream = to_stream(args.stream);
  const unsigned batch = static_cast<unsigned>(args.p.batch);
  const unsigned k_tiles = static_cast<unsigned>((args.p.max_seqlen_kv + Shape::B - 1) / Shape::B);
  const unsigned q_tiles = static_cast<unsigned>((args.p.max_seqlen_q + Shape::B - 1) / Shape::B);
  auto dkdv = attention_dkdv_mma_kernel<T, D>;
  grant_smem(dkdv, Shape::kBytes, "attention_dkdv_mma_kernel");
  dkdv<<<dim3(k_tiles, static_cast<unsigned>(args.p.num_heads_kv), batch), Shape::NT,
         Shape::kBytes, stream>>>(k);
  check_launch("attention_dkdv_mma_kernel");
  if (q_tiles == 0) return;
  auto dq = attention_dq_mma_kernel<T, D>;
  grant_smem(dq, Shape::kBytes, "attention_dq_mma_kernel");
  dq<<<dim3(q_tiles, static_cast<unsigned>(args.p.num_heads_q), batch), Shape::NT, Shape::kBytes,
       stream>>>(k);
  check_launch("attention_dq_mma_kernel");
}

}  // namespace

bool backward_mma(const AttnArgs& args, const KernelArgs& k) {
  const bool d64 = args.p.head_dim_qk == 64;
  if (args.p.dtype == kNVTEFloat16) {
    if (d64) launch_bwd_mma<fp16, 64>(args, k);
    else launch_bwd_mma<fp16, 128>(args, k);
  } else {
    if (d64) launch_bwd_mma<bf16, 64>(args, k);
    else launch_bwd_mma<bf16, 128>(args, k);
  }
  return true;
}

#else

bool backward_mma(const AttnArgs&, const KernelArgs&) { return false; }

#endif  // TE_HAS_WARP_MMA

}  // namespace portable
}  // namespace attention
}  // namespace te
