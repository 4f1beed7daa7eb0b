// Portable attention forward: one block per (query tile, query head, sequence), keys streamed
// through shared memory in tiles with an online softmax (running max and sum per row, in the
// log2 domain), the output accumulated in registers and normalised once at the end.
#include <atomic>

#include "attention/online_softmax.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {

KernelArgs make_kernel_args(const AttnArgs& a) {
  const NVTEAttnParams& p = a.p;
  KernelArgs k{};
  k.q = a.q;
  k.k = a.k;
  k.v = a.v;
  k.o = a.o;
  k.d_o = a.d_o;
  k.lse = a.lse;
  k.dq = a.dq;
  k.dk = a.dk;
  k.dv = a.dv;
  k.cu_q = a.uses_lengths ? a.cu_q : nullptr;
  k.cu_kv = a.uses_lengths ? a.cu_kv : nullptr;
  const int64_t d = p.head_dim_qk;  // == head_dim_v (portable_check)
  const int64_t q_row = p.num_heads_q * d, kv_row = p.num_heads_kv * d;
  switch (p.qkv_format) {
    case kNVTEQKVFormatBSHD:
      k.q_tok_stride = q_row;
      k.kv_tok_stride = kv_row;
      k.q_batch_stride = p.max_seqlen_q * q_row;
      k.kv_batch_stride = p.max_seqlen_kv * kv_row;
      break;
    case kNVTEQKVFormatSBHD:
      k.q_tok_stride = p.batch * q_row;
      k.kv_tok_stride = p.batch * kv_row;
      k.q_batch_stride = q_row;
      k.kv_batch_stride = kv_row;
      break;
    default:
      k.q_tok_stride = q_row;
      k.kv_tok_stride = kv_row;
      k.packed = 1;
      break;
  }
  k.hq = static_cast<int>(p.num_heads_q);
  k.hkv = static_cast<int>(p.num_heads_kv);
  k.sq_max = static_cast<int>(p.max_seqlen_q);
  k.skv_max = static_cast<int>(p.max_seqlen_kv);
  k.scale = p.softmax_scale;
  k.scale_log2 = p.softmax_scale * kLog2e;
  k.left = static_cast<int>(a.window_left);
  k.right = static_cast<int>(a.window_right);
  k.bottom_right = a.bottom_right ? 1 : 0;
  return k;
}

namespace {

template <typename T, int D, int BQ, int BK, int NT>
__global__ void __launch_bounds__(NT) attention_fwd_kernel(KernelArgs a) {
  constexpr int CN = 4;            // key columns per thread
  constexpr int TX = BK / CN;      // threads across a row
  constexpr int TY = NT / TX;
  constexpr int RM = BQ / TY;      // query rows per thread
  constexpr int DN = D / TX;       // output dims per thread
  constexpr int LD = D + 2;
  constexpr int LDP = BK + 1;
  static_assert(TX <= 32 && RM * TY == BQ && DN * TX == D, "tile shape");
  // 16-bit tiles as raw uint16_t: a __shared__ array of a vendor half type with a non-trivial
  // constructor would be refused by some toolchains.
  __shared__ __align__(16) uint16_t q_raw[BQ * LD];
  __shared__ __align__(16) uint16_t k_raw[BK * LD];
  __shared__ __align__(16) uint16_t v_raw[BK * LD];
  __shared__ float p_s[BQ * LDP];
  T* q_s = reinterpret_cast<T*>(q_raw);
  T* k_s = reinterpret_cast<T*>(k_raw);
  T* v_s = reinterpret_cast<T*>(v_raw);

  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * BQ;
  const SeqGeom g = seq_geom(a, b);
  if (q0 >= g.lq) return;
  const int hk = kv_head(a, h);
  const int off = diag_offset(a, g);
  const T* qg = static_cast<const T*>(a.q) + g.q_base + int64_t(h) * D;
  const T* kg = static_cast<const T*>(a.k) + g.kv_base + int64_t(hk) * D;
  const T* vg = static_cast<const T*>(a.v) + g.kv_base + int64_t(hk) * D;
  load_tile<T, BQ, D, LD, NT>(q_s, qg, a.q_tok_stride, q0, g.lq);

  float m[RM], l[RM], o[RM][DN];
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    m[r] = kNegInf;
    l[r] = 0.f;
  }
  zero(o);
  int lo, hi;
  key_range(a, off, q0, min(q0 + BQ, g.lq), g.lk, &lo, &hi);
  const int row0 = ty * RM;
  for (int k0 = tile_start<BK>(lo); k0 < hi; k0 += BK) {
    __syncthreads();  // the previous tile's k_s / v_s / p_s are no longer read
    load_tile<T, BK, D, LD, NT>(k_s, kg, a.kv_tok_stride, k0, g.lk);
    load_tile<T, BK, D, LD, NT>(v_s, vg, a.kv_tok_stride, k0, g.lk);
    __syncthreads();
    float s[RM][CN];
    zero(s);
    tile_fma<RM, CN, D>(
        s, [&](int r, int d) { return to_float(q_s[(row0 + r) * LD + d]); },
        [&](int d, int c) { return to_float(k_s[(tx + TX * c) * LD + d]); });
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const int i = q0 + row0 + r;
      float row_max = kNegInf;
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int j = k0 + tx + TX * c;
        s[r][c] = visible(a, off, i, j, g.lq, g.lk) ? s[r][c] * a.scale_log2 : kNegInf;
        row_max = fmaxf(row_max, s[r][c]);
      }
      float alpha;
      const float m_use = update_row_max(m[r], group_max<TX>(row_max), alpha);
      l[r] *= alpha;
#pragma unroll
      for (int c = 0; c < DN; ++c) o[r][c] *= alpha;
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const float pv = fast_exp2_ftz(s[r][c] - m_use);
        l[r] += pv;
        p_s[(row0 + r) * LDP + tx + TX * c] = pv;
      }
    }
    __syncthreads();
    tile_fma<RM, DN, BK>(
        o, [&](int r, int j) { return p_s[(row0 + r) * LDP + j]; },
        [&](int j, int c) { return to_float(v_s[j * LD + tx + TX * c]); });
  }

  T* og = static_cast<T*>(a.o) + g.q_base + int64_t(h) * D;
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const float sum = group_sum<TX>(l[r]);
    const int i = q0 + row0 + r;
    if (i >= g.lq) continue;
    const float inv = row_inverse(sum);
