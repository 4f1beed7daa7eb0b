// Portable attention backward, deterministic (no atomics), in three kernels:
//   delta:  delta_i = sum_d dO_id * O_id                          (into the workspace)
//   dK/dV:  one block per (key tile, kv head, sequence) walks every query tile of the heads of
//           its GQA group, recomputing P = exp(S - lse) and dS = P * (dP - delta), and sums
//           dV += P^T dO, dK += scale * dS^T Q in registers
//   dQ:     one block per (query tile, query head, sequence) walks the key tiles and sums
//           dQ += scale * dS K
// Recomputing S and dP in the dQ pass costs FLOPs but keeps every gradient a plain sum owned by
// one block, so the result does not depend on scheduling.
#include "attention/online_softmax.cuh"
#include "attention/tile_pipeline.cuh"
#include "util/error.h"

namespace te {
namespace attention {
namespace portable {
namespace {

constexpr int kBwdTile = 32;     // BQ = BK
constexpr int kBwdThreads = 128;

template <typename T, int D>
__global__ void __launch_bounds__(128) attention_delta_kernel(KernelArgs a) {
  constexpr int kLanes = 32;  // one logical warp per row
  constexpr int kRows = 128 / kLanes;
  const int lane = threadIdx.x % kLanes;
  const int h = blockIdx.y, b = blockIdx.z;
  const int i = blockIdx.x * kRows + threadIdx.x / kLanes;
  const SeqGeom g = seq_geom(a, b);
  float acc = 0.f;
  if (i < g.lq) {
    const int64_t base = g.q_base + int64_t(i) * a.q_tok_stride + int64_t(h) * D;
    const T* o = static_cast<const T*>(a.o) + base;
    const T* d_o = static_cast<const T*>(a.d_o) + base;
#pragma unroll
    for (int d = lane; d < D; d += kLanes) acc += to_float(o[d]) * to_float(d_o[d]);
  }
  acc = group_sum<kLanes>(acc);
  const int64_t row = stats_row(a, b, h, i);
  if (i < g.lq && lane == 0) a.delta[row] = acc;
  if (a.dq_acc != nullptr && i < g.lq) {  // the single-pass backward's dQ sums start at zero
#pragma unroll
    for (int d = lane; d < D; d += kLanes) a.dq_acc[row * D + d] = 0.f;
  }
}

// Shared pieces of the two gradient kernels: one [BQ x BK] step of S, P, dP and dS.
// 16-bit tiles are declared as raw uint16_t: a __shared__ array of a vendor half type with a
// non-trivial constructor would be refused by some toolchains.
template <typename T>
__device__ __forceinline__ float smem_val(const uint16_t* s, int i) {
  return to_float(reinterpret_cast<const T*>(s)[i]);
}

template <typename T, int D>
struct alignas(16) BwdTiles {
  static constexpr int B = kBwdTile;
  static constexpr int NT = kBwdThreads;
  static constexpr int CN = 4;
  static constexpr int TX = B / CN;     // 8
  static constexpr int TY = NT / TX;    // 16
  static constexpr int RM = B / TY;     // 2
  static constexpr int DN = D / TX;
  static constexpr int LD = D + 2;
  static constexpr int LDP = B + 1;
  uint16_t q[B * LD];
  uint16_t d_o[B * LD];
  uint16_t k[B * LD];
  uint16_t v[B * LD];
  float p[B * LDP];
  float ds[B * LDP];
  float lse2[B];   // lse * log2(e), -inf for rows without a visible key
  float delta[B];

  // Loads query rows [q0, q0 + B) of head h (q, dO, lse, delta).
  __device__ void load_queries(const KernelArgs& a, const SeqGeom& g, int b, int h, int q0) {
    const int64_t head = int64_t(h) * D;
    load_tile<T, B, D, LD, NT>(reinterpret_cast<T*>(q),
                               static_cast<const T*>(a.q) + g.q_base + head, a.q_tok_stride, q0,
                               g.lq);
    load_tile<T, B, D, LD, NT>(reinterpret_cast<T*>(d_o),
                               static_cast<const T*>(a.d_o) + g.q_base + head, a.q_tok_stride,
                               q0, g.lq);
    load_row_stats<B, NT>(a, g, b, h, q0, lse2, delta);
  }

