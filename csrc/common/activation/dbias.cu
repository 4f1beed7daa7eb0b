// nvte_dbias: the column sums of a 2-D gradient (a linear layer's bias gradient), in two
// deterministic stages: column_sum_kernel (column_sum.cuh) writes one fp32 partial row per row
// block into the caller's workspace, launch_dbias_reduce (activation.cu) adds the partial rows
// per column. Inputs short enough for a single row block take the first stage alone, which then
// writes dbias itself (no workspace).
#include "activation/activation_launch.h"
#include "activation/column_sum.cuh"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace act {

namespace {

// Launch shape of the first stage: kColThreads x kRowThreads threads (strips of 128 16-bit or 64
// fp32 columns), each with kUnroll 16-byte loads in flight.
// Row blocks: at least kMinRows rows each, so that the partial rows (fp32) stay a small share of
// the traffic (1/32 of the bytes read for 16-bit inputs); otherwise about kTargetBlocks blocks in
// all (one wave of about 3 blocks per SM on an H100), each block looping over its rows: fewer,
// longer blocks write fewer partial rows and leave a shorter tail.
// Measured in a scratch harness on an H100 (bf16, graph replays, stage 1 + stage 2; the same
// shape on an H200 agreed): 16 x 16 threads x 4 loads with 384 blocks beat 32 x 8 x {4, 8},
// 32 x 16 x 4, 64 x 4 x 8 and 64 x 8 x 4 at targets of 256-2048 blocks on every shape tried:
// 4096x12288 35.2 us (32 x 8 x 8 at 512 blocks: 36.0), 4096x4096 12.9 (13.3), 16384x16384
// 173.5 (175.5), 8192x4096 24.3 (25.4); a read-only kernel there: 33.7, 11.9, 172.8, 23.2 us.
constexpr int kColThreads = 16;
constexpr int kRowThreads = 16;
constexpr int kUnroll = 4;
constexpr int64_t kMinRows = 64;
constexpr int64_t kTargetBlocks = 384;

int64_t strip_columns(NVTEDType dtype) {
  return int64_t(kColThreads) * (16 / int64_t(nvte_dtype_size(dtype)));
}

// Depends on the shape and dtype alone, so that the size query and the call agree.
int64_t column_sum_rows_per_block(int64_t rows, int64_t cols, NVTEDType dtype) {
  if (rows <= kMinRows) return rows < 1 ? 1 : rows;
  const int64_t strip = strip_columns(dtype);
  const int64_t strips = cols < 1 ? 1 : (cols + strip - 1) / strip;
  const int64_t want = (kTargetBlocks + strips - 1) / strips;  // row blocks wanted
  constexpr int64_t kStep = int64_t(kRowThreads) * kUnroll;
  int64_t per = (rows + want - 1) / want;
  per = (per + kStep - 1) / kStep * kStep;
  per = per < kMinRows ? kMinRows : per;
  const int64_t min_per = (rows + 65534) / 65535;  // grid.y holds at most 65535 row blocks
  return per < min_per ? min_per : per;
}

int64_t column_sum_row_blocks(int64_t rows, int64_t cols, NVTEDType dtype) {
  if (rows == 0) return 0;
  const int64_t per = column_sum_rows_per_block(rows, cols, dtype);
  return (rows + per - 1) / per;
}

template <typename T, typename OutT>
void launch_column_sum(const T* in, OutT* out, int64_t rows, int64_t cols, int64_t per,
                       int64_t row_blocks, cudaStream_t stream) {
  constexpr int64_t kStrip = int64_t(kColThreads) * (16 / int64_t(sizeof(T)));
  const int64_t strips = (cols + kStrip - 1) / kStrip;
  TE_CHECK_ARG(strips < (int64_t(1) << 31), "grad of ", cols, " columns is too large");
  const bool vectorized = aligned16(in) && cols % (16 / int64_t(sizeof(T))) == 0;
  launch_overlapping(column_sum_kernel<T, OutT, kColThreads, kRowThreads, kUnroll>,
                     dim3(unsigned(strips), unsigned(row_blocks)),
                     dim3(kColThreads * kRowThreads), stream, in, out, rows, cols, per, vectorized);
  check_launch("column_sum_kernel");
}

void run_dbias(const NVTETensor& grad, NVTETensor& dbias, float* workspace, int64_t rows,
               int64_t cols, NVTEStream s) {
  if (cols == 0) return;
  const int64_t row_blocks = column_sum_row_blocks(rows, cols, grad.dtype);
  if (row_blocks == 0) {  // no rows: dbias = 0
    launch_dbias_reduce(nullptr, dbias.data, dbias.dtype, 0, cols, s, true);
    return;
  }
  const int64_t per = column_sum_rows_per_block(rows, cols, grad.dtype);
  cudaStream_t stream = to_stream(s);
  TE_SWITCH_HP(grad.dtype, T, "grad",
    const T* in = static_cast<const T*>(grad.data);
    if (row_blocks == 1) {
      TE_SWITCH_HP(dbias.dtype, OutT, "dbias",
        launch_column_sum(in, static_cast<OutT*>(dbias.data), rows, cols, per, 1, stream));
    } else {
      launch_column_sum(in, workspace, rows, cols, per, row_blocks, stream);
      launch_dbias_reduce(workspace, dbias.data, dbias.dtype, row_blocks, cols, s, true);
    });
}

}  // namespace
}  // namespace act
}  // namespace te

using namespace te;
using namespace te::act;

extern "C" NVTEStatus nvte_dbias(const NVTETensor* grad, NVTETensor* dbias, NVTETensor* workspace,
                                 NVTEStream stream) {
  return guard("nvte_dbias", [&] {
    check_tensor(grad, "grad");
    check_tensor(dbias, "dbias");
    TE_CHECK_ARG(workspace != nullptr, "workspace is a null descriptor");
    check_dtype_in(*grad, "grad", is_high_precision(grad->dtype), "float32, float16 or bfloat16");
    TE_CHECK_ARG(grad->ndim == 2, "grad has shape ", shape_str(*grad),
                 "; expected a 2-D tensor [rows, cols]");
    check_dtype_in(*dbias, "dbias", is_high_precision(dbias->dtype), "float32, float16 or bfloat16");
    const int64_t rows = grad->shape[0], cols = grad->shape[1];
    TE_CHECK_ARG(numel(*dbias) == cols, "dbias has shape ", shape_str(*dbias), "; expected [",
                 cols, "] (grad's last dimension, grad ", shape_str(*grad), ")");

    const int64_t blocks = column_sum_row_blocks(rows, cols, grad->dtype);
    const int64_t ws_rows = blocks > 1 ? blocks : 0;  // one row block writes dbias directly
    if (dbias_workspace_query_or_check(workspace, ws_rows, cols)) return;
    run_dbias(*grad, *dbias, static_cast<float*>(workspace->data), rows, cols, stream);
  });
}
