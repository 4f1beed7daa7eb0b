// Scaled (masked / causal) softmax kernels, forward and backward, and their launchers.
//
// Register path (row length a multiple of 8, 16-byte aligned tensors, rows of up to 16384
// elements): each row is read once into registers, reduced twice (max, then sum of exponentials)
// and written once, so the kernel moves the minimum bytes. The plain forward keeps the row packed
// as loaded (softmax_fwd_compact_kernel); the causal and masked forward keep fp32 logits.
// Exponentials are taken base 2 on inputs pre-multiplied by scale * log2(e): one subtraction and
// one hardware ex2 per element (fast_exp2_ftz; results below 2^-126 flush to zero, far below any
// bf16/fp16 probability that can register next to the row maximum's 1 in the sum). Causal rows
// skip loading the elements above the diagonal (they are written as zeros). The general path
// takes any length and alignment with strided scalar passes over the row.
#pragma once

#include "util/row_kernels.cuh"

namespace te {
namespace softmax {

using rows::Chunk;
using rows::MaxOp;
using rows::RowLayout;
using rows::SumOp;
using rows::blocks_for;
using rows::kMaxWarps;
using rows::load_floats;
using rows::load_row_chunks;
using rows::row_reduce;
using rows::store_floats;

enum Mode { kPlain = 0, kMasked = 1, kCausal = 2 };

constexpr int kMaxIters = 4;
constexpr int kMaxTpr = 512;  // 512 threads x 4 chunks x 8 = 16384 elements in registers
constexpr float kLog2e = 1.4426950408889634f;

struct MaskGeometry {
  int64_t sq;      // rows per (batch, head): query length
  int64_t heads;   // input heads
  int64_t mask_b;  // 1 (broadcast) or the batch
  int64_t mask_h;  // 1 (broadcast) or the heads
};

template <typename T>
struct FwdArgs {
  const T* x;
  const uint8_t* mask;  // kMasked only
  T* y;
  int64_t rows;
  int cols;
  int tpr;
  float scale_log2e;  // scale * log2(e)
  MaskGeometry geo;
};

template <typename T>
struct BwdArgs {
  const T* dy;
  const T* y;
  T* dx;
  int64_t rows;
  int cols;
  int tpr;
  float scale;
  int64_t sq;  // kCausal only
};

// Number of leading elements of `row` that take part: all of them, or up to the diagonal.
template <int kMode>
__device__ __forceinline__ int valid_length(int64_t row, int cols, int64_t sq) {
  if (kMode != kCausal) return cols;
  const int64_t q = row % sq;
  return q + 1 < cols ? static_cast<int>(q + 1) : cols;
}

// Row of the mask that applies to input `row` of [b, h, sq, sk].
__device__ __forceinline__ int64_t mask_row(int64_t row, const MaskGeometry& g) {
  const int64_t q = row % g.sq;
  const int64_t bh = row / g.sq;
  const int64_t h = g.mask_h == 1 ? 0 : bh % g.heads;
  const int64_t b = g.mask_b == 1 ? 0 : bh / g.heads;
  return (b * g.mask_h + h) * g.sq + q;
}

template <typename T, int kMode, int kIters>
__global__ void __launch_bounds__(kMaxTpr) softmax_fwd_register_kernel(FwdArgs<T> a) {
  constexpr int kN = 16 / sizeof(T);
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ float red[2][kMaxWarps];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  const int len = valid ? valid_length<kMode>(row, cols, a.geo.sq) : 0;
  const uint8_t* mask = kMode == kMasked && valid ? a.mask + mask_row(row, a.geo) * cols : nullptr;

  float v[kIters][kN];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (c < len) {
      load_floats<T, kN>(a.x + row * cols + c, v[it]);
      Chunk<uint8_t, kN> m;
      if (kMode == kMasked) m = *reinterpret_cast<const Chunk<uint8_t, kN>*>(mask + c);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        v[it][k] *= a.scale_log2e;
        if (kMode == kMasked && m.v[k] != 0) v[it][k] = kNegInf;
        if (kMode == kCausal && c + k >= len) v[it][k] = kNegInf;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) v[it][k] = kNegInf;
    }
  }

