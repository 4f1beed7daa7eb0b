// The GEMM plan cache (csrc/common/gemm/plan_cache.h) is bounded: least recently used plans go
// first, a lookup refreshes a plan, and plans that stay are never rebuilt.
#include "gemm/plan_cache.h"
#include "test_harness.h"

namespace {

struct CountedPlan {
  static int alive;
  int id;
  explicit CountedPlan(int i) : id(i) { ++alive; }
  ~CountedPlan() { --alive; }
};
int CountedPlan::alive = 0;

te::gemm::PlanKey key_of(int64_t m) {
  te::gemm::PlanKey k{};
  k[1] = m;
  return k;
}

}  // namespace

TE_TEST(plan_cache_evicts_least_recently_used) {
  using te::gemm::PlanCache;
  {
    PlanCache<CountedPlan> cache(3);
    for (int i = 0; i < 3; ++i) cache.insert(key_of(i), std::make_unique<CountedPlan>(i));
    TE_EXPECT(cache.size() == 3, "size %zu", cache.size());
    // Touch 0, so 1 is now the least recently used.
    TE_EXPECT(cache.find(key_of(0)) != nullptr && cache.find(key_of(0))->id == 0, "plan 0 cached");
    cache.insert(key_of(3), std::make_unique<CountedPlan>(3));
    TE_EXPECT(cache.size() == 3, "size %zu after an insert past capacity", cache.size());
    TE_EXPECT(cache.find(key_of(1)) == nullptr, "plan 1 (least recently used) evicted");
    TE_EXPECT(cache.find(key_of(0)) != nullptr, "plan 0 (recently used) kept");
    TE_EXPECT(cache.find(key_of(2)) != nullptr && cache.find(key_of(3)) != nullptr,
              "plans 2 and 3 kept");
    TE_EXPECT(CountedPlan::alive == 3, "%d plans alive; evicted plans must be destroyed",
              CountedPlan::alive);
    for (int i = 10; i < 1000; ++i) cache.insert(key_of(i), std::make_unique<CountedPlan>(i));
    TE_EXPECT(cache.size() == 3 && CountedPlan::alive == 3, "size %zu, %d alive", cache.size(),
              CountedPlan::alive);
    TE_EXPECT(cache.find(key_of(999)) && cache.find(key_of(999))->id == 999, "newest kept");
  }
  TE_EXPECT(CountedPlan::alive == 0, "%d plans leaked", CountedPlan::alive);
  TE_EXPECT(te::gemm::kPlanCacheCapacity >= 64, "capacity %zu is too small for a training step",
            te::gemm::kPlanCacheCapacity);
}
