// The GEMM plan cache (csrc/common/gemm/plan_cache.h) is bounded: least recently used plans go
// first, a lookup refreshes a plan, and plans that stay are never rebuilt. Each thread has its
// own cache per plan type, and the Lt plan template owns its descriptors. Choices made by timing
// are the process's: the first one stored for a key wins, on every thread.
#include <memory>
#include <thread>
#include <vector>

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

// The shared descriptor holder of the Lt-style libraries destroys each descriptor it owns exactly
// once: on release (a plan rebuilt unfused), and when the cache evicts or drops the plan.
namespace {

struct FakeDesc { int id; };
struct FakeLayout { int id; };

struct FakeLtApi {
  using MatmulDesc = FakeDesc*;
  using Layout = FakeLayout*;
  using Algo = int;
  static int descs_destroyed, layouts_destroyed;
  static void destroy_desc(MatmulDesc d) { ++descs_destroyed; delete d; }
  static void destroy_layout(Layout l) { ++layouts_destroyed; delete l; }
};
int FakeLtApi::descs_destroyed = 0;
int FakeLtApi::layouts_destroyed = 0;

using FakePlan = te::gemm::LtMatmulPlan<FakeLtApi>;

std::unique_ptr<FakePlan> filled_plan(int id, bool with_c) {
  auto p = std::make_unique<FakePlan>();
  p->desc = new FakeDesc{id};
  p->a = new FakeLayout{id};
  p->b = new FakeLayout{id};
  p->c = with_c ? new FakeLayout{id} : nullptr;
  p->d = new FakeLayout{id};
  return p;
}

}  // namespace

TE_TEST(plan_cache_lt_plan_destroys_each_descriptor_once) {
  FakeLtApi::descs_destroyed = FakeLtApi::layouts_destroyed = 0;
  {
    auto p = filled_plan(7, /*with_c=*/false);
    p->release();
    TE_EXPECT(FakeLtApi::descs_destroyed == 1 && FakeLtApi::layouts_destroyed == 3,
              "release destroyed %d descriptors and %d layouts (want 1 and 3)",
              FakeLtApi::descs_destroyed, FakeLtApi::layouts_destroyed);
    TE_EXPECT(p->desc == nullptr && p->a == nullptr && p->b == nullptr && p->d == nullptr,
              "release leaves no dangling descriptor");
  }  // the destructor releases again: nothing left to destroy
  TE_EXPECT(FakeLtApi::descs_destroyed == 1 && FakeLtApi::layouts_destroyed == 3,
            "a released plan destroyed %d / %d on destruction", FakeLtApi::descs_destroyed,
            FakeLtApi::layouts_destroyed);

  FakeLtApi::descs_destroyed = FakeLtApi::layouts_destroyed = 0;
  {
    te::gemm::PlanCache<FakePlan> cache(2);
    for (int i = 0; i < 5; ++i) cache.insert(key_of(i), filled_plan(i, /*with_c=*/true));
    TE_EXPECT(FakeLtApi::descs_destroyed == 3 && FakeLtApi::layouts_destroyed == 12,
              "3 evicted plans destroyed %d descriptors and %d layouts (want 3 and 12)",
              FakeLtApi::descs_destroyed, FakeLtApi::layouts_destroyed);
  }
  TE_EXPECT(FakeLtApi::descs_destroyed == 5 && FakeLtApi::layouts_destroyed == 20,
            "all 5 plans destroyed %d descriptors and %d layouts (want 5 and 20)",
            FakeLtApi::descs_destroyed, FakeLtApi::layouts_destroyed);
}

TE_TEST(plan_cache_is_per_thread_and_per_plan_type) {
  auto& fake = te::gemm::thread_plan_cache<FakePlan>();
  auto& counted = te::gemm::thread_plan_cache<CountedPlan>();
  TE_EXPECT(static_cast<void*>(&fake) != static_cast<void*>(&counted),
            "two plan types share one cache");
  TE_EXPECT(&fake == &te::gemm::thread_plan_cache<FakePlan>(), "a thread's cache is stable");
  const size_t before = fake.size();
  fake.insert(key_of(12345), filled_plan(1, /*with_c=*/true));
  size_t other_thread_size = 1;
  std::thread([&] { other_thread_size = te::gemm::thread_plan_cache<FakePlan>().size(); }).join();
  TE_EXPECT(other_thread_size == 0, "another thread sees %zu plans of this thread's cache",
            other_thread_size);
  TE_EXPECT(fake.size() == before + 1, "size %zu after one insert", fake.size());
}

// A timed algorithm choice is stored once per key for the whole process: whichever thread settles
// first, every thread then finds and uses that one, and a full table stores nothing more.
TE_TEST(shared_choices_first_settled_wins_on_every_thread) {
  te::gemm::SharedChoices<int> choices(3);
  int got = -1;
  TE_EXPECT(!choices.find(key_of(1), &got) && got == -1, "an empty table found a choice");
  TE_EXPECT(choices.settle(key_of(1), 10) == 10, "the first choice is not the one returned");
  TE_EXPECT(choices.settle(key_of(1), 20) == 10, "a later choice replaced the first");
  TE_EXPECT(choices.find(key_of(1), &got) && got == 10, "found %d, want 10", got);

  // Eight threads race to settle one key with their own values: all end with the same one, and
  // it is one of theirs.
  std::vector<int> used(8, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { used[t] = choices.settle(key_of(2), 100 + t); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t)
    TE_EXPECT(used[t] == used[0], "thread %d uses %d, thread 0 uses %d", t, used[t], used[0]);
  TE_EXPECT(used[0] >= 100 && used[0] < 108, "the shared choice %d is none of the threads'", used[0]);
  int found_elsewhere = -1;
  std::thread([&] { choices.find(key_of(2), &found_elsewhere); }).join();
  TE_EXPECT(found_elsewhere == used[0], "another thread found %d, want %d", found_elsewhere, used[0]);

  // Full (capacity 3): a new key's choice is returned to its caller but not stored.
  TE_EXPECT(choices.settle(key_of(3), 30) == 30 && choices.size() == 3, "size %zu", choices.size());
  TE_EXPECT(choices.settle(key_of(4), 40) == 40, "a full table changed the caller's choice");
  TE_EXPECT(!choices.find(key_of(4), &got) && choices.size() == 3,
            "a full table stored a fourth key (size %zu)", choices.size());
  TE_EXPECT(&te::gemm::process_choices<int>() == &te::gemm::process_choices<int>(),
            "the process table is not one table");
}