  float mx[1] = {kNegInf};
#pragma unroll
  for (int it = 0; it < kIters; ++it)
#pragma unroll
    for (int k = 0; k < kN; ++k) mx[0] = fmaxf(mx[0], v[it][k]);
  row_reduce(mx, tpr, red[0], MaxOp{});
  // A fully masked row has max -inf; subtracting 0 instead keeps exp(-inf) = 0, no NaN.
  const float shift = mx[0] == kNegInf ? 0.f : mx[0];
  float s[1] = {0.f};
#pragma unroll
  for (int it = 0; it < kIters; ++it)
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      v[it][k] = fast_exp2_ftz(v[it][k] - shift);
      s[0] += v[it][k];
    }
  row_reduce(s, tpr, red[1], SumOp{});
  const float inv = s[0] > 0.f ? 1.f / s[0] : 0.f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (valid && c < cols) {
#pragma unroll
      for (int k = 0; k < kN; ++k) v[it][k] *= inv;
      store_floats<T, kN>(a.y + row * cols + c, v[it]);
    }
  }
}

// Compact register path of the plain forward (it handles the causal form too, which measured
// slower with it: see launch_fwd): the row stays in registers as loaded
// (two 16-bit values per 32-bit register, half the registers of fp32 copies) and is unpacked
// again in each pass (a shift or one conversion per value; forget_value keeps the compiler from
// holding the unpacked copies). Each exponential is evaluated twice, for the sum and for the
// output, from the same subtraction, so both passes see the same value. On an H100 (bf16,
// interleaved with torch.compile) this took 355 us at 32768x8192 against 445 us for the fp32
// register kernel, and 92 us against 105 us at 16384x4096; keeping the next row's loads in
// flight (persistent blocks) or capping registers for more resident rows did not help.
template <typename T, int kMode, int kIters>
__global__ void __launch_bounds__(kMaxTpr) softmax_fwd_compact_kernel(FwdArgs<T> a) {
  static_assert(kMode != kMasked, "the masked forward keeps fp32 logits (register kernel)");
  static_assert(sizeof(T) == 2, "16-bit inputs: 8 values per 16-byte chunk");
  constexpr int kN = 8;
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ float red[2][kMaxWarps];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  const int len = valid ? valid_length<kMode>(row, cols, a.geo.sq) : 0;
  const float s = a.scale_log2e;

  uint4 xw[kIters];
  rows::load_row_words<T, kIters>(a.x + row * cols, valid, len, tpr, t, xw);
  auto forget = [&] {
#pragma unroll
    for (int it = 0; it < kIters; ++it) rows::forget_words(xw[it]);
  };
  // The 8 logits (base 2) of chunk `it`; values past the valid length are -inf. Whole chunks
  // take part in the plain form (cols is a multiple of kN there); the causal form cuts its last
  // chunk value by value.
  auto logits = [&](int it, float (&z)[kN]) {
    const int c = (it * tpr + t) * kN;
    rows::unpack_words<T>(xw[it], z);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const bool in = kMode == kCausal ? c + k < len : c < len;
      z[k] = in ? z[k] * s : kNegInf;
    }
  };

  float mx[1] = {kNegInf};
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    float z[kN];
    logits(it, z);
#pragma unroll
    for (int k = 0; k < kN; ++k) mx[0] = fmaxf(mx[0], z[k]);
  }
  forget();
  row_reduce(mx, tpr, red[0], MaxOp{});
  // A row with no valid value has max -inf; subtracting 0 keeps exp2(-inf) = 0, no NaN.
  const float shift = mx[0] == kNegInf ? 0.f : mx[0];
  float sum[1] = {0.f};
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    float z[kN];
    logits(it, z);
#pragma unroll
    for (int k = 0; k < kN; ++k) sum[0] += fast_exp2_ftz(z[k] - shift);
  }
  forget();
  row_reduce(sum, tpr, red[1], SumOp{});
  const float inv = sum[0] > 0.f ? 1.f / sum[0] : 0.f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (valid && c < cols) {
      float z[kN];
      logits(it, z);
#pragma unroll
      for (int k = 0; k < kN; ++k) z[k] = fast_exp2_ftz(z[k] - shift) * inv;
      store_floats<T, kN>(a.y + row * cols + c, z);
    }
  }
}

