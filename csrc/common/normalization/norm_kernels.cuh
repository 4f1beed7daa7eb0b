// Normalization-specific layout limits on top of the shared row machinery (util/row_kernels.cuh).
// The forward holds up to kMaxIters 16-byte chunks per thread and up to 1024 threads per row:
// rows of up to 32768 16-bit elements stay in registers; longer or unaligned rows take the
// general path.
#pragma once

#include "normalization/norm_common.h"
#include "util/row_kernels.cuh"

namespace te {
namespace norm {

using rows::Chunk;
using rows::RowLayout;
using rows::blocks_for;
using rows::kMaxWarps;
using rows::load_floats;
using rows::load_row_chunks;
using rows::pick_register_layout;
using rows::row_sum;
using rows::store_floats;

constexpr int kMaxIters = 4;
constexpr int kMaxTpr = 1024;

inline int general_tpr(int64_t cols) { return rows::general_tpr(cols, kMaxTpr); }

}  // namespace norm
}  // namespace te
