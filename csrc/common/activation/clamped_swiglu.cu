// Clamped SwiGLU (nvte_clamped_swiglu / nvte_clamped_dswiglu; formula in activation.h).
//
// Its two run-time parameters (limit, alpha) and the transform of the linear half (clamp, + 1)
// do not fit the static functors that the other activations share, so it has its own two
// kernels here, grid-stride loops over the N output (forward) or grad (backward) elements of
// each row, with the FP8 output cast and amax of the other kernels (OutputCast).
#include "activation/activation_kernels.cuh"

namespace te {
namespace act {
namespace {

struct ClampedSwiglu {
  float limit, alpha;
  // a' sigmoid(alpha a') with a' = min(a, limit)
  __device__ float gate(float a) const {
    const float c = fminf(a, limit);
    return c * sigmoid(alpha * c);
  }
  // d/da of gate(a): zero above the limit, where the clamp holds a' constant
  __device__ float dgate(float a) const {
    if (a > limit) return 0.f;
    const float s = sigmoid(alpha * a);
    return s + alpha * a * s * (1.f - s);
  }
  __device__ float linear(float b) const { return fminf(fmaxf(b, -limit), limit) + 1.f; }
  __device__ float dlinear(float b) const { return (b < -limit || b > limit) ? 0.f : 1.f; }
};

template <typename InT, typename OutT>
__global__ void __launch_bounds__(kThreads)
clamped_swiglu_fwd_kernel(const InT* __restrict__ in, OutT* __restrict__ out, int64_t rows,
                          int64_t n, ClampedSwiglu op, const float* __restrict__ scale_ptr,
                          float* __restrict__ amax_ptr, float* __restrict__ scale_inv_ptr) {
  OutputCast<OutT> cast(scale_ptr, scale_inv_ptr);
  const int64_t total = rows * n;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = o + div_index(o, n) * n;  // row r's input starts at 2 n r
    out[o] = cast(op.gate(to_float(in[i])) * op.linear(to_float(in[i + n])));
  }
  cast.publish_amax(amax_ptr);
}

template <typename InT, typename OutT>
__global__ void __launch_bounds__(kThreads)
clamped_swiglu_bwd_kernel(const InT* __restrict__ grad, const InT* __restrict__ in,
                          OutT* __restrict__ out, int64_t rows, int64_t n, ClampedSwiglu op,
                          const float* __restrict__ scale_ptr, float* __restrict__ amax_ptr,
                          float* __restrict__ scale_inv_ptr) {
  OutputCast<OutT> cast(scale_ptr, scale_inv_ptr);
  const int64_t total = rows * n;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = o + div_index(o, n) * n;
    const float dy = to_float(grad[o]);
    const float a = to_float(in[i]), b = to_float(in[i + n]);
    out[i] = cast(dy * op.linear(b) * op.dgate(a));
    out[i + n] = cast(dy * op.gate(a) * op.dlinear(b));
  }
  cast.publish_amax(amax_ptr);
}

void check_params(float limit, float alpha) {
  TE_CHECK_ARG(limit > 0.f && limit < INFINITY, "limit is ", limit,
               "; expected a finite positive value");
  TE_CHECK_ARG(alpha > -INFINITY && alpha < INFINITY, "alpha is ", alpha, "; expected a finite value");
}

// Shapes: input [rows, 2n]; forward output [rows, n]; backward grad [rows, n], dx [rows, 2n].
void check_gated(const NVTETensor* grad, const NVTETensor* input, const NVTETensor* output,
                 int64_t* rows, int64_t* n) {
  if (grad != nullptr) check_tensor(grad, "grad");
  check_tensor(input, "input");
  check_tensor(output, "output");
  check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
  TE_CHECK_ARG(output->dtype == input->dtype || is_fp8(output->dtype), "output has dtype ",
               nvte_dtype_name(output->dtype), "; expected ", nvte_dtype_name(input->dtype),
               " (the input's) or an FP8 dtype");
  if (is_fp8(output->dtype)) check_fp8_scaling(*output, "output", true);
  int64_t cols;
  as_2d(*input, rows, &cols);
  *n = gated_width(*input, cols);
  const NVTETensor& half = grad != nullptr ? *grad : *output;
  const char* half_name = grad != nullptr ? "grad" : "output";
  int64_t h_rows, h_cols;
  as_2d(half, &h_rows, &h_cols);
  TE_CHECK_ARG(h_rows == *rows && h_cols == *n, half_name, " has shape ", shape_str(half),
               "; expected [..., ", *n, "] with the input's ", *rows, " rows (input ",
               shape_str(*input), ")");
  if (grad != nullptr) {
    TE_CHECK_ARG(grad->dtype == input->dtype, "grad has dtype ", nvte_dtype_name(grad->dtype),
                 "; expected the input's dtype ", nvte_dtype_name(input->dtype));
    TE_CHECK_ARG(numel(*output) == numel(*input), "output has shape ", shape_str(*output),
                 "; expected ", numel(*input), " elements to match input ", shape_str(*input));
  }
}

}  // namespace
}  // namespace act
}  // namespace te

using namespace te;
using namespace te::act;

extern "C" NVTEStatus nvte_clamped_swiglu(const NVTETensor* input, NVTETensor* output, float limit,
                                          float alpha, NVTEStream stream) {
  return guard("nvte_clamped_swiglu", [&] {
    check_params(limit, alpha);
    int64_t rows, n;
    check_gated(nullptr, input, output, &rows, &n);
    if (rows * n == 0 && !is_fp8(output->dtype)) return;
    const ClampedSwiglu op{limit, alpha};
    TE_ACT_SWITCH_OUT(input->dtype, output->dtype, InT, OutT,
      clamped_swiglu_fwd_kernel<InT, OutT><<<elementwise_grid(rows * n), kThreads, 0,
                                              to_stream(stream)>>>(
          static_cast<const InT*>(input->data), static_cast<OutT*>(output->data), rows, n, op,
          output->scale, output->amax, output->scale_inv));
    check_launch("clamped_swiglu_fwd_kernel");
  });
}

extern "C" NVTEStatus nvte_clamped_dswiglu(const NVTETensor* grad, const NVTETensor* input,
                                           NVTETensor* output, float limit, float alpha,
                                           NVTEStream stream) {
  return guard("nvte_clamped_dswiglu", [&] {
    check_params(limit, alpha);
    TE_CHECK_ARG(grad != nullptr, "grad is a null descriptor");
    int64_t rows, n;
    check_gated(grad, input, output, &rows, &n);
    if (rows * n == 0 && !is_fp8(output->dtype)) return;
    const ClampedSwiglu op{limit, alpha};
    TE_ACT_SWITCH_OUT(input->dtype, output->dtype, InT, OutT,
      clamped_swiglu_bwd_kernel<InT, OutT><<<elementwise_grid(rows * n), kThreads, 0,
                                              to_stream(stream)>>>(
          static_cast<const InT*>(grad->data), static_cast<const InT*>(input->data),
          static_cast<OutT*>(output->data), rows, n, op, output->scale, output->amax,
          output->scale_inv));
    check_launch("clamped_swiglu_bwd_kernel");
  });
}
