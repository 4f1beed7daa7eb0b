// C entry points of the activation family: argument checks, the dbias workspace protocol, the
// op-independent dbias column reduction, and dispatch to the per-activation instantiations.
//
// This file sees the kernels only through activation_launch.h, so none of them is compiled here.
#include "activation/activation_launch.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace act {

int elementwise_grid(int64_t work_items) {
  // A few waves of resident blocks; the kernels are grid-stride, so more blocks only add
  // scheduling overhead, fewer leave bandwidth unused.
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t cap = int64_t(sms) * 16;
  const int64_t blocks = (work_items + kActThreads - 1) / kActThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

int64_t dbias_rows_per_block(int64_t rows) {
  // At least 64 rows so that the partial sums stay a small fraction of the traffic; more when
  // there are many rows so that at most ~1024 partial rows exist. A multiple of the rows one
  // block walks per step (8 row threads x 4 unrolled).
  constexpr int64_t kStep = kDbiasRowThreads * kDbiasRowUnroll;
  int64_t per = (rows + 1023) / 1024;
  per = per < 64 ? 64 : per;
  return (per + kStep - 1) / kStep * kStep;
}

int64_t dbias_row_blocks(int64_t rows) {
  const int64_t per = dbias_rows_per_block(rows);
  return (rows + per - 1) / per;
}

void check_act(NVTEActivation act) {
  TE_CHECK_ARG(act >= 0 && act < kNVTENumActivations, "activation code ", int(act),
               " is invalid; expected 0..", int(kNVTENumActivations) - 1);
}

int64_t gated_width(const NVTETensor& in, int64_t cols) {
  TE_CHECK_ARG(in.ndim >= 1 && cols % 2 == 0, "input has shape ", shape_str(in),
               "; a gated activation expects an even last dimension [..., 2*N]");
  return cols / 2;
}

namespace {

constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 16;
constexpr int kReduceUnroll = 4;

template <typename BiasT>
__global__ void __launch_bounds__(kReduceCols * kReduceLanes)
dbias_reduce_kernel(const float* __restrict__ partial, BiasT* __restrict__ dbias,
                    int64_t row_blocks, int64_t cols) {
  __shared__ float sums[kReduceLanes][kReduceCols + 1];
  wait_for_previous_grid();  // an overlapping launch: the first stage's partials are complete
  const int tx = threadIdx.x % kReduceCols, ty = threadIdx.x / kReduceCols;
  const int64_t c = int64_t(blockIdx.x) * kReduceCols + tx;
  float acc = 0.f;
  if (c < cols) {
    int64_t b = ty;
    // Independent loads first, then the adds, so that several reads are in flight per lane.
    for (; b + (kReduceUnroll - 1) * kReduceLanes < row_blocks; b += kReduceUnroll * kReduceLanes) {
      float v[kReduceUnroll];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) v[u] = partial[(b + u * kReduceLanes) * cols + c];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) acc += v[u];
    }
    for (; b < row_blocks; b += kReduceLanes) acc += partial[b * cols + c];
  }
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float s = 0.f;
#pragma unroll
    for (int t = 0; t < kReduceLanes; ++t) s += sums[t][tx];
    dbias[c] = from_float<BiasT>(s);
  }
}

}  // namespace

void launch_dbias_reduce(const float* partial, void* dbias, NVTEDType dbias_dtype,
                         int64_t row_blocks, int64_t cols, NVTEStream s, bool overlapping) {
  if (cols == 0) return;
  cudaStream_t stream = to_stream(s);
  const int64_t grid = (cols + kReduceCols - 1) / kReduceCols;
  TE_CHECK_ARG(grid < (int64_t(1) << 31), "dbias of ", cols, " columns is too large");
  TE_SWITCH_HP(dbias_dtype, BiasT, "dbias",
    if (overlapping) {
      launch_overlapping(dbias_reduce_kernel<BiasT>, dim3(unsigned(grid)),
                         dim3(kReduceCols * kReduceLanes), stream, partial,
                         static_cast<BiasT*>(dbias), row_blocks, cols);
    } else {
      dbias_reduce_kernel<BiasT><<<unsigned(grid), kReduceCols * kReduceLanes, 0, stream>>>(
          partial, static_cast<BiasT*>(dbias), row_blocks, cols);
    });
  check_launch("dbias_reduce_kernel");
}

