// LayerNorm / RMSNorm backward kernels and their launcher, instantiated per input dtype by
// bwd_<dtype>.cu.
//
// Stage 1 is persistent: as many blocks as fit on the device at once, each looping over rows.
// A thread always owns the same columns, so it accumulates its share of dgamma / dbeta in
// registers over every row its block visits, and the block writes one fp32 partial row to the
// workspace at the end. Stage 2 sums the partial rows column by column. Both are deterministic
// (fixed order, no atomics), and the weight gradients cost one small extra read instead of a
// second pass over dz and x.
#pragma once

#include "normalization/norm_kernels.cuh"

namespace te {
namespace norm {

template <typename T, typename W>
struct BwdArgs {
  const T* dz;
  const T* x;
  const float* mu;
  const float* rsigma;
  const W* gamma;
  T* dx;
  float* part_gamma;  // [gridDim.x, cols]
  float* part_beta;   // [gridDim.x, cols], null for RMSNorm
  int64_t rows;
  int cols;
  int tpr;
  float gamma_shift;
};

// The dgamma/dbeta accumulators triple the registers of the forward, so backward blocks hold at
// most 256 threads and the register cap follows the chunks per thread: <= 85 registers (three
// blocks per SM) for one or two chunks, <= 128 (two blocks) for three or four, and a long-row
// variant of eight chunks (16384 16-bit elements per row) at one block per SM.
constexpr int kBwdMaxTpr = 256;
constexpr int kBwdLongIters = 8;

template <typename T, typename W, bool kRms, int kIters>
__global__ void __launch_bounds__(kBwdMaxTpr, kIters <= 2 ? 3 : (kIters <= 4 ? 2 : 1))
norm_bwd_register_kernel(BwdArgs<T, W> a) {
  constexpr int kN = 16 / sizeof(T);
  __shared__ float red[2][2 * kMaxWarps];
  // [blockDim.x * kN] floats, used when a block holds several rows.
  extern __shared__ __align__(16) float part[];
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int slot = threadIdx.x / tpr;
  const int rows_per_block = blockDim.x / tpr;
  const int cols = a.cols;
  const float inv_cols = 1.f / cols;

  float dg[kIters][kN], db[kIters][kN];
#pragma unroll
  for (int it = 0; it < kIters; ++it)
#pragma unroll
    for (int k = 0; k < kN; ++k) dg[it][k] = db[it][k] = 0.f;

  int buf = 0;
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows;
       base += int64_t(gridDim.x) * rows_per_block) {
    const int64_t row = base + slot;
    const bool valid = row < a.rows;
    // x and dz stay in registers in their storage type (half the registers of fp32 copies);
    // conversion is a shift or one cvt per element and is repeated in the second pass.
    Chunk<T, kN> xs[kIters], dzs[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = (it * tpr + t) * kN;
      if (valid && c < cols) {
        xs[it] = *reinterpret_cast<const Chunk<T, kN>*>(a.x + row * cols + c);
        dzs[it] = *reinterpret_cast<const Chunk<T, kN>*>(a.dz + row * cols + c);
      } else {
#pragma unroll
        for (int k = 0; k < kN; ++k) xs[it].v[k] = dzs[it].v[k] = from_float<T>(0.f);
      }
    }
    const float mu = (!kRms && valid) ? a.mu[row] : 0.f;
    const float rs = valid ? a.rsigma[row] : 0.f;

    float sums[2] = {0.f, 0.f};  // sum(dy), sum(dy * xhat)
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = (it * tpr + t) * kN;
      if (c < cols) {
        float g[kN];
        load_floats<W, kN>(a.gamma + c, g);
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const float xhat = (to_float(xs[it].v[k]) - mu) * rs;
          const float d = to_float(dzs[it].v[k]);
          const float dy = d * (g[k] + a.gamma_shift);
          sums[0] += dy;
          sums[1] += dy * xhat;
          dg[it][k] += d * xhat;
          db[it][k] += d;
        }
      }
    }
    row_sum<2>(sums, tpr, red[buf]);
    buf ^= 1;
    const float mean_dy = kRms ? 0.f : sums[0] * inv_cols;
    const float mean_dyx = sums[1] * inv_cols;

#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = (it * tpr + t) * kN;
      if (valid && c < cols) {
        float g[kN], out[kN];
        load_floats<W, kN>(a.gamma + c, g);
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const float xhat = (to_float(xs[it].v[k]) - mu) * rs;
          const float dy = to_float(dzs[it].v[k]) * (g[k] + a.gamma_shift);
          out[k] = rs * (dy - mean_dy - xhat * mean_dyx);
        }
        store_floats<T, kN>(a.dx + row * cols + c, out);
      }
    }
  }

  // One partial row per block: fold the block's row slots together first.
  float* pg = a.part_gamma + int64_t(blockIdx.x) * cols;
  float* pb = kRms ? nullptr : a.part_beta + int64_t(blockIdx.x) * cols;
  if (rows_per_block == 1) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = (it * tpr + t) * kN;
      if (c < cols) {
        store_floats<float, kN>(pg + c, dg[it]);
        if (!kRms) store_floats<float, kN>(pb + c, db[it]);
      }
    }
    return;
  }
  const int span = tpr * kN;  // columns covered by one iteration of every row slot
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int which = 0; which < (kRms ? 1 : 2); ++which) {
      store_floats<float, kN>(part + slot * span + t * kN, which == 0 ? dg[it] : db[it]);
      __syncthreads();
      float* dst = which == 0 ? pg : pb;
      for (int j = threadIdx.x; j < span; j += blockDim.x) {
        const int c = it * span + j;
        float s = 0.f;
        for (int r = 0; r < rows_per_block; ++r) s += part[r * span + j];
        if (c < cols) dst[c] = s;
      }
      __syncthreads();
    }
  }
}

