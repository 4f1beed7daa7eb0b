// Fused rotary position embedding, forward and backward, for sbhd / bshd / thd layouts.
//
// A block of 256 threads handles tokens_per_block tokens (rows of h * d contiguous elements);
// threads_x threads share one token. Per token the block first turns that position's R angles
// into cos / sin tables in shared memory (accurate sincosf: angles reach thousands of radians,
// where the fast intrinsics lose all precision), so each angle is evaluated once per token
// instead of once per head. A thread's first two work items are loaded before the tables are
// built, so the DRAM reads overlap the sincos work and the barrier.
//
// Work items are groups of V elements (16 bytes) of one head: for non-interleaved rotation a
// group k0..k0+V-1 in the first half together with its partner group at k0 + R/2, for
// interleaved a group of V/2 whole pairs, and plain copy groups of P elements for the
// pass-through tail k >= R. Shapes or pointers that do not allow whole 16-byte groups use the
// same code with groups of one element (one pair when interleaved) and P = 1, loaded element by
// element.
//
// Forward and backward differ only in which sine multiplies the partner value and its sign
// (the backward map is the transpose of the forward one, see rope.h), a template flag.
#include "transformer_engine/rope.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxRotaryDim = 4096;  // cos + sin tables of one token: 32 KiB of shared memory

struct RopeShape {
  int64_t tokens;    // s*b or t
  int64_t seq;       // s (sbhd, bshd)
  int64_t batch;     // b (sbhd)
  int64_t freq_rows; // s_max
  int32_t num_seqs;  // thd: entries of cu_seqlens minus one
  int32_t format;
  int32_t heads, dim, rot_dim;
  int32_t threads_x, tokens_per_block;
};

__device__ __forceinline__ int64_t position_of(int64_t t, const RopeShape& sh,
                                               const int32_t* __restrict__ cu_seqlens) {
  // 32-bit division when the counts fit (64-bit division is a long software sequence).
  const bool narrow = sh.tokens < (int64_t(1) << 31);
  if (sh.format == kNVTERopeSBHD)
    return narrow ? int64_t(uint32_t(t) / uint32_t(sh.batch)) : t / sh.batch;
  if (sh.format == kNVTERopeBSHD)
    return narrow ? int64_t(uint32_t(t) % uint32_t(sh.seq)) : t % sh.seq;
  // thd: the last sequence whose start is <= t (binary search over the n + 1 offsets).
  int lo = 0, hi = sh.num_seqs;  // invariant: cu_seqlens[lo] <= t < cu_seqlens[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= t) lo = mid; else hi = mid;
  }
  return t - cu_seqlens[lo];
}

