// LayerNorm / RMSNorm backward kernels and their launcher, instantiated per input dtype by
// bwd_<dtype>.cu.
//
// Stage 1 is persistent: as many blocks as fit on the device at once, each looping over rows.
// A thread always owns the same columns, so it accumulates its share of dgamma / dbeta over every
// row its block visits, in shared memory that only it touches (registers would triple the
// forward's and spill), and the block writes one fp32 partial row to the workspace at the end.
// Stage 2 sums the partial rows column by column. Both are deterministic (fixed order, no
// atomics), and the weight gradients cost one small extra read instead of a second pass over dz
// and x.
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
  // Optional (null: none): the gradient reaching x by another path, a residual connection's,
  // added into dx in fp32 before the one rounding (saves the separate add's pass over dx).
  const T* dresidual;
  float* part_gamma;  // [gridDim.x, cols]
  float* part_beta;   // [gridDim.x, cols], null for RMSNorm
  int64_t rows;
  int cols;
  int tpr;
  float gamma_shift;
};

// Backward blocks hold 256 threads (several short rows, or one row of up to 256 threads); the
// register cap follows the chunks per thread: <= 85 registers (three blocks per SM) for up to
// two chunks, <= 128 for three or four, and a long-row variant of eight chunks (16384 16-bit
// elements per row) at one block per SM.
constexpr int kBwdMaxTpr = 256;
constexpr int kBwdLongIters = 8;

// Accumulator layout in shared memory, per row slot: [kRms ? 1 : 2][cols] floats. Within one
// accumulator the 16-byte group h of chunk j lives at float offset (h * chunks + j) * 4, so the
// threads of a warp (consecutive j) touch consecutive 16-byte words: no bank conflicts.
template <int kN>
__device__ __forceinline__ int acc_offset(int chunk, int group, int chunks) {
  return (group * chunks + chunk) * 4;
}

template <typename T, typename W, bool kRms, int kIters>
__global__ void __launch_bounds__(kBwdMaxTpr, kIters <= 2 ? 3 : (kIters <= 4 ? 2 : 1))
norm_bwd_register_kernel(BwdArgs<T, W> a) {
  constexpr int kN = 16 / sizeof(T);
  constexpr int kGroups = kN / 4;  // 16-byte float groups per chunk
  constexpr int kAccs = kRms ? 1 : 2;
  __shared__ float red[2][2 * kMaxWarps];
  extern __shared__ __align__(16) float acc[];  // [rows_per_block][kAccs][cols]
  const int tpr = a.tpr;
  const int t = threadIdx.x & (tpr - 1);
  const int slot = threadIdx.x / tpr;
  const int rows_per_block = blockDim.x / tpr;
  const int64_t stride = int64_t(gridDim.x) * rows_per_block;
  const int cols = a.cols;
  const int chunks = cols / kN;
  const float inv_cols = 1.f / cols;
  float* my_acc = acc + slot * kAccs * cols;

#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int j = it * tpr + t;
    if (j < chunks) {
#pragma unroll
      for (int w = 0; w < kAccs; ++w)
#pragma unroll
        for (int h = 0; h < kGroups; ++h)
          *reinterpret_cast<float4*>(my_acc + w * cols + acc_offset<kN>(j, h, chunks)) =
              make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  // x and dz stay in registers in their storage type (half the registers of fp32 copies) between
  // the two passes; conversion is a shift or one cvt per element. (Loading the next row ahead,
  // as the forward does, would need twice these registers here and spill.)
  int buf = 0;
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows; base += stride) {
    const int64_t row = base + slot;
    const bool valid = row < a.rows;
    Chunk<T, kN> xs[kIters], dzs[kIters];
    load_row_chunks<T, kN, kIters>(a.x + row * cols, valid, cols, tpr, t, xs);
    load_row_chunks<T, kN, kIters>(a.dz + row * cols, valid, cols, tpr, t, dzs);
    const float mu = (!kRms && valid) ? a.mu[row] : 0.f;
    const float rs = valid ? a.rsigma[row] : 0.f;

    float sums[2] = {0.f, 0.f};  // sum(dy), sum(dy * xhat)
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int j = it * tpr + t;
      if (j < chunks) {
        float g[kN], dg[kN], db[kN];
        load_floats<W, kN>(a.gamma + j * kN, g);
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const float xhat = (to_float(xs[it].v[k]) - mu) * rs;
          const float d = to_float(dzs[it].v[k]);
          const float dy = d * (g[k] + a.gamma_shift);
          sums[0] += dy;
          sums[1] += dy * xhat;
          dg[k] = d * xhat;
          db[k] = d;
        }
#pragma unroll
        for (int h = 0; h < kGroups; ++h) {
          float4* pg = reinterpret_cast<float4*>(my_acc + acc_offset<kN>(j, h, chunks));
          float4 v = *pg;
          v.x += dg[4 * h]; v.y += dg[4 * h + 1]; v.z += dg[4 * h + 2]; v.w += dg[4 * h + 3];
          *pg = v;
          if (!kRms) {
            float4* pb = reinterpret_cast<float4*>(my_acc + cols + acc_offset<kN>(j, h, chunks));
            float4 u = *pb;
            u.x += db[4 * h]; u.y += db[4 * h + 1]; u.z += db[4 * h + 2]; u.w += db[4 * h + 3];
            *pb = u;
          }
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
        if (a.dresidual != nullptr) {  // uniform across the grid
          float r[kN];
          load_floats<T, kN>(a.dresidual + row * cols + c, r);
#pragma unroll
          for (int k = 0; k < kN; ++k) out[k] += r[k];
        }
        store_floats<T, kN>(a.dx + row * cols + c, out);
      }
    }
  }

  // One partial row per block: fold the row slots together in a fixed order.
  __syncthreads();
  float* pg = a.part_gamma + int64_t(blockIdx.x) * cols;
  float* pb = kRms ? nullptr : a.part_beta + int64_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const int k = c % kN;
    const int off = acc_offset<kN>(c / kN, k / 4, chunks) + k % 4;
    float sg = 0.f, sb = 0.f;
    for (int r = 0; r < rows_per_block; ++r) {
      sg += acc[r * kAccs * cols + off];
      if (!kRms) sb += acc[r * kAccs * cols + cols + off];
    }
    pg[c] = sg;
    if (!kRms) pb[c] = sb;
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
      const float res = a.dresidual != nullptr ? to_float(a.dresidual[row * cols + c]) : 0.f;
      a.dx[row * cols + c] = from_float<T>(rs * (dy - mean_dy - xhat * mean_dyx) + res);
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