  __device__ void load_keys(const KernelArgs& a, const SeqGeom& g, int hk, int k0) {
    const int64_t head = int64_t(hk) * D;
    load_tile<T, B, D, LD, NT>(reinterpret_cast<T*>(k),
                               static_cast<const T*>(a.k) + g.kv_base + head, a.kv_tok_stride,
                               k0, g.lk);
    load_tile<T, B, D, LD, NT>(reinterpret_cast<T*>(v),
                               static_cast<const T*>(a.v) + g.kv_base + head, a.kv_tok_stride,
                               k0, g.lk);
  }

  // p = softmax probabilities, ds = p * (dO.v - delta); both into shared memory (p optional).
  __device__ void probabilities(const KernelArgs& a, const SeqGeom& g, int off, int q0, int k0,
                                bool keep_p) {
    const int tx = threadIdx.x % TX, row0 = (threadIdx.x / TX) * RM;
    float s[RM][CN], dp[RM][CN];
    zero(s);
    zero(dp);
    tile_fma<RM, CN, D>(
        s, [&](int r, int d) { return smem_val<T>(q, (row0 + r) * LD + d); },
        [&](int d, int c) { return smem_val<T>(k, (tx + TX * c) * LD + d); });
    tile_fma<RM, CN, D>(
        dp, [&](int r, int d) { return smem_val<T>(d_o, (row0 + r) * LD + d); },
        [&](int d, int c) { return smem_val<T>(v, (tx + TX * c) * LD + d); });
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const int i = q0 + row0 + r;
      const float l2 = lse2[row0 + r];
#pragma unroll
      for (int c = 0; c < CN; ++c) {
        const int j = k0 + tx + TX * c;
        const bool live = l2 != kNegInf && visible(a, off, i, j, g.lq, g.lk);
        const float pv = live ? fast_exp2_ftz(s[r][c] * a.scale_log2 - l2) : 0.f;
        if (keep_p) p[(row0 + r) * LDP + tx + TX * c] = pv;
        ds[(row0 + r) * LDP + tx + TX * c] = score_grad(pv, dp[r][c], delta[row0 + r]);
      }
    }
  }
};

template <typename T, int D>
__global__ void __launch_bounds__(kBwdThreads) attention_dkdv_kernel(KernelArgs a) {
  using Tiles = BwdTiles<T, D>;
  constexpr int B = Tiles::B, TX = Tiles::TX, RM = Tiles::RM, DN = Tiles::DN, LD = Tiles::LD,
                LDP = Tiles::LDP;
  __shared__ Tiles t;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * B;
  const SeqGeom g = seq_geom(a, b);
  if (k0 >= g.lk) return;
  const int off = diag_offset(a, g);
  const int tx = threadIdx.x % TX, row0 = (threadIdx.x / TX) * RM;
  t.load_keys(a, g, hk, k0);
  float dk[RM][DN], dv[RM][DN];
  zero(dk);
  zero(dv);
  int lo, hi;
  query_range(a, off, k0, min(k0 + B, g.lk), g.lq, &lo, &hi);
  const int group = a.hq / a.hkv;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    for (int q0 = tile_start<B>(lo); q0 < hi; q0 += B) {
      __syncthreads();  // the previous step's tiles are no longer read
      t.load_queries(a, g, b, h, q0);
      __syncthreads();
      t.probabilities(a, g, off, q0, k0, true);
      __syncthreads();
      // rows of dk/dv are keys: a(r, i) reads column (key) row0 + r of the [query x key] tile
      tile_fma<RM, DN, B>(
          dv, [&](int r, int i) { return t.p[i * LDP + row0 + r]; },
          [&](int i, int c) { return smem_val<T>(t.d_o, i * LD + tx + TX * c); });
      tile_fma<RM, DN, B>(
          dk, [&](int r, int i) { return t.ds[i * LDP + row0 + r]; },
          [&](int i, int c) { return smem_val<T>(t.q, i * LD + tx + TX * c); });
    }
  }
  T* dkg = static_cast<T*>(a.dk) + g.kv_base + int64_t(hk) * D;
  T* dvg = static_cast<T*>(a.dv) + g.kv_base + int64_t(hk) * D;
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const int j = k0 + row0 + r;
    if (j >= g.lk) continue;
#pragma unroll
    for (int c = 0; c < DN; ++c) {
      dkg[int64_t(j) * a.kv_tok_stride + tx + TX * c] = from_float<T>(dk[r][c] * a.scale);
      dvg[int64_t(j) * a.kv_tok_stride + tx + TX * c] = from_float<T>(dv[r][c]);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kBwdThreads) attention_dq_kernel(KernelArgs a) {
  using Tiles = BwdTiles<T, D>;
  constexpr int B = Tiles::B, TX = Tiles::TX, RM = Tiles::RM, DN = Tiles::DN, LD = Tiles::LD,
                LDP = Tiles::LDP;
  __shared__ Tiles t;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * B;
  const SeqGeom g = seq_geom(a, b);
  if (q0 >= g.lq) return;
  const int hk = kv_head(a, h);
  const int off = diag_offset(a, g);
  const int tx = threadIdx.x % TX, row0 = (threadIdx.x / TX) * RM;
  t.load_queries(a, g, b, h, q0);
  float dq[RM][DN];
  zero(dq);
  int lo, hi;
  key_range(a, off, q0, min(q0 + B, g.lq), g.lk, &lo, &hi);
  for (int k0 = tile_start<B>(lo); k0 < hi; k0 += B) {
    __syncthreads();
    t.load_keys(a, g, hk, k0);
    __syncthreads();
    t.probabilities(a, g, off, q0, k0, false);
    __syncthreads();
    tile_fma<RM, DN, B>(
        dq, [&](int r, int j) { return t.ds[(row0 + r) * LDP + j]; },
        [&](int j, int c) { return smem_val<T>(t.k, j * LD + tx + TX * c); });
  }
  T* dqg = static_cast<T*>(a.dq) + g.q_base + int64_t(h) * D;
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    const int i = q0 + row0 + r;
    if (i >= g.lq) continue;
#pragma unroll
    for (int c = 0; c < DN; ++c)
      dqg[int64_t(i) * a.q_tok_stride + tx + TX * c] = from_float<T>(dq[r][c] * a.scale);
  }
}

template <typename T, int D>
void launch_bwd(const AttnArgs& args) {
  KernelArgs k = make_kernel_args(args);
  k.delta = static_cast<float*>(args.workspace);
  // A call that allows non-deterministic results takes the single-pass tensor-core kernel, its
  // fp32 dQ sums after the delta rows (portable_workspace_size)
  if (!args.p.deterministic && matrix_units_allowed() && tensor_cores_usable())
    k.dq_acc = reinterpret_cast<float*>(static_cast<unsigned char*>(args.workspace) +
                                        delta_workspace_bytes(args.p));
  const cudaStream_t stream = to_stream(args.stream);
  const unsigned hq = static_cast<unsigned>(args.p.num_heads_q);
  const unsigned hkv = static_cast<unsigned>(args.p.num_heads_kv);
  const unsigned batch = static_cast<unsigned>(args.p.batch);
  const unsigned q_tiles = static_cast<unsigned>((args.p.max_seqlen_q + kBwdTile - 1) / kBwdTile);
  const unsigned k_tiles =
      static_cast<unsigned>((args.p.max_seqlen_kv + kBwdTile - 1) / kBwdTile);
  if (q_tiles > 0) {
    const unsigned row_blocks = static_cast<unsigned>((args.p.max_seqlen_q + 3) / 4);
    attention_delta_kernel<T, D><<<dim3(row_blocks, hq, batch), 128, 0, stream>>>(k);
    check_launch("attention_delta_kernel");
  }
  // the same choice as portable_forward()
  if (k.dq_acc != nullptr && (backward_atomic_wgmma(args, k) || backward_atomic_tc(args, k)))
    return;
  if (matrix_units_allowed() && backward_tc(args, k)) return;
  attention_dkdv_kernel<T, D><<<dim3(k_tiles, hkv, batch), kBwdThreads, 0, stream>>>(k);
  check_launch("attention_dkdv_kernel");
  if (q_tiles > 0) {
    attention_dq_kernel<T, D><<<dim3(q_tiles, hq, batch), kBwdThreads, 0, stream>>>(k);
    check_launch("attention_dq_kernel");
  }
}

template <typename T>
void backward_for_type(const AttnArgs& args) {
  if (args.p.head_dim_qk == 64) launch_bwd<T, 64>(args);
  else launch_bwd<T, 128>(args);
}

}  // namespace
}  // namespace portable

void portable_backward(const AttnArgs& args) {
  if (args.p.dtype == kNVTEFloat16) portable::backward_for_type<fp16>(args);
  else portable::backward_for_type<bf16>(args);
}

}  // namespace attention
}  // namespace te