bool dbias_workspace_query_or_check(NVTETensor* workspace, int64_t ws_rows, int64_t cols) {
  if (workspace->data == nullptr && workspace->ndim == 0) {
    workspace->dtype = kNVTEFloat32;
    workspace->ndim = 2;
    workspace->shape[0] = ws_rows;
    workspace->shape[1] = cols;
    return true;
  }
  check_tensor(workspace, "workspace");
  TE_CHECK_ARG(workspace->dtype == kNVTEFloat32 && numel(*workspace) >= ws_rows * cols,
               "workspace has dtype ", nvte_dtype_name(workspace->dtype), " and shape ",
               shape_str(*workspace), "; expected float32 with at least ", ws_rows * cols,
               " elements (query the size with a null workspace pointer)");
  TE_CHECK_ARG(aligned16(workspace->data) || ws_rows * cols == 0,
               "workspace pointer is not 16-byte aligned");
  return false;
}

namespace {

// Output: the input's dtype, or FP8 with a scale.
void check_output_dtype(const NVTETensor& in, const NVTETensor& out, const char* what) {
  const bool fp8 = is_fp8(out.dtype);
  TE_CHECK_ARG(out.dtype == in.dtype || fp8, what, " has dtype ", nvte_dtype_name(out.dtype),
               "; expected ", nvte_dtype_name(in.dtype), " (the input's) or an FP8 dtype");
  if (fp8) check_fp8_scaling(out, what, true);
}

void check_same_dtype(const NVTETensor& grad, const NVTETensor& in) {
  TE_CHECK_ARG(grad.dtype == in.dtype, "grad has dtype ", nvte_dtype_name(grad.dtype),
               "; expected the input's dtype ", nvte_dtype_name(in.dtype));
}

void check_numel(const NVTETensor& t, int64_t want, const char* what, const NVTETensor& ref,
                 const char* ref_what) {
  TE_CHECK_ARG(numel(t) == want, what, " has shape ", shape_str(t), "; expected ", want,
               " elements to match ", ref_what, " ", shape_str(ref));
}

void run_elementwise(NVTEActivation act, const ElementwiseArgs& a) {
  // Empty high-precision outputs need no launch; an FP8 one still gets its scale_inv written.
  if (a.rows * a.cols == 0 && !is_fp8(a.out_dtype)) return;
  switch (act) {
    case kNVTEGelu: launch_elementwise<kNVTEGelu>(a); break;
    case kNVTERelu: launch_elementwise<kNVTERelu>(a); break;
    case kNVTEQGelu: launch_elementwise<kNVTEQGelu>(a); break;
    case kNVTESRelu: launch_elementwise<kNVTESRelu>(a); break;
    case kNVTESilu: launch_elementwise<kNVTESilu>(a); break;
    case kNVTESigmoid: launch_elementwise<kNVTESigmoid>(a); break;
    default: check_act(act);
  }
}

ElementwiseArgs make_args(Kind kind, const NVTETensor* grad, const NVTETensor& in,
                          const NVTETensor& out, int64_t rows, int64_t cols, NVTEStream stream) {
  ElementwiseArgs a{};
  a.kind = kind;
  a.grad = grad != nullptr ? grad->data : nullptr;
  a.input = in.data;
  a.output = out.data;
  a.rows = rows;
  a.cols = cols;
  a.in_dtype = in.dtype;
  a.out_dtype = out.dtype;
  a.scale = out.scale;
  a.amax = out.amax;
  a.scale_inv = out.scale_inv;
  a.stream = stream;
  return a;
}

}  // namespace
}  // namespace act
}  // namespace te

using namespace te;
using namespace te::act;