// Kernels whose accumulators need more than the default 48 KB of shared memory opt in. Returns
// false when the device cannot grant `smem` bytes per block (e.g. 64 KB LDS on CDNA3): the caller
// then takes the general path.
template <typename Kernel>
bool allow_dynamic_smem(Kernel kernel, size_t smem) {
  // The 48 KB default covers static + dynamic shared memory; the register kernel's static part is
  // its reduction scratch (768 columns of 16-bit data once asked for exactly 48 KB of dynamic
  // memory, and the launch failed).
  constexpr size_t kStaticBytes = 2 * 2 * kMaxWarps * sizeof(float);
  if (smem + kStaticBytes <= 48 * 1024) return true;
  int dev = 0, limit = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    throw Error(kNVTEDeviceError, "could not query the device's shared memory per block");
  if (smem > size_t(limit)) return false;
  // The const void* form: HIP has no templated overload taking the kernel itself.
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess)
    throw Error(kNVTEDeviceError, concat("could not grant ", smem, " bytes of shared memory to "
                                         "the normalization backward"));
  return true;
}

template <typename T, typename W, bool kRms>
int64_t run_bwd(const NormBwdParams& p, cudaStream_t stream, bool launch) {
  constexpr int kN = 16 / sizeof(T);
  BwdArgs<T, W> a{static_cast<const T*>(p.dz), static_cast<const T*>(p.x), p.mu, p.rsigma,
                  static_cast<const W*>(p.gamma), static_cast<T*>(p.dx),
                  static_cast<const T*>(p.dresidual), nullptr, nullptr,
                  p.rows, static_cast<int>(p.cols), 0, p.zero_centered_gamma ? 1.f : 0.f};
  const bool vectorizable = p.cols % kN == 0 && aligned16(p.x) && aligned16(p.dz) &&
                            aligned16(p.dx) && aligned16(p.gamma) &&
                            (p.dresidual == nullptr || aligned16(p.dresidual));
  RowLayout layout;
  int64_t partials = 1;
  int block = 0;
  size_t smem = 0;
  void (*kernel)(BwdArgs<T, W>) = nullptr;
  // Up to four chunks per thread, then the long-row variant. (Preferring two chunks for their
  // lighter registers and extra block per SM was 10% slower at 16384x4096 bf16 on an H100:
  // 175 us for 256 threads x 2 chunks against 159 us for 128 threads x 4; a variant loading the
  // next row ahead was slower still, 189 us, at two blocks per SM.)
  const int64_t chunks = p.cols / kN;
  bool registers =
      vectorizable && (pick_register_layout(chunks, kMaxIters, kBwdMaxTpr, &layout) ||
                       pick_register_layout(chunks, kBwdLongIters, kBwdMaxTpr, &layout));
  if (registers) {
    block = kBwdMaxTpr;
    smem = size_t(block / layout.tpr) * (kRms ? 1 : 2) * size_t(p.cols) * sizeof(float);
    a.tpr = layout.tpr;
    switch (layout.iters) {
      case 1: kernel = norm_bwd_register_kernel<T, W, kRms, 1>; break;
      case 2: kernel = norm_bwd_register_kernel<T, W, kRms, 2>; break;
      case 3: kernel = norm_bwd_register_kernel<T, W, kRms, 3>; break;
      case 4: kernel = norm_bwd_register_kernel<T, W, kRms, 4>; break;
      default: kernel = norm_bwd_register_kernel<T, W, kRms, kBwdLongIters>; break;
    }
    registers = allow_dynamic_smem(kernel, smem);
  }
  if (registers) {
    partials = rows::resident_blocks(kernel, block, smem, blocks_for(p.rows, block / layout.tpr));
  } else {
    smem = 0;
    block = general_tpr(p.cols);
    a.tpr = block;
    kernel = norm_bwd_general_kernel<T, W, kRms>;
    partials = rows::resident_blocks(kernel, block, 0, p.rows);
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
