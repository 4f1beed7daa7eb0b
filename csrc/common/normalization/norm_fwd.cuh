// LayerNorm / RMSNorm forward kernels and their launcher, instantiated per input dtype by
// fwd_<dtype>.cu.
//
// Register path (cols a multiple of the 16-byte chunk, aligned pointers, row short enough): each
// row is read from DRAM once into registers, its mean and variance are computed from the
// registers in two passes (exact, no E[x^2] - E[x]^2 cancellation), and the output is written
// once, optionally quantised to FP8 on the way out. The row stays in registers as loaded (16-bit
// values two per register) and is unpacked at each use; gamma and beta, when a chunk of them is
// one 16-byte word (the weights in x's dtype), are loaded with x, before the reductions, so the
// output pass does not wait on them after the last barrier. On an H100 (bf16, scratch harness,
// interleaved with torch.compile, two timings each; bit-identical outputs) that took LayerNorm
// 0.994 -> 0.998-1.000x compile at 32768x8192 and 1.111 -> 1.125x at 16384x4096, RMSNorm
// 0.993 -> 0.996x and 1.004 -> 1.010x. Unpacked x with early weights spilled (LayerNorm 0.876x);
// packed x alone, x loads bypassing L1, evict-first x loads, streaming or evict-first stores,
// two rows per block and register caps for 6 or 8 resident blocks were no faster. bench_kernels on
// an H100 (full repetitions): LayerNorm 0.999x / 1.125x, RMSNorm 0.997x / 1.023x compile at
// 32768x8192 / 16384x4096; at 32768x8192 both are at 100.3-100.6% of copy like compile.
// RMSNorm on rows of 4104 to 8192 16-bit columns (and on rows too long for registers) takes the
// looped path instead (norm_fwd_rms_looped_kernel: the row read twice, the second time from
// L2): 1.009x compile at 32768x8192, 101.0% of copy. The general path handles every other
// shape with scalar accesses, re-reading the row (from cache) in each pass.
#pragma once

#include "normalization/norm_kernels.cuh"

namespace te {
namespace norm {

template <typename T, typename W, typename O>
struct FwdArgs {
  const T* x;
  const W* gamma;
  const W* beta;
  O* z;
  float* mu;
  float* rsigma;
  int64_t rows;
  int cols;
  int tpr;
  float epsilon;
  float gamma_shift;  // 1 with zero_centered_gamma, else 0
  const float* scale;
  float* amax;
  float* scale_inv;
};

template <typename O>
constexpr bool is_fp8_type() {
  return sizeof(O) == 1;
}

// FP8 epilogue shared by both paths: scale_inv from block 0, block amax folded into *amax.
template <typename O>
__device__ __forceinline__ void finish_fp8(float amax, const float* scale, float* amax_ptr,
                                           float* scale_inv, float* scratch) {
  if (scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.f / *scale;
  if (amax_ptr != nullptr) {
    amax = block_reduce_max(amax, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax_ptr, amax);
  }
}

template <typename T, typename W, typename O, bool kRms, int kIters>
__global__ void __launch_bounds__(1024) norm_fwd_register_kernel(FwdArgs<T, W, O> a) {
  wait_for_previous_grid();
  release_next_grid();
  constexpr int kN = 16 / sizeof(T);
  constexpr bool kFp8 = is_fp8_type<O>();
  constexpr bool kEarlyWeights = sizeof(W) == sizeof(T);  // a chunk of weights is one word
  __shared__ float red[2][kMaxWarps];
  __shared__ float scratch[kMaxWarps + 1];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  const T* x = a.x + row * cols;

  // All loads first so that kIters 16-byte requests per thread are in flight together; chunks
  // past the row (or of a row past the end) are zeros.
  uint4 xw[kIters], gw[kEarlyWeights ? kIters : 1], bw[kEarlyWeights && !kRms ? kIters : 1];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    const bool in = valid && c < cols;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    xw[it] = in ? *reinterpret_cast<const uint4*>(x + c) : zero;
    if constexpr (kEarlyWeights) {
      gw[it] = in ? *reinterpret_cast<const uint4*>(a.gamma + c) : zero;
      if constexpr (!kRms) bw[it] = in ? *reinterpret_cast<const uint4*>(a.beta + c) : zero;
    }
  }
  // Unpacks chunk `it` of x; forget() makes the compiler unpack again at the next use rather
  // than keep unpacked copies live across a reduction.
  auto value = [&](int it, float (&f)[kN]) { rows::unpack_words<T>(xw[it], f); };
  auto forget = [&] {
#pragma unroll
    for (int it = 0; it < kIters; ++it) rows::forget_words(xw[it]);
  };

  float mean = 0.f;
  if (!kRms) {
    float s[1] = {0.f};
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      float f[kN];
      value(it, f);
#pragma unroll
      for (int k = 0; k < kN; ++k) s[0] += f[k];
    }
    forget();
    row_sum<1>(s, tpr, red[0]);
    mean = s[0] / cols;
  }
  float q[1] = {0.f};
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    if ((it * tpr + t) * kN < cols) {
      float f[kN];
      value(it, f);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float d = f[k] - mean;
        q[0] += d * d;
      }
    }
  }
  forget();
  row_sum<1>(q, tpr, red[1]);
  const float rs = 1.f / sqrtf(q[0] / cols + a.epsilon);
  if (valid && t == 0) {
    if (!kRms && a.mu != nullptr) a.mu[row] = mean;
    if (a.rsigma != nullptr) a.rsigma[row] = rs;
  }

  const float scale = kFp8 ? *a.scale : 1.f;
  float amax = 0.f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (valid && c < cols) {
      float g[kN], b[kN], v[kN];
      if constexpr (kEarlyWeights) {
        rows::unpack_words<W>(gw[it], g);
        if (!kRms) rows::unpack_words<W>(bw[it], b);
      } else {
        load_floats<W, kN>(a.gamma + c, g);
        if (!kRms) load_floats<W, kN>(a.beta + c, b);
      }
      value(it, v);
      float y[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        float out = (v[k] - mean) * rs * (g[k] + a.gamma_shift);
        if (!kRms) out += b[k];
        if (kFp8) {
          amax = amax_step(amax, out);
          out *= scale;
        }
        y[k] = out;
      }
      store_floats<O, kN>(a.z + row * cols + c, y);
    }
  }
  if (kFp8) finish_fp8<O>(amax, a.scale, a.amax, a.scale_inv, scratch);
}