template <typename T, int V, bool kVecLoad>
__device__ __forceinline__ void load_group(const T* p, float (&v)[V]) {
  if constexpr (kVecLoad) {
    Vec<T, V> x;
    x.load(p);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = to_float(x.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = to_float(p[k]);
  }
}

template <typename T, int V, bool kVecLoad>
__device__ __forceinline__ void store_group(T* p, const float (&v)[V]) {
  if constexpr (kVecLoad) {
    Vec<T, V> x;
#pragma unroll
    for (int k = 0; k < V; ++k) x.v[k] = from_float<T>(v[k]);
    x.store(p);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = from_float<T>(v[k]);
  }
}

// Where a work item's groups live inside the token row, and what to do with them.
struct Item {
  int off1, off2;  // element offsets in the row; off2 only for non-interleaved rotation
  int k1, k2;      // rotary indices of the first element of each group (table indices)
  bool rotate;
};

template <int V, int P, bool kInterleaved>
__device__ __forceinline__ Item decode(int it, const RopeShape& sh) {
  const int half = sh.rot_dim / 2;
  const int rot_items = kInterleaved ? sh.rot_dim / V : half / V;
  const int pass_items = (sh.dim - sh.rot_dim) / P;
  const int per_head = rot_items + pass_items;
  const int head = it / per_head, w = it - head * per_head;
  Item item;
  item.rotate = w < rot_items;
  item.k1 = item.rotate ? w * V : 0;
  item.k2 = item.k1 + half;
  item.off1 = head * sh.dim + (item.rotate ? item.k1 : sh.rot_dim + (w - rot_items) * P);
  item.off2 = head * sh.dim + item.k2;
  return item;
}

// Rotated items load V elements (and the partner group when non-interleaved), pass-through
// items P.
template <typename T, int V, int P, bool kInterleaved, bool kVecLoad, int kGroups>
__device__ __forceinline__ void load_item(const T* row, const Item& item, float (&x)[kGroups][V]) {
  if (!item.rotate) {
    load_group<T, P, kVecLoad>(row + item.off1, reinterpret_cast<float(&)[P]>(x[0]));
    return;
  }
  load_group<T, V, kVecLoad>(row + item.off1, x[0]);
  if (!kInterleaved) load_group<T, V, kVecLoad>(row + item.off2, x[kGroups - 1]);
}

template <typename T, int V, bool kInterleaved, bool kBackward, bool kVecLoad>
__global__ void __launch_bounds__(kThreads)
rope_kernel(const T* __restrict__ in, T* __restrict__ out, const float* __restrict__ freqs,
            const int32_t* __restrict__ cu_seqlens, RopeShape sh) {
  constexpr int P = kVecLoad ? V : 1;  // pass-through group
  extern __shared__ float tables[];  // per token row: cos[R], then sin[R]
  const int tx = threadIdx.x % sh.threads_x, ty = threadIdx.x / sh.threads_x;
  const int64_t t = int64_t(blockIdx.x) * sh.tokens_per_block + ty;
  const bool live = ty < sh.tokens_per_block && t < sh.tokens;
  const int64_t row = t * sh.heads * sh.dim;
  const int half = sh.rot_dim / 2;
  const int rot_items = kInterleaved ? sh.rot_dim / V : half / V;
  const int items = sh.heads * (rot_items + (sh.dim - sh.rot_dim) / P);
  // Non-interleaved items hold two groups (x1 at off1, x2 at off2); interleaved ones one.
  constexpr int kGroups = kInterleaved ? 1 : 2;

  // 1. First two items of this thread: issue the loads now.
  float pre[2][kGroups][V];
  Item pre_item[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int it = tx + q * sh.threads_x;
    if (live && it < items) {
      pre_item[q] = decode<V, P, kInterleaved>(it, sh);
      load_item<T, V, P, kInterleaved, kVecLoad>(in + row, pre_item[q], pre[q]);
    }
  }

  // 2. cos / sin of this token's angles. Positions past the freqs rows give NaN on purpose.
  float* cos_t = tables + ty * 2 * sh.rot_dim;
  float* sin_t = cos_t + sh.rot_dim;
  if (live) {
    const int64_t pos = position_of(t, sh, cu_seqlens);
    const bool ok = pos >= 0 && pos < sh.freq_rows;
    for (int k = tx; k < sh.rot_dim; k += sh.threads_x) {
      float s = __int_as_float(0x7fc00000), c = s;
      if (ok) sincosf(freqs[pos * sh.rot_dim + k], &s, &c);
      cos_t[k] = c;
      sin_t[k] = s;
    }
  }
  __syncthreads();
  if (!live) return;

  // 3. Rotate and store.
  auto finish = [&](const Item& item, float (&x)[kGroups][V]) {
    if (!item.rotate) {
      store_group<T, P, kVecLoad>(out + row + item.off1, reinterpret_cast<float(&)[P]>(x[0]));
      return;
    }
    float y[kGroups][V];
    if constexpr (kInterleaved) {
#pragma unroll
      for (int k = 0; k < V; k += 2) {
        const int ke = item.k1 + k, ko = ke + 1;
        const float e = x[0][k], o = x[0][k + 1];
        // forward: (e c_e - o s_e, o c_o + e s_o); backward: (e c_e + o s_o, o c_o - e s_e)
        y[0][k] = e * cos_t[ke] + o * (kBackward ? sin_t[ko] : -sin_t[ke]);
        y[0][k + 1] = o * cos_t[ko] + e * (kBackward ? -sin_t[ke] : sin_t[ko]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int k1 = item.k1 + k, k2 = item.k2 + k;
        const float a = x[0][k], b = x[kGroups - 1][k];
        y[0][k] = a * cos_t[k1] + b * (kBackward ? sin_t[k2] : -sin_t[k1]);
        y[kGroups - 1][k] = b * cos_t[k2] + a * (kBackward ? -sin_t[k1] : sin_t[k2]);
      }
    }
    store_group<T, V, kVecLoad>(out + row + item.off1, y[0]);
    if (!kInterleaved) store_group<T, V, kVecLoad>(out + row + item.off2, y[kGroups - 1]);
  };
#pragma unroll
  for (int q = 0; q < 2; ++q)
    if (tx + q * sh.threads_x < items) finish(pre_item[q], pre[q]);
  for (int it = tx + 2 * sh.threads_x; it < items; it += sh.threads_x) {
    const Item item = decode<V, P, kInterleaved>(it, sh);
    float x[kGroups][V];
    load_item<T, V, P, kInterleaved, kVecLoad>(in + row, item, x);
    finish(item, x);
  }
}

template <typename T, bool kInterleaved, bool kBackward>
void launch_rope(const T* in, T* out, const float* freqs, const int32_t* cu_seqlens,
                 RopeShape sh, cudaStream_t stream) {
  constexpr int kVecElems = 16 / sizeof(T);
  // Whole 16-byte groups need heads, the rotary halves (or pairs) and the pass-through tail to
  // start on 16-byte boundaries.
  const int rot_unit = kInterleaved ? kVecElems : 2 * kVecElems;
  const bool vec = sh.dim % kVecElems == 0 && sh.rot_dim % rot_unit == 0 && aligned16(in) &&
                   aligned16(out);
  const int group = vec ? kVecElems : (kInterleaved ? 2 : 1);
  const int pass_group = vec ? kVecElems : 1;
  const int rot_items = kInterleaved ? sh.rot_dim / group : sh.rot_dim / 2 / group;
  const int64_t items = int64_t(sh.heads) * (rot_items + (sh.dim - sh.rot_dim) / pass_group);
  TE_CHECK_ARG(items < (int64_t(1) << 31), "rows of ", sh.heads, " x ", sh.dim, " are too large");
  // Threads per token: enough for two items each (both are loaded before the barrier), so
  // small rows share a block and the per-token table and barrier are paid for twice the data;
  // more when the tables of the block's tokens would not fit in 48 KiB of shared memory.
  int tx = 32;
  while (tx < kThreads && 2 * tx < items) tx *= 2;
  while (tx < kThreads && size_t(kThreads / tx) * 2 * sh.rot_dim * sizeof(float) > 48 * 1024) tx *= 2;
  sh.threads_x = tx;
  sh.tokens_per_block = kThreads / tx;
  const int64_t blocks = (sh.tokens + sh.tokens_per_block - 1) / sh.tokens_per_block;
  TE_CHECK_ARG(blocks < (int64_t(1) << 31), "too many tokens: ", sh.tokens);
  const size_t smem = size_t(sh.tokens_per_block) * 2 * sh.rot_dim * sizeof(float);
  if (vec)
    rope_kernel<T, kVecElems, kInterleaved, kBackward, true>
        <<<unsigned(blocks), kThreads, smem, stream>>>(in, out, freqs, cu_seqlens, sh);
  else
    rope_kernel<T, kInterleaved ? 2 : 1, kInterleaved, kBackward, false>
        <<<unsigned(blocks), kThreads, smem, stream>>>(in, out, freqs, cu_seqlens, sh);
  check_launch("rope_kernel");
}

}  // namespace
}  // namespace te