extern "C" const char* nvte_activation_name(NVTEActivation act) {
  switch (act) {
    case kNVTEGelu: return "gelu";
    case kNVTERelu: return "relu";
    case kNVTEQGelu: return "qgelu";
    case kNVTESRelu: return "srelu";
    case kNVTESilu: return "silu";
    case kNVTESigmoid: return "sigmoid";
    default: return "invalid";
  }
}

extern "C" NVTEStatus nvte_activation(NVTEActivation act, const NVTETensor* input,
                                      NVTETensor* output, NVTEStream stream) {
  return guard("nvte_activation", [&] {
    check_act(act);
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    check_output_dtype(*input, *output, "output");
    check_numel(*output, numel(*input), "output", *input, "input");
    run_elementwise(act, make_args(Kind::kForward, nullptr, *input, *output, 1, numel(*input),
                                   stream));
  });
}

extern "C" NVTEStatus nvte_dactivation(NVTEActivation act, const NVTETensor* grad,
                                       const NVTETensor* input, NVTETensor* output,
                                       NVTEStream stream) {
  return guard("nvte_dactivation", [&] {
    check_act(act);
    check_tensor(grad, "grad");
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    check_same_dtype(*grad, *input);
    check_output_dtype(*input, *output, "output");
    check_numel(*grad, numel(*input), "grad", *input, "input");
    check_numel(*output, numel(*input), "output", *input, "input");
    run_elementwise(act, make_args(Kind::kBackward, grad, *input, *output, 1, numel(*input),
                                   stream));
  });
}

extern "C" NVTEStatus nvte_gated_activation(NVTEActivation act, const NVTETensor* input,
                                            NVTETensor* output, NVTEStream stream) {
  return guard("nvte_gated_activation", [&] {
    check_act(act);
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    check_output_dtype(*input, *output, "output");
    int64_t rows, cols, out_rows, out_cols;
    as_2d(*input, &rows, &cols);
    as_2d(*output, &out_rows, &out_cols);
    const int64_t n = gated_width(*input, cols);
    TE_CHECK_ARG(out_rows == rows && out_cols == n, "output has shape ", shape_str(*output),
                 "; expected [..., ", n, "] with the input's ", rows, " rows (input ",
                 shape_str(*input), ")");
    run_elementwise(act, make_args(Kind::kGatedForward, nullptr, *input, *output, rows, n, stream));
  });
}

extern "C" NVTEStatus nvte_dgated_activation(NVTEActivation act, const NVTETensor* grad,
                                             const NVTETensor* input, NVTETensor* output,
                                             NVTEStream stream) {
  return guard("nvte_dgated_activation", [&] {
    check_act(act);
    check_tensor(grad, "grad");
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    check_same_dtype(*grad, *input);
    check_output_dtype(*input, *output, "output");
    int64_t rows, cols, g_rows, g_cols;
    as_2d(*input, &rows, &cols);
    as_2d(*grad, &g_rows, &g_cols);
    const int64_t n = gated_width(*input, cols);
    TE_CHECK_ARG(g_rows == rows && g_cols == n, "grad has shape ", shape_str(*grad),
                 "; expected [..., ", n, "] with the input's ", rows, " rows (input ",
                 shape_str(*input), ")");
    check_numel(*output, numel(*input), "output", *input, "input");
    run_elementwise(act, make_args(Kind::kGatedBackward, grad, *input, *output, rows, n, stream));
  });
}