// RMSNorm on long rows of 16-bit values: one block of kBlock threads per row and the row read
// twice, once for the sum of squares (under an L2 evict-last policy, so that its lines stay) and
// once from L2 for the output (evict-first: the last use), kBatch 16-byte chunks per thread in
// flight at a time. Nothing lives across the barrier, so 3 blocks of 512 threads share an SM.
// This is the schedule of torch.compile's Triton kernel for the same op (a loop over the row,
// a second loop re-reading it). On an H100 at 32768x8192 bf16 (scratch harness interleaved with
// torch.compile, two timings each) 512 x 2 with 2 or 3 rows per SM took RMSNorm from 0.996x to
// 1.010x compile (bench_kernels: 1.009x, 101.0% of copy); 4 rows per SM (32 registers) 0.997x,
// 256 x 4 0.993x, 512 x 1 0.994x, 8-byte chunks 0.89-1.007x. LayerNorm does not gain: its
// second reduction (or a one-barrier merge of per-warp moments) lengthens the row's time after
// its data arrives, and the looped variants ran at 0.66-1.002x against 1.000x for the register
// kernel (512 x 2 at 3 rows per SM: 0.95x), so LayerNorm keeps the register kernel.
template <typename T, typename W, typename O, int kBlock, int kBatch, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    norm_fwd_rms_looped_kernel(FwdArgs<T, W, O> a) {
  wait_for_previous_grid();
  release_next_grid();
  static_assert(sizeof(T) == 2 && !is_fp8_type<O>(), "16-bit input, 16-bit output");
  static_assert(kBlock % TE_WARP_SIZE == 0 && kBlock / TE_WARP_SIZE <= kMaxWarps, "block");
  constexpr int kN = 16 / sizeof(T);
  constexpr int kStep = kBlock * kBatch;  // chunks per batch
  constexpr int kWarps = kBlock / TE_WARP_SIZE;
  __shared__ float part[kMaxWarps];  // per warp: sum of squares
  const int t = threadIdx.x;
  const int lane = t % TE_WARP_SIZE, warp = t / TE_WARP_SIZE;
  const int64_t row = blockIdx.x;
  const int cols = a.cols;
  const int chunks = cols / kN;
  const T* x = a.x + row * cols;

  const uint64_t keep = l2_evict_last_policy();
  float sum = 0.f;
#pragma unroll 1
  for (int base = 0; base < chunks; base += kStep) {
    uint4 w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = base + j * kBlock + t;
      w[j] = c < chunks ? load16_l2_policy(x + int64_t(c) * kN, keep) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (base + j * kBlock + t >= chunks) continue;
      float v[kN];
      rows::unpack_words<T>(w[j], v);
#pragma unroll
      for (int k = 0; k < kN; ++k) sum += v[k] * v[k];
    }
  }
  for (int offset = TE_WARP_SIZE / 2; offset > 0; offset /= 2) sum += warp_shfl_xor(sum, offset);
  if (lane == 0) part[warp] = sum;
  __syncthreads();
  float q = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) q += part[w];
  const float rs = 1.f / sqrtf(q / cols + a.epsilon);
  if (t == 0 && a.rsigma != nullptr) a.rsigma[row] = rs;

  const uint64_t drop = l2_evict_first_policy();
  O* z = a.z + row * cols;
