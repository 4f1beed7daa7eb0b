// Block-wise FP8 quantisation (Float8BlockScaling): one fp32 scale per 1x128 row segment or per
// 128x128 tile, computed from the block's own amax (see cast.h for the formulas and layouts).
//
// One thread block of kTile threads per 128x128 tile of the input. Row-wise 1x128 blocks: a warp
// per row, its lanes across the columns; column-wise 128x1 blocks (the transposed output) and the
// 128x128 tile: thread t owns column c0 + t. Reads are coalesced either way; the transpose is
// written 16 bytes per store where its rows allow. Each element is read twice (amax pass, cast
// pass); the second read comes from L1/L2.
#include <float.h>

#include "transformer_engine/cast.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kTile = 128;  // block edge, and threads per thread block

__device__ __forceinline__ float fp8_max_of(fp8e4m3) {
  return TE_FP8_FNUZ ? kFp8E4M3MaxFnuz : kFp8E4M3MaxOcp;
}
__device__ __forceinline__ float fp8_max_of(fp8e5m2) {
  return TE_FP8_FNUZ ? kFp8E5M2MaxFnuz : kFp8E5M2MaxOcp;
}

// scale = fp8_max / amax; 1 where amax is 0, NaN or infinite (the block then casts unscaled, so
// NaN stays NaN and infinities saturate); FLT_MAX where the quotient overflows; with pow2 the
// largest power of two not above it (the exponent bits alone: scale is always a normal float).
__device__ __forceinline__ float block_scale(float amax, float fp8_max, bool pow2) {
  float s = (amax > 0.f && amax <= FLT_MAX) ? fp8_max / amax : 1.f;
  if (isinf(s)) s = FLT_MAX;
  if (pow2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
  return s;
}

// int64_t is long on one platform and long long on another: no min() overload to rely on.
__device__ __forceinline__ int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

struct BlockwiseParams {
  int64_t rows, cols;
  int64_t ld_scale, ld_scale_t;  // row pitch of the scale arrays (elements)
  float* scale_inv;              // row-wise (1-D) or tile (2-D) scales of out
  float* scale_inv_t;            // scales of out_t (null: no transposed output)
  bool pow2;
  bool vec_t;  // rows % 16 == 0 and out_t 16-byte aligned: 16-byte stores into the transpose
};

// Writes column c of the tile (input rows [r0, r_end)) times s into row c of the transpose: 16
// values per store where p.vec_t says rows are a multiple of 16 and out_t is 16-byte aligned.
template <typename InT, typename OutT>
__device__ __forceinline__ void write_transposed(const InT* in, OutT* out_t, const BlockwiseParams& p,
                                                 int64_t c, int64_t r0, int64_t r_end, float s) {
  OutT* dst = out_t + c * p.rows;
  if (p.vec_t) {
    for (int64_t i = r0; i < r_end; i += 16) {
      Vec<OutT, 16> v;
#pragma unroll
      for (int k = 0; k < 16; ++k) v.v[k] = from_float<OutT>(to_float(in[(i + k) * p.cols + c]) * s);
      v.store(dst + i);
    }
    return;
  }
  for (int64_t i = r0; i < r_end; ++i) dst[i] = from_float<OutT>(to_float(in[i * p.cols + c]) * s);
}

template <typename InT, typename OutT>
__global__ void __launch_bounds__(kTile)
quantize_1d_kernel(const InT* __restrict__ in, OutT* __restrict__ out, OutT* __restrict__ out_t,
                   BlockwiseParams p) {
  const float fp8_max = fp8_max_of(OutT{});
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int64_t r_end = min_i64(r0 + kTile, p.rows), c_end = min_i64(c0 + kTile, p.cols);
  // Row-wise 1x128 blocks: one warp per row at a time, its lanes across the block's columns
  // (coalesced); the butterfly reduction leaves the amax in every lane.
  if (out != nullptr) {
    const int lane = threadIdx.x % TE_WARP_SIZE, warp = threadIdx.x / TE_WARP_SIZE;
    constexpr int kWarps = kTile / TE_WARP_SIZE;
    for (int64_t r = r0 + warp; r < r_end; r += kWarps) {
      const InT* src = in + r * p.cols;
      float amax = 0.f;
      for (int64_t c = c0 + lane; c < c_end; c += TE_WARP_SIZE) amax = amax_step(amax, to_float(src[c]));
      amax = warp_reduce_max(amax);
      const float s = block_scale(amax, fp8_max, p.pow2);
      for (int64_t c = c0 + lane; c < c_end; c += TE_WARP_SIZE)
        out[r * p.cols + c] = from_float<OutT>(to_float(src[c]) * s);
      if (lane == 0) p.scale_inv[blockIdx.x * p.ld_scale + r] = 1.f / s;
    }
  }
  // Column-wise 128x1 blocks into the transpose: thread t owns column c0 + t (coalesced reads).
  const int64_t c = c0 + threadIdx.x;
  if (out_t != nullptr && c < c_end) {
    float amax = 0.f;
    for (int64_t i = r0; i < r_end; ++i) amax = amax_step(amax, to_float(in[i * p.cols + c]));
    const float s = block_scale(amax, fp8_max, p.pow2);
    write_transposed(in, out_t, p, c, r0, r_end, s);
    p.scale_inv_t[blockIdx.y * p.ld_scale_t + c] = 1.f / s;
  }
}

template <typename InT, typename OutT>
__global__ void __launch_bounds__(kTile)
quantize_2d_kernel(const InT* __restrict__ in, OutT* __restrict__ out, OutT* __restrict__ out_t,
                   BlockwiseParams p) {
  __shared__ float scratch[kTile / TE_LOGICAL_WARP_SIZE + 1];
  __shared__ float tile_scale;
  const float fp8_max = fp8_max_of(OutT{});
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int64_t r_end = min_i64(r0 + kTile, p.rows), c_end = min_i64(c0 + kTile, p.cols);
  const int64_t c = c0 + threadIdx.x;
  float amax = 0.f;
  if (c < c_end)
    for (int64_t i = r0; i < r_end; ++i) amax = amax_step(amax, to_float(in[i * p.cols + c]));
  amax = block_reduce_max(amax, scratch);
  if (threadIdx.x == 0) {
    const float s = block_scale(amax, fp8_max, p.pow2);
    tile_scale = s;
    p.scale_inv[blockIdx.y * p.ld_scale + blockIdx.x] = 1.f / s;
    if (out_t != nullptr) p.scale_inv_t[blockIdx.x * p.ld_scale_t + blockIdx.y] = 1.f / s;
  }
  __syncthreads();
  const float s = tile_scale;
  if (c >= c_end) return;
  for (int64_t i = r0; i < r_end; ++i)
    out[i * p.cols + c] = from_float<OutT>(to_float(in[i * p.cols + c]) * s);
  if (out_t != nullptr) write_transposed(in, out_t, p, c, r0, r_end, s);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up4(int64_t a) { return (a + 3) / 4 * 4; }

void check_scale_inv(const NVTETensor& t, const char* what) {
  TE_CHECK_ARG(t.scale_inv != nullptr, what, " needs a scale_inv pointer (the block scales)");
}

}  // namespace
}  // namespace te