extern "C" NVTEStatus nvte_dbias_dactivation(NVTEActivation act, const NVTETensor* grad,
                                             const NVTETensor* input, NVTETensor* output,
                                             NVTETensor* dbias, NVTETensor* workspace,
                                             NVTEStream stream) {
  return guard("nvte_dbias_dactivation", [&] {
    check_act(act);
    check_tensor(grad, "grad");
    check_tensor(input, "input");
    check_tensor(output, "output");
    check_tensor(dbias, "dbias");
    TE_CHECK_ARG(workspace != nullptr, "workspace is a null descriptor");
    check_dtype_in(*input, "input", is_high_precision(input->dtype), "float32, float16 or bfloat16");
    check_same_dtype(*grad, *input);
    check_output_dtype(*input, *output, "output");
    check_dtype_in(*dbias, "dbias", is_high_precision(dbias->dtype), "float32, float16 or bfloat16");
    int64_t rows, cols;
    as_2d(*input, &rows, &cols);
    check_numel(*grad, rows * cols, "grad", *input, "input");
    check_numel(*output, rows * cols, "output", *input, "input");
    TE_CHECK_ARG(numel(*dbias) == cols, "dbias has shape ", shape_str(*dbias), "; expected [",
                 cols, "] (the input's last dimension)");

    const int64_t ws_rows = dbias_row_blocks(rows);
    if (dbias_workspace_query_or_check(workspace, ws_rows, cols)) return;

    DbiasArgs a{};
    a.grad = grad->data;
    a.input = input->data;
    a.output = output->data;
    a.rows = rows;
    a.cols = cols;
    a.in_dtype = input->dtype;
    a.out_dtype = output->dtype;
    a.scale = output->scale;
    a.amax = output->amax;
    a.scale_inv = output->scale_inv;
    a.dbias = dbias->data;
    a.dbias_dtype = dbias->dtype;
    a.workspace = static_cast<float*>(workspace->data);
    a.stream = stream;
    switch (act) {
      case kNVTEGelu: launch_dbias<kNVTEGelu>(a); break;
      case kNVTERelu: launch_dbias<kNVTERelu>(a); break;
      case kNVTEQGelu: launch_dbias<kNVTEQGelu>(a); break;
      case kNVTESRelu: launch_dbias<kNVTESRelu>(a); break;
      case kNVTESilu: launch_dbias<kNVTESilu>(a); break;
      case kNVTESigmoid: launch_dbias<kNVTESigmoid>(a); break;
      default: check_act(act);
    }
  });
}

// Named entry points: each forwards to the generic call with its activation.
#define TE_DEFINE_NAMED_ACTIVATION(name, gated_name, A)                                         \
  extern "C" NVTEStatus nvte_##name(const NVTETensor* input, NVTETensor* output,              \
                                    NVTEStream stream) {                                        \
    return nvte_activation(A, input, output, stream);                                           \
  }                                                                                             \
  extern "C" NVTEStatus nvte_d##name(const NVTETensor* grad, const NVTETensor* input,         \
                                     NVTETensor* output, NVTEStream stream) {                   \
    return nvte_dactivation(A, grad, input, output, stream);                                    \
  }                                                                                             \
  extern "C" NVTEStatus nvte_##gated_name(const NVTETensor* input, NVTETensor* output,        \
                                          NVTEStream stream) {                                  \
    return nvte_gated_activation(A, input, output, stream);                                     \
  }                                                                                             \
  extern "C" NVTEStatus nvte_d##gated_name(const NVTETensor* grad, const NVTETensor* input,   \
                                           NVTETensor* output, NVTEStream stream) {             \
    return nvte_dgated_activation(A, grad, input, output, stream);                              \
  }                                                                                             \
  extern "C" NVTEStatus nvte_dbias_d##name(const NVTETensor* grad, const NVTETensor* input,   \
                                           NVTETensor* output, NVTETensor* dbias,               \
                                           NVTETensor* workspace, NVTEStream stream) {          \
    return nvte_dbias_dactivation(A, grad, input, output, dbias, workspace, stream);            \
  }
TE_DEFINE_NAMED_ACTIVATION(gelu, geglu, kNVTEGelu)
TE_DEFINE_NAMED_ACTIVATION(relu, reglu, kNVTERelu)
TE_DEFINE_NAMED_ACTIVATION(qgelu, qgeglu, kNVTEQGelu)
TE_DEFINE_NAMED_ACTIVATION(srelu, sreglu, kNVTESRelu)
TE_DEFINE_NAMED_ACTIVATION(silu, swiglu, kNVTESilu)
TE_DEFINE_NAMED_ACTIVATION(sigmoid, glu, kNVTESigmoid)
