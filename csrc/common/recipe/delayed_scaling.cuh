// The delayed-scaling update of one tensor (see recipe.h for the formula), as a block-wide
// device function: the update kernel runs it with one block per tensor, and a fused cast kernel
// may run a whole step's update in its last block (transpose/tile_transpose.cuh).
#pragma once

#include "transformer_engine/recipe.h"
#include "util/device_utils.cuh"

namespace te {

// The argument checks of nvte_delayed_scaling_update (throws on a bad group), and its launches
// (groups checked).
void check_scaling_groups(const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
                          float margin);
void launch_delayed_update(const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
                           float margin, NVTEStream stream);

// Tensor j of grp, by the whole block (every thread must call it; it synchronises the block).
// The threads walk the history in chunks of blockDim entries: each reads its entry's successor,
// the block meets at a barrier, then each writes, so the roll by one row needs no scratch copy
// whatever the history length. warp_max: one float per warp of shared memory.
// A non-finite current amax (every thread reads the same h[0], so the branch is uniform) is
// dropped: no roll, scale kept, row 0 cleared, the tensor's skip counter incremented.
__device__ __forceinline__ void delayed_update_tensor(const NVTEScalingGroup& grp, int64_t j,
                                                      bool most_recent, float margin_pow2,
                                                      float* warp_max) {
  const int64_t n = grp.num_tensors, len = grp.history_len;
  float* h = grp.amax_history + j;
  const float first = h[0];
  if (!isfinite(first)) {
    __syncthreads();  // every thread has read h[0] before thread 0 clears it
    if (threadIdx.x == 0) {
      h[0] = 0.f;
      if (grp.skipped != nullptr) grp.skipped[j] += 1;
    }
    __syncthreads();
    return;
  }
  float amax = first;
  for (int64_t base = 0; base + 1 < len; base += blockDim.x) {
    const int64_t l = base + threadIdx.x;
    const bool active = l + 1 < len;
    float next = 0.f;
    if (active) {
      next = h[(l + 1) * n];
      if (!most_recent) amax = nan_max(amax, next);
    }
    __syncthreads();
    if (active) h[l * n] = next;
  }
  amax = block_reduce_max(amax, warp_max);
  if (threadIdx.x == 0) {
    // Thread 0 passed the last barrier, so every read of the old rows is done.
    h[(len - 1) * n] = first;
    h[0] = 0.f;
    float scale = grp.scale[j];
    const float candidate = (grp.fp8_max / amax) / margin_pow2;
    if (amax > 0.f && isfinite(amax) && isfinite(candidate)) scale = candidate;
    grp.scale[j] = scale;
    grp.scale_inv[j] = 1.f / scale;
  }
  __syncthreads();  // warp_max and the history are reused by a next call
}

}  // namespace te