#pragma unroll 1
  for (int base = 0; base < chunks; base += kStep) {
    uint4 w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = base + j * kBlock + t;
      if (c < chunks) w[j] = load16_l2_policy(x + int64_t(c) * kN, drop);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = base + j * kBlock + t;
      if (c >= chunks) continue;
      float g[kN], v[kN], y[kN];
      load_floats<W, kN>(a.gamma + int64_t(c) * kN, g);
      rows::unpack_words<T>(w[j], v);
#pragma unroll
      for (int k = 0; k < kN; ++k) y[k] = v[k] * rs * (g[k] + a.gamma_shift);
      store_floats<O, kN>(z + int64_t(c) * kN, y);
    }
  }
}

// The looped RMSNorm launch: 512 threads x 2 chunks per row; 3 rows per SM (40 registers) with
// 16-bit weights, 2 with fp32 weights (which would spill at 40).
constexpr int kRmsLoopBlock = 512;
constexpr int kRmsLoopBatch = 2;
template <typename T, typename W>
constexpr int rms_loop_min_blocks() {
  return sizeof(W) == sizeof(T) ? 3 : 2;
}

// Any cols, any alignment: three strided passes over the row (sum, squared deviations, output).
template <typename T, typename W, typename O, bool kRms>
__global__ void __launch_bounds__(1024) norm_fwd_general_kernel(FwdArgs<T, W, O> a) {
  constexpr bool kFp8 = is_fp8_type<O>();
  __shared__ float red[2][kMaxWarps];
  __shared__ float scratch[kMaxWarps + 1];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = valid ? a.cols : 0;  // rows past the end run the barriers with no data
  const T* x = a.x + row * a.cols;

  float mean = 0.f;
  if (!kRms) {
    float s[1] = {0.f};
    for (int c = t; c < cols; c += tpr) s[0] += to_float(x[c]);
    row_sum<1>(s, tpr, red[0]);
    mean = s[0] / a.cols;
  }
  float q[1] = {0.f};
  for (int c = t; c < cols; c += tpr) {
    const float d = to_float(x[c]) - mean;
    q[0] += d * d;
  }
  row_sum<1>(q, tpr, red[1]);
  const float rs = 1.f / sqrtf(q[0] / a.cols + a.epsilon);
  if (valid && t == 0) {
    if (!kRms && a.mu != nullptr) a.mu[row] = mean;
    if (a.rsigma != nullptr) a.rsigma[row] = rs;
  }
  const float scale = kFp8 ? *a.scale : 1.f;
  float amax = 0.f;
  for (int c = t; c < cols; c += tpr) {
    float out = (to_float(x[c]) - mean) * rs * (to_float(a.gamma[c]) + a.gamma_shift);
    if (!kRms) out += to_float(a.beta[c]);
    if (kFp8) {
      amax = amax_step(amax, out);
      out *= scale;
    }
    a.z[row * a.cols + c] = from_float<O>(out);
  }
  if (kFp8) finish_fp8<O>(amax, a.scale, a.amax, a.scale_inv, scratch);
}

