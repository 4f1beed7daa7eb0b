// Delayed-scaling update (see recipe.h for the formula): one block per tensor, many groups per
// launch. The group table travels in the kernel's parameter space, so nothing is copied to the
// device beforehand and the launch can be captured in a graph.
#include <cmath>

#include "recipe/delayed_scaling.cuh"
#include "transformer_engine/recipe.h"
#include "util/device_utils.cuh"
#include "util/tensor.h"

namespace te {
namespace {

// 56 groups of 56 bytes plus the prefix sums (3.6 KB) stay inside the 4 KB parameter limit
// that HIP and older CUDA drivers keep.
constexpr int kMaxGroupsPerLaunch = 56;
// A step of a module or two has a few groups: a table that small keeps the launch's parameter
// block (copied by the host on every launch) at a tenth of the large one's 3.6 KB.
constexpr int kSmallTable = 4;
constexpr int kThreads = 128;

template <int kGroups>
struct GroupTable {
  NVTEScalingGroup groups[kGroups];
  int64_t first_tensor[kGroups + 1];  // prefix sum of num_tensors
  int num_groups;
};

// One block per tensor (delayed_update_tensor in delayed_scaling.cuh).
template <int kGroups>
__global__ void __launch_bounds__(kThreads)
delayed_scaling_kernel(const GroupTable<kGroups> table, int most_recent, float margin_pow2) {
  __shared__ float warp_max[kThreads / 32];  // one slot per warp, for 32- and 64-lane warps
  const int64_t t = blockIdx.x;
  int g = 0;
  while (table.first_tensor[g + 1] <= t) ++g;
  delayed_update_tensor(table.groups[g], t - table.first_tensor[g], most_recent, margin_pow2,
                        warp_max);
}

// Groups [start, min(start + kGroups, num_groups)) in one launch.
template <int kGroups>
void launch_update(const NVTEScalingGroup* groups, int64_t start, int64_t num_groups,
                   NVTEAmaxAlgo algo, float margin_pow2, NVTEStream stream) {
  GroupTable<kGroups> table;
  table.num_groups = static_cast<int>(std::min<int64_t>(kGroups, num_groups - start));
  table.first_tensor[0] = 0;
  for (int i = 0; i < table.num_groups; ++i) {
    table.groups[i] = groups[start + i];
    table.first_tensor[i + 1] = table.first_tensor[i] + groups[start + i].num_tensors;
  }
  const int64_t total = table.first_tensor[table.num_groups];
  if (total == 0) return;
  delayed_scaling_kernel<kGroups><<<unsigned(total), kThreads, 0, to_stream(stream)>>>(
      table, algo == kNVTEAmaxMostRecent, margin_pow2);
  check_launch("delayed_scaling_kernel");
}

}  // namespace

void launch_delayed_update(const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
                           float margin, NVTEStream stream) {
  const float margin_pow2 = std::exp2(margin);
  if (num_groups <= kSmallTable) {
    launch_update<kSmallTable>(groups, 0, num_groups, algo, margin_pow2, stream);
    return;
  }
  for (int64_t start = 0; start < num_groups; start += kMaxGroupsPerLaunch)
    launch_update<kMaxGroupsPerLaunch>(groups, start, num_groups, algo, margin_pow2, stream);
}

void check_scaling_groups(const NVTEScalingGroup* groups, int64_t num_groups, NVTEAmaxAlgo algo,
                          float margin) {
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
}

}  // namespace te

using namespace te;

extern "C" NVTEStatus nvte_delayed_scaling_update(const NVTEScalingGroup* groups,
                                                  int64_t num_groups, NVTEAmaxAlgo algo,
                                                  float margin, NVTEStream stream) {
  return guard("nvte_delayed_scaling_update", [&] {
    check_scaling_groups(groups, num_groups, algo, margin);
    launch_delayed_update(groups, num_groups, algo, margin, stream);
  });
}