using namespace te;

extern "C" size_t nvte_blockwise_scale_elems(int64_t rows, int64_t cols, int block_dim) {
  if (block_dim == 2) return size_t(ceil_div(rows, kTile) * round_up4(ceil_div(cols, kTile)));
  return size_t(ceil_div(cols, kTile) * round_up4(rows));
}

extern "C" NVTEStatus nvte_quantize_blockwise(const NVTETensor* input, NVTETensor* output,
                                              NVTETensor* output_t, int block_dim, bool pow2_scales,
                                              NVTEStream stream) {
  return guard("nvte_quantize_blockwise", [&] {
    check_tensor(input, "input");
    check_tensor(output, "output");
    TE_CHECK_ARG(block_dim == 1 || block_dim == 2, "block_dim is ", block_dim,
                 "; expected 1 (1x128 blocks) or 2 (128x128 blocks)");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    TE_CHECK_ARG(numel(*input) == numel(*output), "input shape ", shape_str(*input),
                 " and output shape ", shape_str(*output), " have different element counts");
    check_scale_inv(*output, "output");
    const bool with_t = output_t != nullptr && output_t->data != nullptr;
    int64_t rows = 0, cols = 0;
    as_2d(*input, &rows, &cols);
    if (with_t) {
      check_tensor(output_t, "output_t");
      check_scale_inv(*output_t, "output_t");
      TE_CHECK_ARG(output_t->dtype == output->dtype, "output_t has dtype ",
                   nvte_dtype_name(output_t->dtype), "; expected output's, ",
                   nvte_dtype_name(output->dtype));
      int64_t tr = 0, tc = 0;
      as_2d(*output_t, &tr, &tc);
      TE_CHECK_ARG(tr == cols && tc == rows, "output_t has shape ", shape_str(*output_t),
                   "; expected the transpose of input's 2-D view [", rows, ", ", cols, "]");
    }
    if (rows == 0 || cols == 0) return;
    BlockwiseParams p{};
    p.rows = rows;
    p.cols = cols;
    p.pow2 = pow2_scales;
    p.scale_inv = output->scale_inv;
    p.scale_inv_t = with_t ? output_t->scale_inv : nullptr;
    p.vec_t = with_t && rows % 16 == 0 && aligned16(output_t->data);
    if (block_dim == 2) {
      p.ld_scale = round_up4(ceil_div(cols, kTile));
      p.ld_scale_t = round_up4(ceil_div(rows, kTile));
    } else {
      p.ld_scale = round_up4(rows);
      p.ld_scale_t = round_up4(cols);
    }
    TE_CHECK_ARG(ceil_div(rows, kTile) < 65536, "input has ", rows,
                 " rows; at most 65535 * 128 are supported");
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)),
                    static_cast<unsigned>(ceil_div(rows, kTile)));
    TE_SWITCH_HP(input->dtype, InT, "input",
      TE_SWITCH_FP8(output->dtype, OutT, "output",
        const InT* in = static_cast<const InT*>(input->data);
        OutT* out = static_cast<OutT*>(output->data);
        OutT* out_t = with_t ? static_cast<OutT*>(output_t->data) : nullptr;
        if (block_dim == 2)
          quantize_2d_kernel<InT, OutT><<<grid, kTile, 0, to_stream(stream)>>>(in, out, out_t, p);
        else
          quantize_1d_kernel<InT, OutT><<<grid, kTile, 0, to_stream(stream)>>>(in, out, out_t, p);
        check_launch("quantize_blockwise_kernel")));
  });
}