// Any cols, any alignment; one row per block at a time. The block's partial row lives in the
// workspace from the start and each thread updates only its own columns, so no barrier is
// needed for it.
template <typename T, typename W, bool kRms>
__global__ void __launch_bounds__(1024) norm_bwd_general_kernel(BwdArgs<T, W> a) {
  __shared__ float red[2][2 * kMaxWarps];
  const int tpr = blockDim.x;
  const int t = threadIdx.x;
  const int cols = a.cols;
  const float inv_cols = 1.f / cols;
  float* pg = a.part_gamma + int64_t(blockIdx.x) * cols;
  float* pb = kRms ? nullptr : a.part_beta + int64_t(blockIdx.x) * cols;
  for (int c = t; c < cols; c += tpr) {
    pg[c] = 0.f;
    if (!kRms) pb[c] = 0.f;
  }
  int buf = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* x = a.x + row * cols;
    const T* dz = a.dz + row * cols;
    const float mu = kRms ? 0.f : a.mu[row];
    const float rs = a.rsigma[row];
    float sums[2] = {0.f, 0.f};
    for (int c = t; c < cols; c += tpr) {
      const float xhat = (to_float(x[c]) - mu) * rs;
      const float dy = to_float(dz[c]) * (to_float(a.gamma[c]) + a.gamma_shift);
      sums[0] += dy;
      sums[1] += dy * xhat;
    }
    row_sum<2>(sums, tpr, red[buf]);
    buf ^= 1;
    const float mean_dy = kRms ? 0.f : sums[0] * inv_cols;
    const float mean_dyx = sums[1] * inv_cols;
    for (int c = t; c < cols; c += tpr) {
      const float xhat = (to_float(x[c]) - mu) * rs;
      const float d = to_float(dz[c]);
      const float dy = d * (to_float(a.gamma[c]) + a.gamma_shift);
      a.dx[row * cols + c] = from_float<T>(rs * (dy - mean_dy - xhat * mean_dyx));
      pg[c] += d * xhat;
      if (!kRms) pb[c] += d;
    }
  }
}

// Stage 2: out[c] = sum over p of part[p, c]. 32 columns per block (coalesced 128-byte rows),
// 8 groups of threads splitting the partial rows, then a fixed-order sum in shared memory.
// blockIdx.y selects dgamma (0) or dbeta (1).
template <typename W>
__global__ void __launch_bounds__(256)
norm_bwd_finalize_kernel(const float* part_gamma, const float* part_beta, int64_t partials,
                         int cols, W* dgamma, W* dbeta) {
  __shared__ float acc[8][33];
  const float* part = blockIdx.y == 0 ? part_gamma : part_beta;
  W* out = blockIdx.y == 0 ? dgamma : dbeta;
  const int lane = threadIdx.x % 32;
  const int group = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (c < cols) {
    int64_t p = group;
    // Four independent loads in flight per thread.
    for (; p + 24 < partials; p += 32) {
      const float v0 = part[p * cols + c], v1 = part[(p + 8) * cols + c];
      const float v2 = part[(p + 16) * cols + c], v3 = part[(p + 24) * cols + c];
      s += (v0 + v1) + (v2 + v3);
    }
    for (; p < partials; p += 8) s += part[p * cols + c];
  }
  acc[group][lane] = s;
  __syncthreads();
  if (group == 0 && c < cols) {
    float total = 0.f;
#pragma unroll
    for (int g = 0; g < 8; ++g) total += acc[g][lane];
    out[c] = from_float<W>(total);
  }
}

