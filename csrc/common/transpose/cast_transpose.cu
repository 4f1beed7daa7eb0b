// Transpose and fused FP8 cast+transpose of a [rows, cols] row-major tensor.
//
// A block owns a tile of kTile x kTile elements, kTile = 8 * kSeg where kSeg = 16 / sizeof(OutT)
// (the elements of one 16-byte output access). Phase 1 reads each row of the tile as 8 segments
// of kSeg elements, converts them, writes the row-major output directly and parks the converted
// segment in shared memory. Phase 2 reads kSeg consecutive rows of one column from shared memory
// and writes them as one 16-byte access of the transposed output.
//
// Shared memory is swizzled at 16-byte granularity: segment s of row r lives in chunk
// s ^ ((r / kSeg) % 8). In phase 2 the 8 threads that write one 128-byte run of a transposed row
// read the same column in 8 different row groups, which the swizzle spreads over 8 different
// bank groups instead of one.
#include "transformer_engine/transpose.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kThreads = 256;
constexpr int kSegsPerRow = 8;  // 8 x 16 bytes: a 128-byte row of output per tile row

template <typename OutT>
struct Tile {
  static constexpr int kSeg = 16 / sizeof(OutT);
  static constexpr int kDim = kSegsPerRow * kSeg;
  static constexpr int kRowsPerPass = kThreads / kSegsPerRow;  // 32
  static constexpr int kPasses = kDim / kRowsPerPass;            // kSeg / 4
  static_assert(kPasses >= 1, "element type too wide for this tile");
};

// kCast: out = fp8(x * scale) with amax; otherwise out = x (InT == OutT).
// kAligned: rows, cols are multiples of kSeg and pointers 16-byte aligned, so every segment is
// either wholly inside the tensor or wholly outside and can move as one vector.
// Four resident blocks per SM (a 64-register cap) keep loads in flight while other blocks are in
// their shared-memory phase; uncapped, the bf16 variant takes 108 registers and fits only two.
constexpr int kMinBlocksPerSM = 3;

template <typename InT, typename OutT, bool kCast, bool kAligned>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM)
transpose_kernel(const InT* __restrict__ in, OutT* __restrict__ out, OutT* __restrict__ out_t,
                 int64_t rows, int64_t cols, const float* __restrict__ scale_ptr,
                 float* __restrict__ amax_ptr, float* __restrict__ scale_inv_ptr) {
  using T = Tile<OutT>;
  constexpr int kSeg = T::kSeg;
  __shared__ alignas(16) OutT smem[T::kDim][T::kDim];
  __shared__ float scratch[kThreads / TE_LOGICAL_WARP_SIZE + 1];

  const int64_t col_tiles = cols > 0 ? (cols + T::kDim - 1) / T::kDim : 1;
  const int64_t row0 = (blockIdx.x / col_tiles) * T::kDim;
  const int64_t col0 = (blockIdx.x % col_tiles) * T::kDim;
  const int seg = threadIdx.x % kSegsPerRow;
  float scale = 1.f;
  if (kCast) {
    scale = *scale_ptr;
    if (scale_inv_ptr != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv_ptr = 1.f / scale;
  }
  float amax = 0.f;

  // Phase 1: all loads first, so that kPasses 16..64-byte reads per thread are in flight.
  Vec<InT, kSeg> x[T::kPasses];
#pragma unroll
  for (int p = 0; p < T::kPasses; ++p) {
    const int r = p * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
    const int64_t gr = row0 + r, gc = col0 + seg * kSeg;
    const InT* src = in + gr * cols + gc;
    if (kAligned) {
      if (gr < rows && gc < cols) x[p].load(src);
    } else {
#pragma unroll
      for (int k = 0; k < kSeg; ++k)
        if (gr < rows && gc + k < cols) x[p].v[k] = src[k];
    }
  }
#pragma unroll
  for (int p = 0; p < T::kPasses; ++p) {
    const int r = p * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
    const int64_t gr = row0 + r, gc = col0 + seg * kSeg;
    Vec<OutT, kSeg> y;
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      if constexpr (kCast) {
        const float f = to_float(x[p].v[k]);
        const bool inside = kAligned ? (gr < rows && gc < cols) : (gr < rows && gc + k < cols);
        if (inside) amax = amax_step(amax, f);
        y.v[k] = from_float<OutT>(f * scale);
      } else {
        y.v[k] = x[p].v[k];
      }
    }
    const int chunk = seg ^ ((r / kSeg) % kSegsPerRow);
    y.store(&smem[r][chunk * kSeg]);
    OutT* dst = out == nullptr ? nullptr : out + gr * cols + gc;
    if (dst != nullptr) {
      if (kAligned) {
        if (gr < rows && gc < cols) y.store(dst);
      } else {
#pragma unroll
        for (int k = 0; k < kSeg; ++k)
          if (gr < rows && gc + k < cols) dst[k] = y.v[k];
      }
    }
  }
  __syncthreads();

  // Phase 2: thread (group g = tid % 8, column c) gathers rows g*kSeg .. g*kSeg+kSeg-1.
  const int g = threadIdx.x % kSegsPerRow;
#pragma unroll
  for (int p = 0; p < T::kPasses; ++p) {
    const int c = p * T::kRowsPerPass + threadIdx.x / kSegsPerRow;
    const int chunk = (c / kSeg) ^ g;
    Vec<OutT, kSeg> y;
#pragma unroll
    for (int k = 0; k < kSeg; ++k) y.v[k] = smem[g * kSeg + k][chunk * kSeg + c % kSeg];
    const int64_t gc = col0 + c, gr = row0 + g * kSeg;
    OutT* dst = out_t + gc * rows + gr;
    if (kAligned) {
      if (gc < cols && gr < rows) y.store(dst);
    } else {
#pragma unroll
      for (int k = 0; k < kSeg; ++k)
        if (gc < cols && gr + k < rows) dst[k] = y.v[k];
    }
  }

  if (kCast && amax_ptr != nullptr) {
    amax = block_reduce_max(amax, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax_ptr, amax);
  }
}

