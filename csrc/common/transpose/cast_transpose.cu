// Transpose, FP8 cast+transpose and cast+transpose+dbias of a [rows, cols] row-major tensor,
// all on the tile engine of tile_transpose.cuh with the copy producer.
#include <cmath>

#include "activation/activation_launch.h"
#include "recipe/current_scaling.h"
#include "transformer_engine/transpose.h"
#include "transpose/fused_launch.h"
#include "transpose/tile_transpose.cuh"
#include "util/row_kernels.cuh"
#include "util/stream_capture.h"

namespace te {
namespace tile_transpose {

int64_t dbias_workspace_rows(int64_t rows) { return fp8_row_tiles(rows); }

bool dbias_sums_are_final(int64_t rows) { return dbias_workspace_rows(rows) == 1; }

bool check_dbias(const NVTETensor* dbias, NVTETensor* workspace, int64_t rows, int64_t cols) {
  check_tensor(dbias, "dbias");
  check_dtype_in(*dbias, "dbias", is_high_precision(dbias->dtype), "float32, float16 or bfloat16");
  TE_CHECK_ARG(numel(*dbias) == cols, "dbias has shape ", shape_str(*dbias), "; expected [", cols,
               "] (the input's last dimension)");
  TE_CHECK_ARG(workspace != nullptr, "workspace is a null descriptor");
  return act::dbias_workspace_query_or_check(workspace, dbias_workspace_rows(rows), cols);
}

namespace {

template <typename T>
void launch_copy_transpose(const void* in, void* out_t, int64_t rows, int64_t cols,
                           NVTEStream stream) {
  CopyProducer<T> prod{static_cast<const T*>(in), cols};
  launch_tiles<CopyProducer<T>, T, false, false>(prod, nullptr, static_cast<T*>(out_t), rows,
                                                 cols, nullptr, nullptr, nullptr, nullptr,
                                                 to_stream(stream));
}

void check_transposed_shape(const NVTETensor& t, int64_t rows, int64_t cols, const char* what) {
  TE_CHECK_ARG(t.ndim == 2 && t.shape[0] == cols && t.shape[1] == rows, what, " has shape ",
               shape_str(t), "; expected [", cols, ", ", rows, "]");
}

// Checks shared by cast_transpose and cast_transpose_dbias; returns the 2-D view of input.
void check_cast_transpose_args(const NVTETensor* input, NVTETensor* output, NVTETensor* output_t,
                               int64_t* rows, int64_t* cols) {
  check_tensor(input, "input");
  check_tensor(output, "output");
  check_tensor(output_t, "output_t");
  as_2d(*input, rows, cols);
  TE_CHECK_ARG(numel(*output) == *rows * *cols, "output has shape ", shape_str(*output),
               "; expected as many elements as input ", shape_str(*input));
  check_transposed_shape(*output_t, *rows, *cols, "output_t");
  TE_CHECK_ARG(output_t->dtype == output->dtype, "output_t has dtype ",
               nvte_dtype_name(output_t->dtype), "; expected the output's dtype ",
               nvte_dtype_name(output->dtype));
  check_fp8_scaling(*output, "output", true);
}

// The cast + transpose of the input's rows [row_begin, row_begin + rows) (all of them by
// default): a band of rows lands in the same rows of output and the same columns of output_t,
// whose rows are ld_t long (the input's row count; -1: rows, the whole tensor).
template <bool kSums>
void launch_cast_transpose(const NVTETensor& input, const NVTETensor& output,
                           const NVTETensor& output_t, int64_t rows, int64_t cols,
                           float* partial, NVTEStream stream, void* dbias = nullptr,
                           NVTEDType dbias_dtype = kNVTEFloat32, int64_t row_begin = 0,
                           int64_t ld_t = -1) {
  TE_SWITCH_HP(input.dtype, InT, "input",
    TE_SWITCH_FP8(output.dtype, OutT, "output",
      launch_tiles<CopyProducer<InT>, OutT, true, kSums>(
          CopyProducer<InT>{static_cast<const InT*>(input.data) + row_begin * cols, cols},
          static_cast<OutT*>(output.data) + row_begin * cols,
          static_cast<OutT*>(output_t.data) + row_begin, rows, cols, output.scale, output.amax,
          output.scale_inv, partial, to_stream(stream), dbias, dbias_dtype, ld_t)));
}

// current == nullptr: the outputs' own scales. Otherwise Float8CurrentScaling (GridScaling above;
// outputs[i].scale == current->scale + i): one cooperative launch when the whole grid fits on
// the device at once, else the scales kernel and then the plain casts.
template <typename InT, typename OutT>
void launch_multi_cast_transpose(int64_t n, const NVTETensor* const* inputs,
                                 NVTETensor* const* outputs, NVTETensor* const* outputs_t,
                                 const GridScaling* current, NVTEStream stream) {
  using T = Tile<OutT>;
  MultiCastTable<InT, OutT> t{};
  t.n = static_cast<int>(n);
  t.first_tile[0] = 0;
  bool aligned = true;
  for (int i = 0; i < t.n; ++i) {
    int64_t rows, cols;
    as_2d(*inputs[i], &rows, &cols);
    t.in[i] = static_cast<const InT*>(inputs[i]->data);
    t.out[i] = static_cast<OutT*>(outputs[i]->data);
    t.out_t[i] = static_cast<OutT*>(outputs_t[i]->data);
    t.scale[i] = outputs[i]->scale;
    t.amax[i] = outputs[i]->amax;
    t.scale_inv[i] = outputs[i]->scale_inv;
    t.rows[i] = rows;
    t.cols[i] = cols;
    const int64_t tiles = ((rows + T::kDim - 1) / T::kDim) * ((cols + T::kDim - 1) / T::kDim);
    t.first_tile[i + 1] = t.first_tile[i] + (tiles > 0 ? tiles : 1);
    aligned = aligned && rows % T::kSeg == 0 && cols % T::kSeg == 0 && aligned16(t.in[i]) &&
              aligned16(t.out[i]) && aligned16(t.out_t[i]);
  }
  TE_CHECK_ARG(t.first_tile[t.n] < (int64_t(1) << 31), "tensors too large for one launch");
  const unsigned grid = unsigned(t.first_tile[t.n]);
  cudaStream_t s = to_stream(stream);
  GridScaling g{};
  if (current != nullptr) {
    g = *current;
#if TE_PLATFORM_CUDA  // (AMD: the two-launch way; the grid barrier is untested there)
    auto kernel = aligned ? multi_cast_transpose_kernel<InT, OutT, true, true>
                          : multi_cast_transpose_kernel<InT, OutT, false, true>;
    // At most half of what fits on an idle device: blocks of other streams' kernels (a
    // communication kernel, say) may hold part of it, and a cooperative grid waits until it fits
    // whole. Not under graph capture (kept to plain launches there).
    const int64_t half = rows::resident_blocks(kernel, kThreads, 0, 2 * int64_t(grid)) / 2;
    if (half >= int64_t(grid) && !stream_capturing(s)) {
      void* args[] = {&t, &g};
      if (cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                      dim3(kThreads), args, 0, s) == cudaSuccess)
        return;
      (void)cudaGetLastError();  // refused (unsupported): the two-launch way
    }
#endif
    launch_current_scales(inputs, n, g.amax, g.counter, g.scale, g.scale_inv, g.skipped,
                          g.fp8_max, stream);
  }
  if (aligned)
    multi_cast_transpose_kernel<InT, OutT, true, false><<<grid, kThreads, 0, s>>>(t, g);
  else
    multi_cast_transpose_kernel<InT, OutT, false, false><<<grid, kThreads, 0, s>>>(t, g);
  check_launch("multi_cast_transpose_kernel");
}

// cast+transpose+dbias with a fused prologue (current scaling) or epilogue (a step's delayed
// update); launch_cast_transpose<true> otherwise. Returns false when the fused kernel was not
// launched (current scaling: the grid does not fit, graph capture, AMD), and the caller takes
// the separate launches.
template <DbiasFusion kFusion>
bool launch_dbias_fused(const NVTETensor& input, const NVTETensor& output,
                        const NVTETensor& output_t, int64_t rows, int64_t cols, float* partial,
                        void* dbias, NVTEDType dbias_dtype, const GridScaling& g,
                        const StepUpdate& u, NVTEStream stream) {
  bool launched = false;
  TE_SWITCH_HP(input.dtype, InT, "input",
    TE_SWITCH_FP8(output.dtype, OutT, "output", {
      using T = Tile<OutT>;
      const int64_t tiles = ((rows + T::kDim - 1) / T::kDim) * ((cols + T::kDim - 1) / T::kDim);
      const CopyProducer<InT> prod{static_cast<const InT*>(input.data), cols};
      OutT* out = static_cast<OutT*>(output.data);
      OutT* out_t = static_cast<OutT*>(output_t.data);
      const bool aligned = rows % T::kSeg == 0 && cols % T::kSeg == 0 && prod.vector_ok(T::kSeg) &&
                           aligned16(out_t) && aligned16(out);
      auto kernel = aligned ? cast_transpose_dbias_fused_kernel<InT, OutT, true, kFusion>
                            : cast_transpose_dbias_fused_kernel<InT, OutT, false, kFusion>;
      cudaStream_t s = to_stream(stream);
      const float* scale = output.scale;
      float* amax = output.amax;
      float* scale_inv = output.scale_inv;
      int dt = int(dbias_dtype);
      if (tiles > 0 && tiles < (int64_t(1) << 31)) {
        const unsigned grid = unsigned(tiles);
        if constexpr (kFusion == DbiasFusion::kCurrentScaling) {
#if TE_PLATFORM_CUDA  // (as in launch_multi_cast_transpose)
          const int64_t half = rows::resident_blocks(kernel, kThreads, 0, 2 * tiles) / 2;
          if (half >= tiles && !stream_capturing(s)) {
            void* args[] = {const_cast<CopyProducer<InT>*>(&prod), &out, &out_t, &rows, &cols,
                            &scale, &amax, &scale_inv, &partial, &dbias, &dt,
                            const_cast<GridScaling*>(&g), const_cast<StepUpdate*>(&u)};
            if (cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                            dim3(kThreads), args, 0, s) == cudaSuccess)
              launched = true;
            else
              (void)cudaGetLastError();
          }
#else
          (void)kernel;  // AMD: the two-launch way
#endif
        } else {
          kernel<<<grid, kThreads, 0, s>>>(prod, out, out_t, rows, cols, scale, amax, scale_inv,
                                           partial, dbias, dt, g, u);
          check_launch("cast_transpose_dbias_fused_kernel");
          launched = true;
        }
      }
    }));
  return launched;
}

void check_multi_args(int64_t n, const NVTETensor* const* inputs, NVTETensor* const* outputs,
                      NVTETensor* const* outputs_t) {
  TE_CHECK_ARG(n >= 1 && n <= kMaxMultiTensors, "n is ", n, "; expected 1 to ", kMaxMultiTensors);
  TE_CHECK_ARG(inputs != nullptr && outputs != nullptr && outputs_t != nullptr,
               "inputs, outputs and outputs_t must be arrays of n descriptors");
  for (int64_t i = 0; i < n; ++i) {
    int64_t rows, cols;
    check_cast_transpose_args(inputs[i], outputs[i], outputs_t[i], &rows, &cols);
    TE_CHECK_ARG(inputs[i]->dtype == inputs[0]->dtype, "inputs[", i, "] has dtype ",
                 nvte_dtype_name(inputs[i]->dtype), "; expected inputs[0]'s dtype ",
                 nvte_dtype_name(inputs[0]->dtype));
    TE_CHECK_ARG(outputs[i]->dtype == outputs[0]->dtype, "outputs[", i, "] has dtype ",
                 nvte_dtype_name(outputs[i]->dtype), "; expected outputs[0]'s dtype ",
                 nvte_dtype_name(outputs[0]->dtype));
  }
}

void launch_multi(int64_t n, const NVTETensor* const* inputs, NVTETensor* const* outputs,
                  NVTETensor* const* outputs_t, const GridScaling* current, NVTEStream stream) {
  TE_SWITCH_HP(inputs[0]->dtype, InT, "input",
    TE_SWITCH_FP8(outputs[0]->dtype, OutT, "output",
      launch_multi_cast_transpose<InT, OutT>(n, inputs, outputs, outputs_t, current, stream)));
}

}  // namespace
}  // namespace tile_transpose
}  // namespace te

