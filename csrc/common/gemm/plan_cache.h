// Per-thread caches of GEMM plans (library descriptors + chosen algorithm), shared by the vendor
// backends, which instantiate them with their own plan types and keep every library call in
// their own files (csrc/cuda, csrc/hip).
//
// The cache is bounded: a long-running program that sees many shapes (varying sequence lengths,
// say) would otherwise grow it without limit; the least recently used plan is dropped once
// kPlanCacheCapacity plans exist. Rebuilding a dropped plan costs one heuristic query (and, on
// cuBLASLt, one timing of the candidates), so the cap only has to exceed the number of shapes a
// training step cycles through. Each thread has its own cache (thread_plan_cache), so lookups
// take no lock.
//
// Plain C++ (no vendor names): the ROCm build hipifies this tree and includes it unchanged.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <array>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "gemm/gemm_backend.h"
#include "util/error.h"

namespace te {
namespace gemm {

// Everything a library's algorithm choice depends on (not the data pointers themselves): the
// cache key. Plain int64 fields: cheap to hash and compare, no padding.
using PlanKey = std::array<int64_t, 24>;

inline PlanKey plan_key(const GemmArgs& a, int device) {
  return PlanKey{device, a.m, a.n, a.k, a.lda, a.ldb, a.ldd, a.ld_aux,
                 a.a_type, a.b_type, a.d_type, a.bias_type, a.aux_type,
                 (a.transa ? 1 : 0) | (a.transb ? 2 : 0) | (a.fast_accum ? 4 : 0) |
                     (a.d_amax != nullptr ? 8 : 0) | (a.beta != 0.f ? 16 : 0),
                 a.epilogue, alignment_of(a.a), alignment_of(a.b), alignment_of(a.d),
                 alignment_of(a.bias), alignment_of(a.aux), static_cast<int64_t>(a.workspace_size),
                 alignment_of(addend_of(a)), a.a_scale_mode * 4 + a.b_scale_mode, 0};
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

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

// The calling thread's cache of Plan (one per plan type, i.e. per library).
template <typename Plan>
PlanCache<Plan>& thread_plan_cache() {
  thread_local PlanCache<Plan> cache;
  return cache;
}

// Choices made once for the whole process and shared by every thread's cache: the algorithm a
// library's own timing picked for a plan key (cuBLASLt, gemm_cublaslt.cpp). Timing is noisy: two
// threads timing the same problem under load can pick different algorithms, and the same product
// would then give other bits on autograd's backward thread (a recomputed forward, say) than on
// the thread that ran the forward, or after its plan was evicted and rebuilt. The first choice
// stored for a key is the process's and later ones adopt it; a thread that finds it takes it
// without timing anything. Past the capacity nothing more is stored (such a thread keeps its own
// choice); an entry is a key (192 bytes) and the choice.
constexpr size_t kSharedChoiceCapacity = 4096;

template <typename Value>
class SharedChoices {
 public:
  explicit SharedChoices(size_t capacity = kSharedChoiceCapacity) : capacity_(capacity) {}

  // Copies the choice stored for key into *out; false when there is none.
  bool find(const PlanKey& key, Value* out) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = choices_.find(key);
    if (it == choices_.end()) return false;
    *out = it->second;
    return true;
  }

  // Stores value for key unless a choice is there already (or the table is full); returns the
  // choice the caller should use: the stored one, else value.
  Value settle(const PlanKey& key, const Value& value) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = choices_.find(key);
    if (it != choices_.end()) return it->second;
    if (choices_.size() < capacity_) choices_.emplace(key, value);
    return value;
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return choices_.size();
  }

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  std::unordered_map<PlanKey, Value, PlanKeyHash> choices_;
};

// The process's table of Value choices (one per value type, i.e. per library).
template <typename Value>
SharedChoices<Value>& process_choices() {
  static SharedChoices<Value> choices;
  return choices;
}

// The descriptors of one matmul planned with an Lt-style library (cuBLASLt, hipBLASLt): the
// matmul descriptor, the layouts of A, B, C and D and the chosen algorithm, owned and released
// with the library's destroy calls. Api names the library's types and calls:
//   using MatmulDesc, Layout, Algo;
//   static void destroy_desc(MatmulDesc); static void destroy_layout(Layout);
template <typename Api>
struct LtMatmulPlan {
  typename Api::MatmulDesc desc = nullptr;
  typename Api::Layout a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  typename Api::Algo algo{};
  bool fused = true;  // false: plain GEMM in the library, the portable kernel applies the epilogue

  LtMatmulPlan() = default;
  LtMatmulPlan(const LtMatmulPlan&) = delete;
  LtMatmulPlan& operator=(const LtMatmulPlan&) = delete;
  ~LtMatmulPlan() { release(); }
  void release() {
    if (desc) Api::destroy_desc(desc);
    for (typename Api::Layout* layout : {&a, &b, &c, &d}) {
      if (*layout) Api::destroy_layout(*layout);
      *layout = nullptr;
    }
    desc = nullptr;
  }
};

// This thread's plan for g on device: the cached one, or a new one made by
// build(plan, g, fused) -> bool (false: the library has no algorithm for it). The epilogue is
// fused into the library call when that plan builds (try_fused false: the library is known to
// refuse it, don't ask); otherwise the plain product is planned and the portable kernel applies
// the epilogue afterwards -- never for an FP8 D, which cannot hold the unscaled product.
// `library` and device_name() (anything std::ostream prints, e.g. "sm_90" or "gfx942"; called
// only for a refusal) word the refusals.
template <typename Plan, typename Build, typename DeviceName>
Plan& cached_plan(const GemmArgs& g, int device, bool try_fused, Build&& build,
                  const char* library, DeviceName&& device_name) {
  PlanCache<Plan>& cache = thread_plan_cache<Plan>();
  const PlanKey key = plan_key(g, device);
  if (Plan* cached = cache.find(key)) return *cached;

  auto plan = std::make_unique<Plan>();
  bool ok = try_fused && build(*plan, g, /*fused=*/true);
  if (!ok && g.epilogue != kNVTEGemmEpilogueNone) {
    // The portable epilogue reads the product back from D, which an FP8 D cannot hold.
    if (is_fp8_type(g.d_type))
      TE_UNSUPPORTED(library, " cannot fuse the epilogue of ", describe_problem(g),
                     " and an FP8 D cannot take the unfused one; use a 16-bit D");
    ok = build(*plan, g, /*fused=*/false);
  }
  if (!ok)
    TE_UNSUPPORTED(library, " has no algorithm for ", describe_problem(g), " with ",
                   g.workspace_size, " bytes of workspace on ", device_name());
  return cache.insert(key, std::move(plan));
}

}  // namespace gemm
}  // namespace te