#pragma unroll
    for (int c = 0; c < DN; ++c)
      og[int64_t(i) * a.q_tok_stride + tx + TX * c] = from_float<T>(o[r][c] * inv);
    if (tx == 0) store_row_lse(a, b, h, i, m[r], sum);
  }
}

template <typename T, int D, int BQ, int BK, int NT>
void launch_fwd(const AttnArgs& args) {
  const KernelArgs k = make_kernel_args(args);
  dim3 grid(static_cast<unsigned>((args.p.max_seqlen_q + BQ - 1) / BQ),
            static_cast<unsigned>(args.p.num_heads_q), static_cast<unsigned>(args.p.batch));
  attention_fwd_kernel<T, D, BQ, BK, NT><<<grid, NT, 0, to_stream(args.stream)>>>(k);
  check_launch("attention_fwd_kernel");
}

template <typename T>
void forward_for_type(const AttnArgs& args) {
  if (args.p.head_dim_qk == 64) launch_fwd<T, 64, 64, 64, 256>(args);
  else launch_fwd<T, 128, 64, 32, 256>(args);
}

}  // namespace
}  // namespace portable

void portable_check(const NVTEAttnParams& p) {
  if (p.head_dim_qk != p.head_dim_v)
    TE_UNSUPPORTED("head dims ", p.head_dim_qk, " (qk) and ", p.head_dim_v,
                   " (v) differ; the portable kernel needs them equal");
  if (p.head_dim_qk != 64 && p.head_dim_qk != 128)
    TE_UNSUPPORTED("head dim ", p.head_dim_qk, " is not compiled in the portable kernel (64, 128)");
  const int64_t kIntMax = 2147483647;
  if (p.max_seqlen_q > kIntMax / 2 || p.max_seqlen_kv > kIntMax / 2 || p.num_heads_q > 65535 ||
      p.batch > 65535)
    TE_UNSUPPORTED("sizes beyond the portable kernel's grid (seqlen < 2^30, heads and batch "
                   "<= 65535)");
}

size_t portable::delta_workspace_bytes(const NVTEAttnParams& p) {
  const size_t rows = size_t(p.batch) * size_t(p.num_heads_q) * size_t(p.max_seqlen_q);
  return ((rows * sizeof(float) + 255) / 256) * 256;
}

size_t portable_workspace_size(const NVTEAttnParams& p, bool is_backward) {
  if (!is_backward) return 0;
  // delta rows; a non-deterministic call also fp32 dQ sums (portable_bwd_tc_atomic.cu), asked
  // for whichever kernel then runs, so that the size does not depend on the device. AMD builds
  // have no such kernel (TE_HAS_MMA_SYNC 0) and do not ask.
  size_t bytes = portable::delta_workspace_bytes(p);
  if (!p.deterministic && TE_HAS_MMA_SYNC)
    bytes += size_t(p.batch) * size_t(p.num_heads_q) * size_t(p.max_seqlen_q) *
             size_t(p.head_dim_qk) * sizeof(float);
  return bytes;
}

namespace {
std::atomic<int> g_portable_variant{kNVTEAttnPortableAuto};
}  // namespace

bool portable::matrix_units_allowed() {
  return g_portable_variant.load() == kNVTEAttnPortableAuto;
}

void portable_forward(const AttnArgs& args) {
  // The one choice of kernel: Hopper's warpgroup MMA (NVIDIA sm_90a), else the register-level
  // tensor cores (NVIDIA sm_80+), else the FMA kernel (AMD, or the 'fma' variant). The
  // backward (portable_bwd.cu) chooses the same way.
  if (portable::matrix_units_allowed() &&
      (portable::forward_wgmma(args) || portable::forward_tc(args)))
    return;
  if (args.p.dtype == kNVTEFloat16) portable::forward_for_type<fp16>(args);
  else portable::forward_for_type<bf16>(args);
}

}  // namespace attention
}  // namespace te

extern "C" NVTEStatus nvte_attention_set_portable_variant(NVTEAttnPortableVariant variant) {
  return te::guard("nvte_attention_set_portable_variant", [&] {
    TE_CHECK_ARG(variant == kNVTEAttnPortableAuto || variant == kNVTEAttnPortableFmaOnly,
                 "variant is ", static_cast<int>(variant), "; expected 0 (auto) or 1 (FMA only)");
    te::attention::g_portable_variant.store(variant);
  });
}