template <typename T, typename W, typename O, bool kRms>
void launch_fwd(const NormFwdParams& p, cudaStream_t stream) {
  constexpr int kN = 16 / sizeof(T);
  FwdArgs<T, W, O> a{static_cast<const T*>(p.x), static_cast<const W*>(p.gamma),
                     static_cast<const W*>(p.beta), static_cast<O*>(p.z), p.mu, p.rsigma,
                     p.rows, static_cast<int>(p.cols), 0, p.epsilon,
                     p.zero_centered_gamma ? 1.f : 0.f, p.scale, p.amax, p.scale_inv};
  constexpr bool kFp8 = is_fp8_type<O>();
  // Nothing to do for no rows, except that an FP8 output still gets its scale_inv written.
  if (p.rows == 0 && !kFp8) return;
  const bool vectorizable = p.cols % kN == 0 && aligned16(p.x) && aligned16(p.gamma) &&
                            (kRms || aligned16(p.beta)) && aligned16(p.z);
  // RMSNorm (one reduction per row) on rows of 512+ chunks: 256 threads x 2 chunks when they hold
  // the row, else the fewest threads of up to kMaxIters chunks. On an H100 at 16384x4096 bf16,
  // RMSNorm took 92.3 us that way against 93.5 us for 128 x 4 (LayerNorm, with its two
  // reductions, the reverse: 108.8 us against 94.2 us); at 8192 columns 256 x 4 beat 512 x 2.
  const int64_t chunks = p.cols / kN;
  // RMSNorm rows of 16-bit values that the looped kernel reads in one batch (513 to 1024
  // chunks: measured at 8192 bf16 columns), and rows too long for the register path, which
  // would otherwise take the scalar general path. Rows of 1025 to 4096 chunks keep the
  // register kernel (the looped one was not measured there).
  if constexpr (kRms && sizeof(T) == 2 && !kFp8) {
    const bool one_batch = chunks > kRmsLoopBlock && chunks <= kRmsLoopBlock * kRmsLoopBatch;
    const bool too_long = chunks > int64_t(kMaxIters) * kMaxTpr;
    if (vectorizable && (one_batch || too_long) && p.rows > 0 && p.rows <= INT32_MAX) {
      a.tpr = kRmsLoopBlock;
      launch_overlapping(norm_fwd_rms_looped_kernel<T, W, O, kRmsLoopBlock, kRmsLoopBatch,
                                                    rms_loop_min_blocks<T, W>()>,
                         dim3(unsigned(p.rows)), dim3(kRmsLoopBlock), stream, a);
      check_launch("norm_fwd_rms_looped_kernel");
      return;
    }
  }
  RowLayout layout;
  const bool rms_wide = kRms && chunks >= 512 && pick_register_layout(chunks, 2, 256, &layout);
  if (vectorizable && (rms_wide || pick_register_layout(chunks, kMaxIters, kMaxTpr, &layout))) {
    a.tpr = layout.tpr;
    const int block = layout.tpr > 128 ? layout.tpr : 128;
    const int grid = p.rows == 0 ? 1 : blocks_for(p.rows, block / layout.tpr);
    // Overlapping launches (util/arch.h): the kernel waits for the previous grid first.
    auto launch = [&](auto kernel) {
      launch_overlapping(kernel, dim3(grid), dim3(block), stream, a);
    };
    switch (layout.iters) {
      case 1: launch(norm_fwd_register_kernel<T, W, O, kRms, 1>); break;
      case 2: launch(norm_fwd_register_kernel<T, W, O, kRms, 2>); break;
      case 3: launch(norm_fwd_register_kernel<T, W, O, kRms, 3>); break;
      default: launch(norm_fwd_register_kernel<T, W, O, kRms, 4>); break;
    }
    check_launch("norm_fwd_register_kernel");
    return;
  }
  a.tpr = general_tpr(p.cols);
  const int block = a.tpr > 128 ? a.tpr : 128;
  const int grid = p.rows == 0 ? 1 : blocks_for(p.rows, block / a.tpr);
  norm_fwd_general_kernel<T, W, O, kRms><<<grid, block, 0, stream>>>(a);
  check_launch("norm_fwd_general_kernel");
}

template <typename T, typename W>
void launch_fwd_for_weight(const NormFwdParams& p, cudaStream_t stream) {
  auto run = [&](auto out_tag) {
    using O = decltype(out_tag);
    if (p.rms)
      launch_fwd<T, W, O, true>(p, stream);
    else
      launch_fwd<T, W, O, false>(p, stream);
  };
  switch (p.z_type) {
    case kNVTEFloat8E4M3: run(fp8e4m3{}); break;
    case kNVTEFloat8E5M2: run(fp8e5m2{}); break;
    default: run(T{}); break;  // the entry point admits only x's dtype besides FP8
  }
}

template <typename T>
void launch_norm_fwd_typed(const NormFwdParams& p, cudaStream_t stream) {
  if (p.w_type == kNVTEFloat32)
    launch_fwd_for_weight<T, float>(p, stream);
  else
    launch_fwd_for_weight<T, T>(p, stream);
}

}  // namespace norm
}  // namespace te