template <typename InT, typename OutT, bool kCast>
void launch_transpose(const InT* in, OutT* out, OutT* out_t, int64_t rows, int64_t cols,
                      const float* scale, float* amax, float* scale_inv, cudaStream_t stream) {
  using T = Tile<OutT>;
  const int64_t tiles = ((rows + T::kDim - 1) / T::kDim) * ((cols + T::kDim - 1) / T::kDim);
  TE_CHECK_ARG(tiles < (int64_t(1) << 31), "tensor of ", rows, " x ", cols, " is too large");
  if (tiles == 0) {
    // An empty tensor still gets its scale_inv written; the one block touches no data.
    if (kCast)
      transpose_kernel<InT, OutT, kCast, false><<<1, kThreads, 0, stream>>>(
          in, out, out_t, 0, 0, scale, amax, scale_inv);
    check_launch("transpose_kernel");
    return;
  }
  const bool aligned = rows % T::kSeg == 0 && cols % T::kSeg == 0 && aligned16(in) &&
                       aligned16(out_t) && (out == nullptr || aligned16(out));
  if (aligned)
    transpose_kernel<InT, OutT, kCast, true><<<unsigned(tiles), kThreads, 0, stream>>>(
        in, out, out_t, rows, cols, scale, amax, scale_inv);
  else
    transpose_kernel<InT, OutT, kCast, false><<<unsigned(tiles), kThreads, 0, stream>>>(
        in, out, out_t, rows, cols, scale, amax, scale_inv);
  check_launch("transpose_kernel");
}

void check_transposed_shape(const NVTETensor& t, int64_t rows, int64_t cols, const char* what) {
  TE_CHECK_ARG(t.ndim == 2 && t.shape[0] == cols && t.shape[1] == rows, what, " has shape ",
               shape_str(t), "; expected [", cols, ", ", rows, "]");
}

}  // namespace
}  // namespace te

using namespace te;

extern "C" NVTEStatus nvte_transpose(const NVTETensor* input, NVTETensor* output,
                                     NVTEStream stream) {
  return guard("nvte_transpose", [&] {
    check_tensor(input, "input");
    check_tensor(output, "output");
    int64_t rows, cols;
    as_2d(*input, &rows, &cols);
    check_transposed_shape(*output, rows, cols, "output");
    TE_CHECK_ARG(output->dtype == input->dtype, "output has dtype ", nvte_dtype_name(output->dtype),
                 "; expected the input's dtype ", nvte_dtype_name(input->dtype));
    void* null_out = nullptr;
    switch (nvte_dtype_size(input->dtype)) {
      case 1: launch_transpose<uint8_t, uint8_t, false>(
                  static_cast<const uint8_t*>(input->data), static_cast<uint8_t*>(null_out),
                  static_cast<uint8_t*>(output->data), rows, cols, nullptr, nullptr, nullptr,
                  to_stream(stream)); break;
      case 2: launch_transpose<uint16_t, uint16_t, false>(
                  static_cast<const uint16_t*>(input->data), static_cast<uint16_t*>(null_out),
                  static_cast<uint16_t*>(output->data), rows, cols, nullptr, nullptr, nullptr,
                  to_stream(stream)); break;
      case 4: launch_transpose<uint32_t, uint32_t, false>(
                  static_cast<const uint32_t*>(input->data), static_cast<uint32_t*>(null_out),
                  static_cast<uint32_t*>(output->data), rows, cols, nullptr, nullptr, nullptr,
                  to_stream(stream)); break;
      default:
        TE_UNSUPPORTED("input dtype ", nvte_dtype_name(input->dtype),
                       " is not supported; expected a 1, 2 or 4-byte dtype");
    }
  });
}

extern "C" NVTEStatus nvte_cast_transpose(const NVTETensor* input, NVTETensor* output,
                                          NVTETensor* output_t, NVTEStream stream) {
  return guard("nvte_cast_transpose", [&] {
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_tensor(output_t, "output_t");
    int64_t rows, cols;
    as_2d(*input, &rows, &cols);
    TE_CHECK_ARG(numel(*output) == rows * cols, "output has shape ", shape_str(*output),
                 "; expected as many elements as input ", shape_str(*input));
    check_transposed_shape(*output_t, rows, cols, "output_t");
    TE_CHECK_ARG(output_t->dtype == output->dtype, "output_t has dtype ",
                 nvte_dtype_name(output_t->dtype), "; expected the output's dtype ",
                 nvte_dtype_name(output->dtype));
    check_fp8_scaling(*output, "output", true);
    TE_SWITCH_HP(input->dtype, InT, "input",
      TE_SWITCH_FP8(output->dtype, OutT, "output",
        launch_transpose<InT, OutT, true>(
            static_cast<const InT*>(input->data), static_cast<OutT*>(output->data),
            static_cast<OutT*>(output_t->data), rows, cols, output->scale, output->amax,
            output->scale_inv, to_stream(stream))));
  });
}
