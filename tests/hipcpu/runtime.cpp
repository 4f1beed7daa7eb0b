// The HIP-on-CPU runtime: fibers for the threads of a block, barriers for __syncthreads and for
// the lanes of one 64-wide wavefront, and the host API (memory, streams, device queries).
#include <hip/hip_runtime.h>
#include <sys/mman.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

extern "C" void hipcpu_fiber_switch(void** save_sp, void* load_sp);

namespace hipcpu {
namespace {

#if defined(HIPCPU_GFX950)
constexpr const char* kDeviceName = "AMD Instinct MI355X (HIP-on-CPU emulation, wave64)";
constexpr const char* kArchName = "gfx950:sramecc+:xnack-";
constexpr int kComputeUnits = 256;
constexpr int kLdsBytes = 160 * 1024;
constexpr int kMinor = 5;
#else
constexpr const char* kDeviceName = "AMD Instinct MI300X (HIP-on-CPU emulation, wave64)";
constexpr const char* kArchName = "gfx942:sramecc+:xnack-";
constexpr int kComputeUnits = 304;
constexpr int kLdsBytes = 64 * 1024;
constexpr int kMinor = 4;
#endif
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { kReady, kWaitBlock, kWaitWave, kDone };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;  // lowest address of the mapping (a guard page)
  LaneIndex index{};
  int wave = 0, lane = 0;
  State state = State::kReady;
};

struct Wave {
  int live = 0, arrived = 0, parity = 0;
  const void* site = nullptr;
  uint64_t slot[2][kWavefront];
  bool present[2][kWavefront];
};

struct BlockRun {
  std::vector<Fiber> fibers;
  std::vector<Wave> waves;
  int live = 0, block_arrived = 0;
  LaneBody body = nullptr;
  void* closure = nullptr;
  std::string failure;  // non-empty: the launch failed, stop running lanes
};

thread_local BlockRun* g_run = nullptr;
thread_local Fiber* g_cur = nullptr;
thread_local void* g_scheduler_sp = nullptr;
thread_local hipError_t g_last_error = hipSuccess;
thread_local std::vector<char*> g_stacks;  // reused from launch to launch
thread_local std::vector<unsigned char> g_dynamic_shared;
std::recursive_mutex g_launch_mutex;  // __shared__ statics: one grid at a time in the process

char* stack_for(size_t i) {
  while (g_stacks.size() <= i) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "hipcpu: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(p, 4096, PROT_NONE);  // overflow faults instead of corrupting a neighbour
    g_stacks.push_back(static_cast<char*>(p));
  }
  return g_stacks[i];
}

void yield_to_scheduler() { hipcpu_fiber_switch(&g_cur->sp, g_scheduler_sp); }

[[noreturn]] void fail_launch(const std::string& why) {
  if (g_run->failure.empty()) g_run->failure = why;
  for (;;) yield_to_scheduler();  // never resumed: the scheduler stops at a failure
}

void release_block(BlockRun& run) {
  run.block_arrived = 0;
  for (Fiber& f : run.fibers)
    if (f.state == State::kWaitBlock) f.state = State::kReady;
}

void release_wave(BlockRun& run, int wave) {
  Wave& w = run.waves[wave];
  w.arrived = 0;
  w.parity ^= 1;
  std::memset(w.present[w.parity], 0, sizeof(w.present[w.parity]));
  for (Fiber& f : run.fibers)
    if (f.wave == wave && f.state == State::kWaitWave) f.state = State::kReady;
}

void fiber_entry() {
  g_run->body(g_run->closure);
  Fiber* f = g_cur;
  BlockRun& run = *g_run;
  f->state = State::kDone;
  run.live -= 1;
  Wave& w = run.waves[f->wave];
  w.live -= 1;
  if (w.arrived > 0 && w.arrived == w.live) release_wave(run, f->wave);
  if (run.block_arrived > 0 && run.block_arrived == run.live) release_block(run);
  for (;;) yield_to_scheduler();
}

void prepare(Fiber& f, char* stack) {
  f.stack = stack;
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 72);  // 8 mod 16 after the final ret
  uint32_t control[2];
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  std::memcpy(&sp[0], control, 8);
  for (int i = 1; i <= 6; ++i) sp[i] = 0;  // r15 r14 r13 r12 rbx rbp
  sp[7] = reinterpret_cast<uint64_t>(&fiber_entry);
  f.sp = sp;
  f.state = State::kReady;
}

std::string describe_block(const uint3& b) {
  return "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
}