using namespace te;
using namespace te::tile_transpose;

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
    switch (nvte_dtype_size(input->dtype)) {
      case 1: launch_copy_transpose<uint8_t>(input->data, output->data, rows, cols, stream); break;
      case 2: launch_copy_transpose<uint16_t>(input->data, output->data, rows, cols, stream); break;
      case 4: launch_copy_transpose<uint32_t>(input->data, output->data, rows, cols, stream); break;
      default:
        TE_UNSUPPORTED("input dtype ", nvte_dtype_name(input->dtype),
                       " is not supported; expected a 1, 2 or 4-byte dtype");
    }
  });
}

extern "C" NVTEStatus nvte_cast_transpose(const NVTETensor* input, NVTETensor* output,
                                          NVTETensor* output_t, NVTEStream stream) {
  return guard("nvte_cast_transpose", [&] {
    int64_t rows, cols;
    check_cast_transpose_args(input, output, output_t, &rows, &cols);
    launch_cast_transpose<false>(*input, *output, *output_t, rows, cols, nullptr, stream);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_rows(const NVTETensor* input, NVTETensor* output,
                                               NVTETensor* output_t, int64_t row_begin,
                                               int64_t row_end, NVTEStream stream) {
  return guard("nvte_cast_transpose_rows", [&] {
    int64_t rows, cols;
    check_cast_transpose_args(input, output, output_t, &rows, &cols);
    TE_CHECK_ARG(row_begin >= 0 && row_begin < row_end && row_end <= rows, "rows [", row_begin,
                 ", ", row_end, ") are not a non-empty range of the input's ", rows, " rows");
    launch_cast_transpose<false>(*input, *output, *output_t, row_end - row_begin, cols, nullptr,
                                 stream, nullptr, kNVTEFloat32, row_begin, rows);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_multi(int64_t n, const NVTETensor* const* inputs,
                                                NVTETensor* const* outputs,
                                                NVTETensor* const* outputs_t, NVTEStream stream) {
  return guard("nvte_cast_transpose_multi", [&] {
    check_multi_args(n, inputs, outputs, outputs_t);
    launch_multi(n, inputs, outputs, outputs_t, nullptr, stream);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_multi_current_scaling(
    int64_t n, const NVTETensor* const* inputs, NVTETensor* const* outputs,
    NVTETensor* const* outputs_t, float* amax, int* counter, float* scale, float* scale_inv,
    int* skipped, float fp8_max, NVTEStream stream) {
  return guard("nvte_cast_transpose_multi_current_scaling", [&] {
    check_multi_args(n, inputs, outputs, outputs_t);
    TE_CHECK_ARG(amax && counter && scale && scale_inv,
                 "amax, counter, scale and scale_inv must all be device pointers");
    TE_CHECK_ARG(fp8_max > 0.f && std::isfinite(fp8_max), "fp8_max is ", fp8_max,
                 "; expected a positive finite number");
    for (int64_t i = 0; i < n; ++i)
      TE_CHECK_ARG(outputs[i]->scale == scale + i && outputs[i]->amax == nullptr, "outputs[", i,
                   "] must have scale pointer scale + ", i, " and no amax pointer");
    const GridScaling g{amax, counter, scale, scale_inv, skipped, fp8_max, static_cast<int>(n)};
    launch_multi(n, inputs, outputs, outputs_t, &g, stream);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_dbias(const NVTETensor* input, NVTETensor* output,
                                                NVTETensor* output_t, NVTETensor* dbias,
                                                NVTETensor* workspace, NVTEStream stream) {
  return guard("nvte_cast_transpose_dbias", [&] {
    int64_t rows, cols;
    check_cast_transpose_args(input, output, output_t, &rows, &cols);
    if (check_dbias(dbias, workspace, rows, cols)) return;
    float* partial = static_cast<float*>(workspace->data);
    const bool final_sums = dbias_sums_are_final(rows);
    launch_cast_transpose<true>(*input, *output, *output_t, rows, cols, partial, stream,
                                final_sums ? dbias->data : nullptr, dbias->dtype);
    if (!final_sums)
      act::launch_dbias_reduce(partial, dbias->data, dbias->dtype, dbias_workspace_rows(rows),
                               cols, stream);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_dbias_current_scaling(
    const NVTETensor* input, NVTETensor* output, NVTETensor* output_t, NVTETensor* dbias,
    NVTETensor* workspace, float* amax, int* counter, float* scale, float* scale_inv,
    int* skipped, float fp8_max, NVTEStream stream) {
  return guard("nvte_cast_transpose_dbias_current_scaling", [&] {
    int64_t rows, cols;
    check_cast_transpose_args(input, output, output_t, &rows, &cols);
    if (check_dbias(dbias, workspace, rows, cols)) return;
    TE_CHECK_ARG(amax && counter && scale && scale_inv,
                 "amax, counter, scale and scale_inv must all be device pointers");
    TE_CHECK_ARG(fp8_max > 0.f && std::isfinite(fp8_max), "fp8_max is ", fp8_max,
                 "; expected a positive finite number");
    TE_CHECK_ARG(output->scale == scale && output->amax == nullptr,
                 "output must have scale pointer `scale` and no amax pointer");
    float* partial = static_cast<float*>(workspace->data);
    const bool final_sums = dbias_sums_are_final(rows);
    const GridScaling g{amax, counter, scale, scale_inv, skipped, fp8_max, 1};
    if (!launch_dbias_fused<DbiasFusion::kCurrentScaling>(
            *input, *output, *output_t, rows, cols, partial, final_sums ? dbias->data : nullptr,
            dbias->dtype, g, StepUpdate{}, stream)) {
      launch_current_scales(&input, 1, amax, counter, scale, scale_inv, skipped, fp8_max,
                            stream);
      launch_cast_transpose<true>(*input, *output, *output_t, rows, cols, partial, stream,
                                  final_sums ? dbias->data : nullptr, dbias->dtype);
    }
    if (!final_sums)
      act::launch_dbias_reduce(partial, dbias->data, dbias->dtype, dbias_workspace_rows(rows),
                               cols, stream);
  });
}

extern "C" NVTEStatus nvte_cast_transpose_dbias_update(
    const NVTETensor* input, NVTETensor* output, NVTETensor* output_t, NVTETensor* dbias,
    NVTETensor* workspace, const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
    float margin, int* counter, NVTEStream stream) {
  return guard("nvte_cast_transpose_dbias_update", [&] {
    int64_t rows, cols;
    check_cast_transpose_args(input, output, output_t, &rows, &cols);
    if (check_dbias(dbias, workspace, rows, cols)) return;
    check_scaling_groups(groups, num_groups, algo, margin);
    TE_CHECK_ARG(counter != nullptr, "counter is a null pointer");
    float* partial = static_cast<float*>(workspace->data);
    const bool final_sums = dbias_sums_are_final(rows);
    void* direct = final_sums ? dbias->data : nullptr;
    bool fused = false;
    if (num_groups <= kStepGroups) {
      StepUpdate u{};
      for (int64_t i = 0; i < num_groups; ++i) u.groups[i] = groups[i];
      u.num_groups = static_cast<int>(num_groups);
      u.most_recent = algo == kNVTEAmaxMostRecent;
      u.margin_pow2 = std::exp2(margin);
      u.counter = counter;
      fused = launch_dbias_fused<DbiasFusion::kStepUpdate>(
          *input, *output, *output_t, rows, cols, partial, direct, dbias->dtype, GridScaling{}, u,
          stream);
    }
    if (!fused)
      launch_cast_transpose<true>(*input, *output, *output_t, rows, cols, partial, stream, direct,
                                  dbias->dtype);
    if (!final_sums)
      act::launch_dbias_reduce(partial, dbias->data, dbias->dtype, dbias_workspace_rows(rows),
                               cols, stream);
    if (!fused) launch_delayed_update(groups, num_groups, algo, margin, stream);
  });
}