// y and dy are held as loaded, two values per register, and unpacked in each pass.
template <typename T, bool kIsCausal, int kIters>
__global__ void __launch_bounds__(kMaxTpr) softmax_bwd_register_kernel(BwdArgs<T> a) {
  wait_for_previous_grid();
  release_next_grid();
  constexpr int kN = 16 / sizeof(T);
  __shared__ float red[kMaxWarps];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  constexpr int kMode = kIsCausal ? Mode::kCausal : Mode::kPlain;
  const int len = valid ? valid_length<kMode>(row, cols, a.sq) : 0;

  uint4 ys[kIters], dys[kIters];
  rows::load_row_words<T, kIters>(a.y + row * cols, valid, len, tpr, t, ys);
  rows::load_row_words<T, kIters>(a.dy + row * cols, valid, len, tpr, t, dys);
  float dot[1] = {0.f};
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    float yv[kN], dyv[kN];
    rows::unpack_words<T>(ys[it], yv);
    rows::unpack_words<T>(dys[it], dyv);
#pragma unroll
    for (int k = 0; k < kN; ++k) dot[0] += yv[k] * dyv[k];
  }
  row_reduce(dot, tpr, red, SumOp{});
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = (it * tpr + t) * kN;
    if (valid && c < cols) {
      float out[kN], yv[kN], dyv[kN];
      rows::unpack_words<T>(ys[it], yv);
      rows::unpack_words<T>(dys[it], dyv);
#pragma unroll
      for (int k = 0; k < kN; ++k) out[k] = a.scale * yv[k] * (dyv[k] - dot[0]);
      store_floats<T, kN>(a.dx + row * cols + c, out);
    }
  }
}

// Any row length and alignment: strided scalar passes (max, sum, write) over the row.
template <typename T, int kMode>
__global__ void __launch_bounds__(1024) softmax_fwd_general_kernel(FwdArgs<T> a) {
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ float red[2][kMaxWarps];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  const int len = valid ? valid_length<kMode>(row, cols, a.geo.sq) : 0;
  const T* x = a.x + row * cols;
  const uint8_t* mask = kMode == kMasked && valid ? a.mask + mask_row(row, a.geo) * cols : nullptr;
  auto logit = [&](int c) {
    return (kMode == kMasked && mask[c] != 0) ? kNegInf : to_float(x[c]) * a.scale_log2e;
  };
  float mx[1] = {kNegInf};
  for (int c = t; c < len; c += tpr) mx[0] = fmaxf(mx[0], logit(c));
  row_reduce(mx, tpr, red[0], MaxOp{});
  const float shift = mx[0] == kNegInf ? 0.f : mx[0];
  float s[1] = {0.f};
  for (int c = t; c < len; c += tpr) s[0] += fast_exp2_ftz(logit(c) - shift);
  row_reduce(s, tpr, red[1], SumOp{});
  const float inv = s[0] > 0.f ? 1.f / s[0] : 0.f;
  if (!valid) return;
  for (int c = t; c < cols; c += tpr)
    a.y[row * cols + c] = from_float<T>(c < len ? fast_exp2_ftz(logit(c) - shift) * inv : 0.f);
}

template <typename T, bool kIsCausal>
__global__ void __launch_bounds__(1024) softmax_bwd_general_kernel(BwdArgs<T> a) {
  __shared__ float red[kMaxWarps];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool valid = row < a.rows;
  const int cols = a.cols;
  constexpr int kMode = kIsCausal ? Mode::kCausal : Mode::kPlain;
  const int len = valid ? valid_length<kMode>(row, cols, a.sq) : 0;
  const T* y = a.y + row * cols;
  const T* dy = a.dy + row * cols;
  float dot[1] = {0.f};
  for (int c = t; c < len; c += tpr) dot[0] += to_float(y[c]) * to_float(dy[c]);
  row_reduce(dot, tpr, red, SumOp{});
  if (!valid) return;
  for (int c = t; c < cols; c += tpr) {
    const float out = c < len ? a.scale * to_float(y[c]) * (to_float(dy[c]) - dot[0]) : 0.f;
    a.dx[row * cols + c] = from_float<T>(out);
  }
}

// Launch shape shared by forward and backward: (kernel variant, tpr, block, grid).
struct Launch {
  bool registers;
  RowLayout layout;
  int block;
  int grid;
};

