// Host-side interface between the C entry points (activation.cu) and the per-activation
// instantiation files (gelu.cu, relu.cu, ...). Keeping the kernels behind this small interface
// lets each activation compile in its own translation unit, in parallel, while the argument
// checks live once in activation.cu.
#pragma once

#include <stdint.h>

#include "transformer_engine/activation.h"

namespace te {
namespace act {

enum class Kind { kForward, kBackward, kGatedForward, kGatedBackward };

// Plain kinds view the tensors as rows * cols elements. Gated kinds: cols is N, the width of the
// output (forward) or of grad (backward); the input and dx rows hold 2N values.
struct ElementwiseArgs {
  Kind kind;
  const void* grad;  // backward kinds only
  const void* input;
  void* output;
  int64_t rows, cols;
  NVTEDType in_dtype, out_dtype;
  const float* scale;  // FP8 output only
  float* amax;
  float* scale_inv;
  NVTEStream stream;
};

struct DbiasArgs {
  const void* grad;
  const void* input;
  void* output;  // dx
  int64_t rows, cols;
  NVTEDType in_dtype, out_dtype;
  const float* scale;
  float* amax;
  float* scale_inv;
  void* dbias;
  NVTEDType dbias_dtype;
  float* workspace;  // [row_blocks, cols] fp32 partial column sums
  NVTEStream stream;
};

// Threads per block of every activation kernel.
constexpr int kActThreads = 256;

// Shape of a first-stage dbias block: 32 column threads x kDbiasRowThreads row threads, each
// keeping kDbiasRowUnroll rows in flight.
constexpr int kDbiasRowThreads = 8;
constexpr int kDbiasRowUnroll = 4;

// Rows summed by one block of the first dbias stage, and the resulting number of partial rows
// (the workspace is [dbias_row_blocks(rows), cols] fp32). Depends on the shape alone, so the
// size query and the real call agree.
int64_t dbias_rows_per_block(int64_t rows);
int64_t dbias_row_blocks(int64_t rows);

// The fp32 [ws_rows, cols] partial-sum workspace of the dbias ops (nvte_dbias_dactivation,
// nvte_dbias): a size query (null data, ndim 0) gets that shape written and returns true, and the
// op then returns; otherwise the workspace is checked (dtype, size, alignment) and false returned.
bool dbias_workspace_query_or_check(NVTETensor* workspace, int64_t ws_rows, int64_t cols);

// Second dbias stage (does not depend on the activation): dbias[c] = sum_b partial[b, c]
// (zeros when row_blocks is 0). overlapping: launched with te::launch_overlapping (util/arch.h),
// for a first stage that releases it early (the kernel waits for that stage's results first).
void launch_dbias_reduce(const float* partial, void* dbias, NVTEDType dbias_dtype,
                         int64_t row_blocks, int64_t cols, NVTEStream stream,
                         bool overlapping = false);

// Blocks of 256 threads for a grid-stride loop over work_items items: a few waves of resident
// blocks.
int elementwise_grid(int64_t work_items);

// Argument checks shared with the fused cast+transpose forms (transpose/act_cast_transpose.cu):
// the activation code is one of the enum's, and a gated input [..., 2N] (cols = 2N) yields N.
void check_act(NVTEActivation act);
int64_t gated_width(const NVTETensor& in, int64_t cols);

template <NVTEActivation A> void launch_elementwise(const ElementwiseArgs& args);
template <NVTEActivation A> void launch_dbias(const DbiasArgs& args);

}  // namespace act
}  // namespace te