// Runs the block at grid_position until every lane returned; false (and run.failure) otherwise.
bool run_block(BlockRun& run, const dim3& block) {
  const int n = int(block.x * block.y * block.z);
  run.fibers.resize(n);
  run.waves.assign((n + kWavefront - 1) / kWavefront, Wave{});
  for (Wave& w : run.waves) std::memset(w.present, 0, sizeof(w.present));
  for (int i = 0; i < n; ++i) {
    Fiber& f = run.fibers[i];
    prepare(f, stack_for(i));
    f.index.thread = uint3{unsigned(i % block.x), unsigned((i / block.x) % block.y),
                           unsigned(i / (block.x * block.y))};
    f.wave = i / kWavefront;
    f.lane = i % kWavefront;
    run.waves[f.wave].live += 1;
  }
  run.live = n;
  run.block_arrived = 0;
  while (run.live > 0 && run.failure.empty()) {
    bool progressed = false;
    for (Fiber& f : run.fibers) {
      if (f.state != State::kReady) continue;
      g_cur = &f;
      hipcpu_fiber_switch(&g_scheduler_sp, f.sp);
      progressed = true;
      if (!run.failure.empty()) break;
    }
    if (!progressed && run.live > 0 && run.failure.empty()) {
      int at_block = 0, at_wave = 0;
      for (Fiber& f : run.fibers) {
        at_block += f.state == State::kWaitBlock;
        at_wave += f.state == State::kWaitWave;
      }
      run.failure = "deadlock in " + describe_block(grid_position.block) + ": " +
                    std::to_string(at_block) + " lanes wait at __syncthreads, " +
                    std::to_string(at_wave) + " at a wavefront collective";
    }
  }
  g_cur = nullptr;
  return run.failure.empty();
}

}  // namespace

thread_local GridPosition grid_position;
char g_arch_name[64] = {0};  // set by hipcpu_report_arch (tests of arch-dependent host logic)

LaneIndex* current_lane() { return &g_cur->index; }
int lane_id() { return g_cur->lane; }
void* dynamic_shared() { return g_dynamic_shared.data(); }

void trap(const char* why) {
  if (g_cur == nullptr) {
    std::fprintf(stderr, "hipcpu: %s outside a kernel\n", why);
    std::abort();
  }
  fail_launch(std::string(why) + " in " + describe_block(grid_position.block) + ", thread " +
              std::to_string(g_cur->index.thread.x));
}

void syncthreads() {
  BlockRun& run = *g_run;
  run.block_arrived += 1;
  if (run.block_arrived == run.live) {
    release_block(run);
    return;
  }
  g_cur->state = State::kWaitBlock;
  yield_to_scheduler();
}

uint64_t wavefront_exchange(uint64_t value, int source_lane, const void* site) {
  BlockRun& run = *g_run;
  Fiber* f = g_cur;
  Wave& w = run.waves[f->wave];
  const int p = w.parity;
  if (w.arrived == 0) {
    w.site = site;
  } else if (w.site != site) {
    fail_launch("divergent wavefront collective in " + describe_block(grid_position.block) +
                ": lanes of wavefront " + std::to_string(f->wave) +
                " reached different shuffles");
  }
  w.slot[p][f->lane] = value;
  w.present[p][f->lane] = true;
  w.arrived += 1;
  if (w.arrived == w.live) {
    release_wave(run, f->wave);
  } else {
    f->state = State::kWaitWave;
    yield_to_scheduler();
  }
  // A lane that takes no part (returned, or past the end of the block) gives 0.
  if (source_lane < 0 || source_lane >= kWavefront || !w.present[p][source_lane]) return 0;
  return w.slot[p][source_lane];
}

void syncwarp() { wavefront_exchange(0, 0, __builtin_return_address(0)); }

void run_grid(const LaunchConfig& config, const void* kernel, LaneBody body, void* closure) {
  (void)kernel;
  const dim3 g = config.grid, b = config.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0 || threads > kMaxThreadsPerBlock ||
      config.dynamic_smem > size_t(kLdsBytes)) {
    std::fprintf(stderr, "hipcpu: invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u), "
                 "%zu bytes of dynamic shared memory\n", g.x, g.y, g.z, b.x, b.y, b.z,
                 config.dynamic_smem);
    g_last_error = hipErrorInvalidValue;
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(g_launch_mutex);
  BlockRun run;
  BlockRun* outer = g_run;
  g_run = &run;
  run.body = body;
  run.closure = closure;
  g_dynamic_shared.assign(config.dynamic_smem + 128, 0xA5);  // not zero: nothing may rely on it
  grid_position.block_dim = b;
  grid_position.grid_dim = g;
  bool ok = true;
  for (unsigned z = 0; z < g.z && ok; ++z)
    for (unsigned y = 0; y < g.y && ok; ++y)
      for (unsigned x = 0; x < g.x && ok; ++x) {
        grid_position.block = uint3{x, y, z};
        ok = run_block(run, b);
      }
  g_run = outer;
  if (!ok) {
    std::fprintf(stderr, "hipcpu: kernel launch failed: %s\n", run.failure.c_str());
    g_last_error = hipErrorLaunchFailure;
  }
}

}  // namespace hipcpu

// ---- host API --------------------------------------------------------------------------------
namespace {
hipError_t set_error(hipError_t e) {
  if (e != hipSuccess) hipcpu::g_last_error = e;
  return e;
}
}  // namespace

