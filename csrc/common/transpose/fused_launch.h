// Host-side interface between the C entry points of the fused cast+transpose ops
// (cast_transpose.cu, act_cast_transpose.cu) and the per-activation instantiation files
// (act_cast_transpose_gelu.cu, ...), so each activation's kernels compile in their own
// translation unit while the argument checks live once.
#pragma once

#include <stdint.h>

#include "transformer_engine/activation.h"

namespace te {
namespace tile_transpose {

enum class ActKind { kForward, kGatedForward, kBackward, kGatedBackward };

// rows x cols is the shape of the FP8 result: for the gated forward cols = N (input [rows, 2N]),
// for the gated backward cols = 2N (grad [rows, N], input [rows, 2N]).
struct ActTransposeArgs {
  ActKind kind;
  const void* grad;  // backward kinds only
  const void* input;
  void* output;
  void* output_t;
  int64_t rows, cols;
  NVTEDType in_dtype, out_dtype;
  const float* scale;
  float* amax;
  float* scale_inv;
  float* partial;  // backward kinds: [fp8_row_tiles(rows), cols] fp32 column sums, or null
  void* dbias;     // backward kinds: the bias gradient, written directly when not null
  NVTEDType dbias_dtype;  // (only for an input of one row of tiles: dbias_sums_are_final)
  NVTEStream stream;
};

template <NVTEActivation A> void launch_act_cast_transpose(const ActTransposeArgs& args);

// Rows of the dbias workspace [dbias_workspace_rows(rows), cols] fp32.
int64_t dbias_workspace_rows(int64_t rows);

// Whether the cast+transpose kernel's column sums are already the bias gradient (one row of
// tiles): it then writes dbias itself and the reduce launch is skipped.
bool dbias_sums_are_final(int64_t rows);

// The argument checks and workspace protocol of the dbias ops: dbias must be a high-precision
// [cols] tensor; a zeroed workspace descriptor (data NULL, ndim 0) is a size query, answered by
// writing its shape and dtype (returns true: nothing else may run); otherwise the workspace is
// checked against the size the shape needs (returns false).
bool check_dbias(const NVTETensor* dbias, NVTETensor* workspace, int64_t rows, int64_t cols);

}  // namespace tile_transpose
}  // namespace te
