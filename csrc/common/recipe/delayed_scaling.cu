// Delayed-scaling update (see recipe.h for the formula): one block per tensor, many groups per
// launch. The group table travels in the kernel's parameter space, so nothing is copied to the
// device beforehand and the launch can be captured in a graph.
#include <cmath>

#include "transformer_engine/recipe.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

constexpr int kMaxGroupsPerLaunch = 64;  // 64 x 48 bytes stays well inside the 4 KB param limit
constexpr int kThreads = 128;

struct GroupTable {
  NVTEScalingGroup groups[kMaxGroupsPerLaunch];
  int64_t first_tensor[kMaxGroupsPerLaunch + 1];  // prefix sum of num_tensors
  int num_groups;
};

// One block per tensor. The threads walk the history in chunks of blockDim entries: each reads
// its entry's successor, the block meets at a barrier, then each writes, so the roll by one row
// needs no scratch copy whatever the history length. (One thread per tensor walked 1024 entries
// serially, about 0.1 ms per launch.)
__global__ void __launch_bounds__(kThreads)
delayed_scaling_kernel(const GroupTable table, int most_recent, float margin_pow2) {
  __shared__ float warp_max[kThreads / 32];  // one slot per warp, for 32- and 64-lane warps
  const int64_t t = blockIdx.x;
  int g = 0;
  while (table.first_tensor[g + 1] <= t) ++g;
  const NVTEScalingGroup& grp = table.groups[g];
  const int64_t j = t - table.first_tensor[g];
  const int64_t n = grp.num_tensors, len = grp.history_len;
  float* h = grp.amax_history + j;

  const float first = h[0];
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
  if (threadIdx.x != 0) return;
  // Thread 0 passed the last barrier, so every read of the old rows is done.
  h[(len - 1) * n] = first;
  h[0] = 0.f;

  float scale = grp.scale[j];
  const float candidate = (grp.fp8_max / amax) / margin_pow2;
  if (amax > 0.f && isfinite(amax) && isfinite(candidate)) scale = candidate;
  grp.scale[j] = scale;
  grp.scale_inv[j] = 1.f / scale;
}

}  // namespace
}  // namespace te

using namespace te;

extern "C" NVTEStatus nvte_delayed_scaling_update(const NVTEScalingGroup* groups,
                                                  int64_t num_groups, NVTEAmaxAlgo algo,
                                                  float margin, NVTEStream stream) {
  return guard("nvte_delayed_scaling_update", [&] {
    TE_CHECK_ARG(num_groups >= 0, "num_groups is ", num_groups, "; expected >= 0");
    TE_CHECK_ARG(num_groups == 0 || groups != nullptr, "groups is a null pointer");
    TE_CHECK_ARG(algo == kNVTEAmaxMax || algo == kNVTEAmaxMostRecent, "algo is ",
                 static_cast<int>(algo), "; expected kNVTEAmaxMax or kNVTEAmaxMostRecent");
    TE_CHECK_ARG(std::isfinite(margin), "margin is ", margin, "; expected a finite number");
    for (int64_t i = 0; i < num_groups; ++i) {
      const NVTEScalingGroup& g = groups[i];
      TE_CHECK_ARG(g.history_len >= 1, "group ", i, " has history_len ", g.history_len,
                   "; expected >= 1");
      TE_CHECK_ARG(g.num_tensors >= 0, "group ", i, " has num_tensors ", g.num_tensors,
                   "; expected >= 0");
      TE_CHECK_ARG(g.num_tensors == 0 || (g.amax_history && g.scale && g.scale_inv), "group ", i,
                   " has a null amax_history, scale or scale_inv pointer");
      TE_CHECK_ARG(g.fp8_max > 0.f && std::isfinite(g.fp8_max), "group ", i, " has fp8_max ",
                   g.fp8_max, "; expected a positive finite number");
    }
    const float margin_pow2 = std::exp2(margin);
    for (int64_t start = 0; start < num_groups; start += kMaxGroupsPerLaunch) {
      GroupTable table;
      table.num_groups = static_cast<int>(std::min<int64_t>(kMaxGroupsPerLaunch, num_groups - start));
      table.first_tensor[0] = 0;
      for (int i = 0; i < table.num_groups; ++i) {
        table.groups[i] = groups[start + i];
        table.first_tensor[i + 1] = table.first_tensor[i] + groups[start + i].num_tensors;
      }
      const int64_t total = table.first_tensor[table.num_groups];
      if (total == 0) continue;
      delayed_scaling_kernel<<<unsigned(total), kThreads, 0, to_stream(stream)>>>(
          table, algo == kNVTEAmaxMostRecent, margin_pow2);
      check_launch("delayed_scaling_kernel");
    }
  });
}