inline int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    throw Error(kNVTEDeviceError, "could not query the device's multiprocessor count");
  return sms;
}

// Blocks of `kernel` that fit on the device at once, capped by the work available.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int block, size_t smem, int64_t wanted) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem) != cudaSuccess)
    throw Error(kNVTEDeviceError, "occupancy query for the normalization backward failed");
  const int64_t cap = int64_t(device_sm_count()) * (per_sm > 0 ? per_sm : 1);
  return wanted < cap ? wanted : cap;
}

template <typename T, typename W, bool kRms>
int64_t run_bwd(const NormBwdParams& p, cudaStream_t stream, bool launch) {
  constexpr int kN = 16 / sizeof(T);
  BwdArgs<T, W> a{static_cast<const T*>(p.dz), static_cast<const T*>(p.x), p.mu, p.rsigma,
                  static_cast<const W*>(p.gamma), static_cast<T*>(p.dx), nullptr, nullptr,
                  p.rows, static_cast<int>(p.cols), 0, p.zero_centered_gamma ? 1.f : 0.f};
  const bool vectorizable = p.cols % kN == 0 && aligned16(p.x) && aligned16(p.dz) &&
                            aligned16(p.dx) && aligned16(p.gamma);
  RowLayout layout;
  int64_t partials = 1;
  int block = 0;
  size_t smem = 0;
  void (*kernel)(BwdArgs<T, W>) = nullptr;
  // Prefer two chunks per thread (lighter registers, more blocks per SM), then up to four, then
  // the long-row variant.
  const int64_t chunks = p.cols / kN;
  if (vectorizable && (pick_register_layout(chunks, 2, kBwdMaxTpr, &layout) ||
                       pick_register_layout(chunks, kMaxIters, kBwdMaxTpr, &layout) ||
                       pick_register_layout(chunks, kBwdLongIters, kBwdMaxTpr, &layout))) {
    // At least 256 threads per block so that short rows share a block (and its partial row).
    block = kBwdMaxTpr;
    smem = block > layout.tpr ? size_t(block) * kN * sizeof(float) : 0;
    a.tpr = layout.tpr;
    switch (layout.iters) {
      case 1: kernel = norm_bwd_register_kernel<T, W, kRms, 1>; break;
      case 2: kernel = norm_bwd_register_kernel<T, W, kRms, 2>; break;
      case 3: kernel = norm_bwd_register_kernel<T, W, kRms, 3>; break;
      case 4: kernel = norm_bwd_register_kernel<T, W, kRms, 4>; break;
      default: kernel = norm_bwd_register_kernel<T, W, kRms, kBwdLongIters>; break;
    }
    partials = resident_blocks(kernel, block, smem, blocks_for(p.rows, block / layout.tpr));
  } else {
    block = general_tpr(p.cols);
    a.tpr = block;
    kernel = norm_bwd_general_kernel<T, W, kRms>;
    partials = resident_blocks(kernel, block, 0, p.rows);
  }
  if (partials < 1) partials = 1;
  if (!launch) return partials;

  a.part_gamma = p.workspace;
  a.part_beta = kRms ? nullptr : p.workspace + partials * p.cols;
  if (p.rows > 0) {
    kernel<<<static_cast<unsigned>(partials), block, smem, stream>>>(a);
    check_launch("norm_bwd_kernel");
  }
  // With no rows stage 1 did not run: stage 2 then sums zero partial rows and writes zeros.
  const int64_t summed = p.rows > 0 ? partials : 0;
  const dim3 grid(static_cast<unsigned>((p.cols + 31) / 32), kRms ? 1 : 2);
  norm_bwd_finalize_kernel<W><<<grid, 256, 0, stream>>>(
      a.part_gamma, a.part_beta, summed, static_cast<int>(p.cols), static_cast<W*>(p.dgamma),
      static_cast<W*>(p.dbeta));
  check_launch("norm_bwd_finalize_kernel");
  return partials;
}

template <typename T>
int64_t run_norm_bwd_typed(const NormBwdParams& p, cudaStream_t stream, bool launch) {
  if (p.w_type == kNVTEFloat32)
    return p.rms ? run_bwd<T, float, true>(p, stream, launch)
                 : run_bwd<T, float, false>(p, stream, launch);
  return p.rms ? run_bwd<T, T, true>(p, stream, launch) : run_bwd<T, T, false>(p, stream, launch);
}

}  // namespace norm
}  // namespace te
