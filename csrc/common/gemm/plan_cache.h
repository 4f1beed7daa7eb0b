// Bounded per-thread cache of GEMM plans (library descriptors + chosen algorithm), shared by the
// vendor backends. A long-running program that sees many shapes (varying sequence lengths, say)
// would otherwise grow its caches without limit; the least recently used plan is dropped once
// kPlanCacheCapacity plans exist. Rebuilding a dropped plan costs one heuristic query (and, on
// cuBLASLt, one timing of the candidates), so the cap only has to exceed the number of shapes a
// training step cycles through.
//
// Plain C++ (no vendor names): the ROCm build hipifies this tree and includes it unchanged.
#pragma once

#include <stddef.h>

#include <list>
#include <memory>
#include <unordered_map>
#include <utility>

#include "gemm/gemm_backend.h"

namespace te {
namespace gemm {

constexpr size_t kPlanCacheCapacity = 256;

template <typename Plan>
class PlanCache {
 public:
  explicit PlanCache(size_t capacity = kPlanCacheCapacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The cached plan for key, marked most recently used; null when absent.
  Plan* find(const PlanKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second.get();
  }

  // Adds a plan for a key that find() did not have and evicts the least recently used one past
  // the capacity. The returned reference stays valid until the next insert on this cache.
  Plan& insert(const PlanKey& key, std::unique_ptr<Plan> plan) {
    order_.emplace_front(key, std::move(plan));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return *order_.front().second;
  }

  size_t size() const { return order_.size(); }

 private:
  using Entry = std::pair<PlanKey, std::unique_ptr<Plan>>;
  size_t capacity_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<PlanKey, typename std::list<Entry>::iterator, PlanKeyHash> index_;
};

}  // namespace gemm
}  // namespace te
