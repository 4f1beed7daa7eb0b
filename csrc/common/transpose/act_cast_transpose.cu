// C entry points of the activation fusions of cast+transpose: argument checks, the dbias
// workspace protocol, dispatch to the per-activation instantiations (act_cast_transpose_*.cu)
// and the dbias column reduction shared with the activation family.
#include "activation/activation_launch.h"
#include "transformer_engine/transpose.h"
#include "transpose/fused_launch.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace tile_transpose {
namespace {

using act::check_act;
using act::gated_width;

void run(NVTEActivation act, const ActTransposeArgs& a) {
  switch (act) {
    case kNVTEGelu: launch_act_cast_transpose<kNVTEGelu>(a); break;
    case kNVTERelu: launch_act_cast_transpose<kNVTERelu>(a); break;
    case kNVTEQGelu: launch_act_cast_transpose<kNVTEQGelu>(a); break;
    case kNVTESRelu: launch_act_cast_transpose<kNVTESRelu>(a); break;
    case kNVTESilu: launch_act_cast_transpose<kNVTESilu>(a); break;
    case kNVTESigmoid: launch_act_cast_transpose<kNVTESigmoid>(a); break;
    default: check_act(act);
  }
}

// The checks every fused op shares. `rows` x `cols` is the shape the FP8 result must have;
// output may have any shape with that many elements, output_t must be [cols, rows].
void check_outputs(const NVTETensor* output, const NVTETensor* output_t, int64_t rows,
                   int64_t cols) {
  check_tensor(output, "output");
  check_tensor(output_t, "output_t");
  check_dtype_in(*output, "output", is_fp8(output->dtype), "float8_e4m3 or float8_e5m2");
  check_fp8_scaling(*output, "output", true);
  TE_CHECK_ARG(numel(*output) == rows * cols, "output has shape ", shape_str(*output),
               "; expected ", rows * cols, " elements ([", rows, ", ", cols, "])");
  TE_CHECK_ARG(output_t->ndim == 2 && output_t->shape[0] == cols && output_t->shape[1] == rows,
               "output_t has shape ", shape_str(*output_t), "; expected [", cols, ", ", rows, "]");
  TE_CHECK_ARG(output_t->dtype == output->dtype, "output_t has dtype ",
               nvte_dtype_name(output_t->dtype), "; expected the output's dtype ",
               nvte_dtype_name(output->dtype));
}

void check_input(const NVTETensor* input, const char* what) {
  check_tensor(input, what);
  check_dtype_in(*input, what, is_high_precision(input->dtype), "float32, float16 or bfloat16");
}

ActTransposeArgs make_args(ActKind kind, const NVTETensor* grad, const NVTETensor& in,
                           const NVTETensor& out, const NVTETensor& out_t, int64_t rows,
                           int64_t cols, NVTEStream stream) {
  ActTransposeArgs a{};
  a.kind = kind;
  a.grad = grad == nullptr ? nullptr : grad->data;
  a.input = in.data;
  a.output = out.data;
  a.output_t = out_t.data;
  a.rows = rows;
  a.cols = cols;
  a.in_dtype = in.dtype;
  a.out_dtype = out.dtype;
  a.scale = out.scale;
  a.amax = out.amax;
  a.scale_inv = out.scale_inv;
  a.partial = nullptr;
  a.dbias = nullptr;
  a.dbias_dtype = kNVTEFloat32;
  a.stream = stream;
  return a;
}

NVTEStatus forward(const char* op, NVTEActivation act, bool gated, const NVTETensor* input,
                   NVTETensor* output, NVTETensor* output_t, NVTEStream stream) {
  return guard(op, [&] {
    check_act(act);
    check_input(input, "input");
    int64_t rows, cols;
    as_2d(*input, &rows, &cols);
    if (gated) cols = gated_width(*input, cols);
    check_outputs(output, output_t, rows, cols);
    run(act, make_args(gated ? ActKind::kGatedForward : ActKind::kForward, nullptr, *input,
                       *output, *output_t, rows, cols, stream));
  });
}

NVTEStatus backward(const char* op, NVTEActivation act, bool gated, const NVTETensor* grad,
                    const NVTETensor* input, NVTETensor* output, NVTETensor* output_t,
                    NVTETensor* dbias, NVTETensor* workspace, NVTEStream stream) {
  return guard(op, [&] {
    check_act(act);
    check_input(input, "input");
    check_tensor(grad, "grad");
    TE_CHECK_ARG(grad->dtype == input->dtype, "grad has dtype ", nvte_dtype_name(grad->dtype),
                 "; expected the input's dtype ", nvte_dtype_name(input->dtype));
    int64_t rows, cols, g_rows, g_cols;
    as_2d(*input, &rows, &cols);
    as_2d(*grad, &g_rows, &g_cols);
    const int64_t want_g_cols = gated ? gated_width(*input, cols) : cols;
    TE_CHECK_ARG(g_rows == rows && g_cols == want_g_cols, "grad has shape ", shape_str(*grad),
                 "; expected [..., ", want_g_cols, "] with the input's ", rows, " rows (input ",
                 shape_str(*input), ")");
    check_outputs(output, output_t, rows, cols);
    ActTransposeArgs a = make_args(gated ? ActKind::kGatedBackward : ActKind::kBackward, grad,
                                   *input, *output, *output_t, rows, cols, stream);
    if (dbias != nullptr) {
      if (check_dbias(dbias, workspace, rows, cols)) return;
      a.partial = static_cast<float*>(workspace->data);
      if (dbias_sums_are_final(rows)) {
        a.dbias = dbias->data;
        a.dbias_dtype = dbias->dtype;
      }
    }
    run(act, a);
    if (dbias != nullptr && a.dbias == nullptr)
      act::launch_dbias_reduce(a.partial, dbias->data, dbias->dtype, dbias_workspace_rows(rows),
                               cols, stream);
  });
}

}  // namespace
}  // namespace tile_transpose
}  // namespace te

using namespace te::tile_transpose;

extern "C" NVTEStatus nvte_act_cast_transpose(NVTEActivation act, const NVTETensor* input,
                                              NVTETensor* output, NVTETensor* output_t,
                                              NVTEStream stream) {
  return forward("nvte_act_cast_transpose", act, false, input, output, output_t, stream);
}

extern "C" NVTEStatus nvte_gated_act_cast_transpose(NVTEActivation act, const NVTETensor* input,
                                                    NVTETensor* output, NVTETensor* output_t,
                                                    NVTEStream stream) {
  return forward("nvte_gated_act_cast_transpose", act, true, input, output, output_t, stream);
}

extern "C" NVTEStatus nvte_dact_dbias_cast_transpose(NVTEActivation act, const NVTETensor* grad,
                                                     const NVTETensor* act_input,
                                                     NVTETensor* output, NVTETensor* output_t,
                                                     NVTETensor* dbias, NVTETensor* workspace,
                                                     NVTEStream stream) {
  return backward("nvte_dact_dbias_cast_transpose", act, false, grad, act_input, output, output_t,
                  dbias, workspace, stream);
}

extern "C" NVTEStatus nvte_dgated_act_dbias_cast_transpose(
    NVTEActivation act, const NVTETensor* grad, const NVTETensor* act_input, NVTETensor* output,
    NVTETensor* output_t, NVTETensor* dbias, NVTETensor* workspace, NVTEStream stream) {
  return backward("nvte_dgated_act_dbias_cast_transpose", act, true, grad, act_input, output,
                  output_t, dbias, workspace, stream);
}