using namespace te;

namespace {

// Checks the tensors and fills the shape; returns false when there is nothing to do.
bool rope_shape(const char* in_name, const NVTETensor* input, const NVTETensor* freqs,
                const NVTETensor* cu_seqlens, const char* out_name, const NVTETensor* output,
                NVTERopeFormat format, RopeShape* sh) {
  check_tensor(input, in_name);
  check_tensor(freqs, "freqs");
  check_tensor(output, out_name);
  check_dtype_in(*input, in_name, is_high_precision(input->dtype), "float32, float16 or bfloat16");
  TE_CHECK_ARG(output->dtype == input->dtype, out_name, " has dtype ",
               nvte_dtype_name(output->dtype), "; expected ", nvte_dtype_name(input->dtype),
               " like ", in_name);
  TE_CHECK_ARG(numel(*output) == numel(*input), out_name, " has shape ", shape_str(*output),
               "; expected ", in_name, "'s shape ", shape_str(*input));
  check_dtype_in(*freqs, "freqs", freqs->dtype == kNVTEFloat32, "float32");
  TE_CHECK_ARG(format == kNVTERopeSBHD || format == kNVTERopeBSHD || format == kNVTERopeTHD,
               "format code ", int(format), " is invalid; expected 0 (sbhd), 1 (bshd) or 2 (thd)");
  const int want_dims = format == kNVTERopeTHD ? 3 : 4;
  const char* layout = format == kNVTERopeSBHD ? "[s, b, h, d]"
                       : format == kNVTERopeBSHD ? "[b, s, h, d]" : "[t, h, d]";
  TE_CHECK_ARG(input->ndim == want_dims, in_name, " has shape ", shape_str(*input),
               "; expected ", layout);
  const int64_t heads = input->shape[want_dims - 2], dim = input->shape[want_dims - 1];
  TE_CHECK_ARG(freqs->ndim >= 1, "freqs has shape ", shape_str(*freqs), "; expected [s, 1, 1, d_rot]");
  const int64_t rot = freqs->shape[freqs->ndim - 1];
  TE_CHECK_ARG(rot > 0 && rot % 2 == 0 && rot <= dim, "freqs has rotary dim ", rot,
               " (its last dim); expected an even number in 2..", dim, " (the head dim)");
  if (rot > kMaxRotaryDim)
    TE_UNSUPPORTED("rotary dim ", rot, " is larger than the supported ", kMaxRotaryDim);
  TE_CHECK_ARG(heads * dim < (int64_t(1) << 31), in_name, " rows of ", heads, " x ", dim,
               " elements are too large");
  sh->heads = int32_t(heads);
  sh->dim = int32_t(dim);
  sh->rot_dim = int32_t(rot);
  sh->freq_rows = numel(*freqs) / rot;
  sh->format = format;
  sh->num_seqs = 0;
  if (format == kNVTERopeTHD) {
    TE_CHECK_ARG(cu_seqlens != nullptr, "cu_seqlens is required for the thd format");
    check_tensor(cu_seqlens, "cu_seqlens");
    check_dtype_in(*cu_seqlens, "cu_seqlens", cu_seqlens->dtype == kNVTEInt32, "int32");
    TE_CHECK_ARG(cu_seqlens->ndim == 1 && cu_seqlens->shape[0] >= 2, "cu_seqlens has shape ",
                 shape_str(*cu_seqlens), "; expected [num_sequences + 1] with at least 2 entries");
    sh->num_seqs = int32_t(cu_seqlens->shape[0] - 1);
    sh->tokens = input->shape[0];
    sh->seq = sh->batch = 0;
  } else {
    const int64_t s = input->shape[format == kNVTERopeSBHD ? 0 : 1];
    const int64_t b = input->shape[format == kNVTERopeSBHD ? 1 : 0];
    TE_CHECK_ARG(s <= sh->freq_rows, "freqs has ", sh->freq_rows, " positions; expected at least ",
                 s, " (the sequence length of ", in_name, " ", shape_str(*input), ")");
    sh->seq = s;
    sh->batch = b;
    sh->tokens = s * b;
  }
  return sh->tokens > 0 && heads * dim > 0;
}

template <bool kBackward>
void rope_run(const NVTETensor* in, const NVTETensor* freqs, const NVTETensor* cu_seqlens,
              NVTETensor* out, NVTERopeFormat format, bool interleaved, NVTEStream stream) {
  RopeShape sh{};
  if (!rope_shape(kBackward ? "grad_output" : "input", in, freqs, cu_seqlens,
                  kBackward ? "grad_input" : "output", out, format, &sh))
    return;
  const int32_t* cu = format == kNVTERopeTHD ? static_cast<const int32_t*>(cu_seqlens->data) : nullptr;
  const float* f = static_cast<const float*>(freqs->data);
  TE_SWITCH_HP(in->dtype, T, kBackward ? "grad_output" : "input",
    if (interleaved)
      launch_rope<T, true, kBackward>(static_cast<const T*>(in->data), static_cast<T*>(out->data),
                                      f, cu, sh, to_stream(stream));
    else
      launch_rope<T, false, kBackward>(static_cast<const T*>(in->data), static_cast<T*>(out->data),
                                       f, cu, sh, to_stream(stream)));
}

}  // namespace

extern "C" NVTEStatus nvte_fused_rope_forward(const NVTETensor* input, const NVTETensor* freqs,
                                              const NVTETensor* cu_seqlens, NVTETensor* output,
                                              NVTERopeFormat format, int interleaved,
                                              NVTEStream stream) {
  return guard("nvte_fused_rope_forward", [&] {
    rope_run<false>(input, freqs, cu_seqlens, output, format, interleaved != 0, stream);
  });
}

extern "C" NVTEStatus nvte_fused_rope_backward(const NVTETensor* grad_output,
                                               const NVTETensor* freqs,
                                               const NVTETensor* cu_seqlens,
                                               NVTETensor* grad_input, NVTERopeFormat format,
                                               int interleaved, NVTEStream stream) {
  return guard("nvte_fused_rope_backward", [&] {
    rope_run<true>(grad_output, freqs, cu_seqlens, grad_input, format, interleaved != 0, stream);
  });
}