hipError_t hipGetDeviceCount(int* count) {
  *count = 1;
  return hipSuccess;
}
hipError_t hipGetDevice(int* device) {
  *device = 0;
  return hipSuccess;
}
hipError_t hipSetDevice(int device) { return set_error(device == 0 ? hipSuccess : hipErrorInvalidDevice); }
hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
  if (device != 0) return set_error(hipErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "%s", hipcpu::kDeviceName);
  std::snprintf(prop->gcnArchName, sizeof(prop->gcnArchName), "%s",
                hipcpu::g_arch_name[0] ? hipcpu::g_arch_name : hipcpu::kArchName);
  prop->totalGlobalMem = size_t(192) << 30;
  prop->sharedMemPerBlock = hipcpu::kLdsBytes;
  prop->warpSize = hipcpu::kWavefront;
  prop->maxThreadsPerBlock = hipcpu::kMaxThreadsPerBlock;
  prop->multiProcessorCount = hipcpu::kComputeUnits;
  prop->major = 9;
  prop->minor = hipcpu::kMinor;
  prop->clockRate = 2100000;
  return hipSuccess;
}
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  if (device != 0) return set_error(hipErrorInvalidDevice);
  switch (attr) {
    case hipDeviceAttributeComputeCapabilityMajor: *value = 9; break;
    case hipDeviceAttributeComputeCapabilityMinor: *value = hipcpu::kMinor; break;
    case hipDeviceAttributeMultiprocessorCount: *value = hipcpu::kComputeUnits; break;
    case hipDeviceAttributeMaxSharedMemoryPerBlock:
    case hipDeviceAttributeSharedMemPerBlockOptin: *value = hipcpu::kLdsBytes; break;
    case hipDeviceAttributeMaxThreadsPerBlock: *value = hipcpu::kMaxThreadsPerBlock; break;
    case hipDeviceAttributeWarpSize: *value = hipcpu::kWavefront; break;
    default: return set_error(hipErrorInvalidValue);
  }
  return hipSuccess;
}
hipError_t hipGetLastError() {
  hipError_t e = hipcpu::g_last_error;
  hipcpu::g_last_error = hipSuccess;
  return e;
}
hipError_t hipPeekAtLastError() { return hipcpu::g_last_error; }
const char* hipGetErrorName(hipError_t err) {
  switch (err) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidDeviceFunction: return "hipErrorInvalidDeviceFunction";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    case hipErrorCooperativeLaunchTooLarge: return "hipErrorCooperativeLaunchTooLarge";
  }
  return "hipErrorUnknown";
}
const char* hipGetErrorString(hipError_t err) { return hipGetErrorName(err); }
hipError_t hipMalloc(void** ptr, size_t bytes) {
  *ptr = bytes ? std::aligned_alloc(256, (bytes + 255) & ~size_t(255)) : nullptr;
  return set_error(bytes && *ptr == nullptr ? hipErrorOutOfMemory : hipSuccess);
}
hipError_t hipFree(void* ptr) {
  std::free(ptr);
  return hipSuccess;
}
hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return hipSuccess;
}
hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind kind, hipStream_t) {
  return hipMemcpy(dst, src, bytes, kind);
}
hipError_t hipMemset(void* dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
  return hipSuccess;
}
hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t) {
  return hipMemset(dst, value, bytes);
}
hipError_t hipDeviceSynchronize() { return hipSuccess; }
hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
hipError_t hipStreamCreate(hipStream_t* stream) {
  *stream = reinterpret_cast<hipStream_t>(new char[1]);
  return hipSuccess;
}
hipError_t hipStreamDestroy(hipStream_t stream) {
  delete[] reinterpret_cast<char*>(stream);
  return hipSuccess;
}
hipError_t hipStreamIsCapturing(hipStream_t, hipStreamCaptureStatus* status) {
  *status = hipStreamCaptureStatusNone;
  return hipSuccess;
}
hipError_t hipFuncSetAttribute(const void*, hipFuncAttribute attr, int value) {
  if (attr == hipFuncAttributeMaxDynamicSharedMemorySize && value > hipcpu::kLdsBytes)
    return set_error(hipErrorInvalidValue);
  return hipSuccess;
}
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int block_size,
                                                        size_t) {
  *blocks = block_size > 0 ? (2048 / block_size > 0 ? 2048 / block_size : 1) : 1;
  return hipSuccess;
}
hipError_t hipLaunchCooperativeKernel(const void*, dim3, dim3, void**, size_t, hipStream_t) {
  return set_error(hipErrorNotSupported);
}

// Makes the device report another arch name to host code (the kernels stay those of the build):
// how the tests reach host logic that only another AMD arch takes, e.g. MI200's FP8 refusal.
extern "C" void hipcpu_report_arch(const char* gcn_arch_name) {
  std::snprintf(hipcpu::g_arch_name, sizeof(hipcpu::g_arch_name), "%s", gcn_arch_name);
}
