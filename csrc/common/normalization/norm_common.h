// Host-side interface between the C entry points (normalization.cu) and the per-input-dtype
// launcher files (fwd_<dtype>.cu, bwd_<dtype>.cu), which are split so that the many template
// instantiations compile in parallel.
#pragma once

#include <stdint.h>

#include "transformer_engine/transformer_engine.h"
#include "util/arch.h"

namespace te {
namespace norm {

struct NormFwdParams {
  const void* x;
  const void* gamma;
  const void* beta;  // null for RMSNorm
  void* z;
  float* mu;         // optional
  float* rsigma;     // optional
  int64_t rows;
  int64_t cols;
  float epsilon;
  bool zero_centered_gamma;
  bool rms;
  NVTEDType x_type, w_type, z_type;
  const float* scale;  // FP8 output only
  float* amax;
  float* scale_inv;
};

struct NormBwdParams {
  const void* dz;
  const void* x;
  const float* mu;  // null for RMSNorm
  const float* rsigma;
  const void* gamma;
  void* dx;
  const void* dresidual;  // null: none (see nvte_layernorm_bwd_add)
  void* dgamma;
  void* dbeta;      // null for RMSNorm
  float* workspace; // [partials, cols] dgamma partial sums, then the same for dbeta
  int64_t rows;
  int64_t cols;
  bool zero_centered_gamma;
  bool rms;
  NVTEDType x_type, w_type;
};

template <typename T>
void launch_norm_fwd_typed(const NormFwdParams& p, cudaStream_t stream);

// Number of per-block partial rows stage 1 writes for this problem (>= 1). With launch == true
// it also runs both stages; the workspace must then hold bwd_workspace_bytes(partials) bytes.
template <typename T>
int64_t run_norm_bwd_typed(const NormBwdParams& p, cudaStream_t stream, bool launch);

inline size_t bwd_workspace_bytes(int64_t partials, int64_t cols, bool rms) {
  const size_t bytes = size_t(partials) * size_t(cols) * sizeof(float) * (rms ? 1 : 2);
  // Never 0: an empty workspace has a null pointer, which would read as a size query.
  return bytes < 16 ? 16 : bytes;
}

}  // namespace norm
}  // namespace te