inline Launch plan_launch(int64_t rows, int64_t cols, bool aligned) {
  Launch l{};
  constexpr int kN = 8;  // 16-bit inputs
  l.registers = aligned && cols % kN == 0 &&
                rows::pick_register_layout(cols / kN, kMaxIters, kMaxTpr, &l.layout);
  if (!l.registers) l.layout = RowLayout{rows::general_tpr(cols, 1024), 0};
  l.block = l.layout.tpr > 128 ? l.layout.tpr : 128;
  l.grid = blocks_for(rows, l.block / l.layout.tpr);
  return l;
}

template <typename T, int kMode>
void launch_fwd(FwdArgs<T> a, bool aligned, cudaStream_t stream) {
  if (a.rows == 0) return;
  const Launch l = plan_launch(a.rows, a.cols, aligned);
  a.tpr = l.layout.tpr;
  if (!l.registers) {
    softmax_fwd_general_kernel<T, kMode><<<l.grid, l.block, 0, stream>>>(a);
    check_launch("softmax_fwd_general_kernel");
    return;
  }
  // The compact kernel wins for the plain form (1.15-1.28x torch.compile on an H100); the causal
  // form measured slower with it (76% of copy against 88% with fp32 logits at 4x4096x4096), so it
  // keeps the register kernel, as does the masked form.
  if constexpr (kMode == kPlain) {
    switch (l.layout.iters) {
      case 1: softmax_fwd_compact_kernel<T, kMode, 1><<<l.grid, l.block, 0, stream>>>(a); break;
      case 2: softmax_fwd_compact_kernel<T, kMode, 2><<<l.grid, l.block, 0, stream>>>(a); break;
      case 3: softmax_fwd_compact_kernel<T, kMode, 3><<<l.grid, l.block, 0, stream>>>(a); break;
      default: softmax_fwd_compact_kernel<T, kMode, 4><<<l.grid, l.block, 0, stream>>>(a); break;
    }
    check_launch("softmax_fwd_compact_kernel");
  } else {
    switch (l.layout.iters) {
      case 1: softmax_fwd_register_kernel<T, kMode, 1><<<l.grid, l.block, 0, stream>>>(a); break;
      case 2: softmax_fwd_register_kernel<T, kMode, 2><<<l.grid, l.block, 0, stream>>>(a); break;
      case 3: softmax_fwd_register_kernel<T, kMode, 3><<<l.grid, l.block, 0, stream>>>(a); break;
      default: softmax_fwd_register_kernel<T, kMode, 4><<<l.grid, l.block, 0, stream>>>(a); break;
    }
    check_launch("softmax_fwd_register_kernel");
  }
}

template <typename T, bool kIsCausal>
void launch_bwd(BwdArgs<T> a, bool aligned, cudaStream_t stream) {
  if (a.rows == 0) return;
  const Launch l = plan_launch(a.rows, a.cols, aligned);
  a.tpr = l.layout.tpr;
  if (!l.registers) {
    softmax_bwd_general_kernel<T, kIsCausal><<<l.grid, l.block, 0, stream>>>(a);
    check_launch("softmax_bwd_general_kernel");
    return;
  }
  // Rows of 128 or 256 threads go two to a block (H100, bf16, scratch harness against one row
  // per block, ratio to torch.compile over two timings: 0.996 -> 0.997-1.002 at 16384x4096,
  // 1.010 -> 1.011 at 32768x8192; same bits, the row reductions do not change).
  int block = l.block, grid = l.grid;
  if (l.layout.tpr >= 128 && 2 * l.layout.tpr <= kMaxTpr) {
    block = 2 * l.layout.tpr;
    grid = blocks_for(a.rows, 2);
  }
  // Overlapping launches (util/arch.h): the kernel waits for the previous grid first.
  auto launch = [&](auto kernel) {
    launch_overlapping(kernel, dim3(grid), dim3(block), stream, a);
  };
  switch (l.layout.iters) {
    case 1: launch(softmax_bwd_register_kernel<T, kIsCausal, 1>); break;
    case 2: launch(softmax_bwd_register_kernel<T, kIsCausal, 2>); break;
    case 3: launch(softmax_bwd_register_kernel<T, kIsCausal, 3>); break;
    default: launch(softmax_bwd_register_kernel<T, kIsCausal, 4>); break;
  }
  check_launch("softmax_bwd_register_kernel");
}

}  // namespace softmax
}  // namespace te
