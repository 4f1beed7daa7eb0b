// A HIP-on-CPU runtime for running the hipified kernels of this project on a host compiler.
//
// What it models (and nothing more): a grid is run block after block; the threads of a block are
// fibers on one OS thread, switched only at __syncthreads and at wavefront collectives; a
// wavefront is 64 consecutive threads, and a shuffle synchronises only the lanes of its own
// wavefront. __shared__ storage is per block (blocks never overlap in time), device memory is
// host memory, streams and events are sequential, atomics are plain (nothing runs between two
// switch points). The device answers as an MI300X (gfx942, FNUZ FP8) or an MI355X (gfx950, OCP
// FP8), chosen by HIPCPU_GFX942 / HIPCPU_GFX950 at compile time.
//
// What it cannot do fails loudly: inline assembly reaches the host assembler (compile error),
// an __builtin_amdgcn_* not modelled here is an undeclared identifier, there is no GEMM library,
// a __trap() or divergent warp collective fails the launch (hipErrorLaunchFailure) with a message,
// and a deadlock (lanes waiting at a barrier that can never complete) does too.
#pragma once

#if !defined(HIPCPU_GFX942) && !defined(HIPCPU_GFX950)
#error "the HIP-on-CPU runtime needs -DHIPCPU_GFX942 or -DHIPCPU_GFX950"
#endif
#if !defined(__HIP_PLATFORM_AMD__)
#error "the HIP-on-CPU runtime stands for the AMD platform: compile with -D__HIP_PLATFORM_AMD__"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hipcpu_vector_types.h"

// ---- qualifiers ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// Blocks run one after another on one OS thread, so a function-local static is exactly one
// block's shared storage (left uninitialised between blocks in spirit: nothing may rely on it).
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))

// ---- errors, devices, streams ----------------------------------------------------------------
enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidDeviceFunction = 98,
  hipErrorLaunchFailure = 719,
  hipErrorNotSupported = 801,
  hipErrorCooperativeLaunchTooLarge = 720,
};
typedef struct hipcpu_stream* hipStream_t;
typedef struct hipcpu_event* hipEvent_t;
enum hipMemcpyKind {
  hipMemcpyHostToHost = 0,
  hipMemcpyHostToDevice = 1,
  hipMemcpyDeviceToHost = 2,
  hipMemcpyDeviceToDevice = 3,
  hipMemcpyDefault = 4,
};
enum hipDeviceAttribute_t {
  hipDeviceAttributeComputeCapabilityMajor,
  hipDeviceAttributeComputeCapabilityMinor,
  hipDeviceAttributeMultiprocessorCount,
  hipDeviceAttributeMaxSharedMemoryPerBlock,
  hipDeviceAttributeMaxThreadsPerBlock,
  hipDeviceAttributeWarpSize,
  hipDeviceAttributeSharedMemPerBlockOptin,
};
enum hipFuncAttribute {
  hipFuncAttributeMaxDynamicSharedMemorySize,
  hipFuncAttributePreferredSharedMemoryCarveout,
};
enum hipStreamCaptureStatus {
  hipStreamCaptureStatusNone = 0,
  hipStreamCaptureStatusActive = 1,
  hipStreamCaptureStatusInvalidated = 2,
};
struct hipDeviceProp_t {
  char name[256];
  char gcnArchName[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major, minor;
  int clockRate;
};

hipError_t hipGetDeviceCount(int* count);
hipError_t hipGetDevice(int* device);
hipError_t hipSetDevice(int device);
hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device);
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device);
hipError_t hipGetLastError();
hipError_t hipPeekAtLastError();
const char* hipGetErrorString(hipError_t err);
const char* hipGetErrorName(hipError_t err);
hipError_t hipMalloc(void** ptr, size_t bytes);
template <typename T>
inline hipError_t hipMalloc(T** ptr, size_t bytes) {
  return hipMalloc(reinterpret_cast<void**>(ptr), bytes);
}
hipError_t hipFree(void* ptr);
hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind kind);
hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind kind,
                          hipStream_t stream = nullptr);
hipError_t hipMemset(void* dst, int value, size_t bytes);
hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t stream = nullptr);
hipError_t hipDeviceSynchronize();
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipStreamCreate(hipStream_t* stream);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamIsCapturing(hipStream_t stream, hipStreamCaptureStatus* status);
hipError_t hipFuncSetAttribute(const void* func, hipFuncAttribute attr, int value);
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func,
                                                        int block_size, size_t dynamic_smem);
template <typename F>
inline hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F func, int block_size,
                                                               size_t dynamic_smem) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(func), block_size, dynamic_smem);
}
// Grid-wide barriers are not modelled: a cooperative launch is refused, so callers take the path
// they use where a device refuses it.
hipError_t hipLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block, void** args,
                                      size_t smem, hipStream_t stream);

// ---- the lane being run ----------------------------------------------------------------------
namespace hipcpu {

struct LaneIndex {
  uint3 thread;
};
struct GridPosition {
  uint3 block;
  dim3 block_dim;
  dim3 grid_dim;
};
// Set by the scheduler before each fiber switch; read through the index macros.
LaneIndex* current_lane();
extern thread_local GridPosition grid_position;

constexpr int kWavefront = 64;

void syncthreads();
void syncwarp();
// Every live lane of the calling lane's wavefront contributes `value`; the result is the value of
// lane `source(lane)` (0 where that lane takes no part). `site` names the call site: lanes of
// one wavefront that meet at different collectives fail the launch (divergent collective).
uint64_t wavefront_exchange(uint64_t value, int source_lane, const void* site);
int lane_id();
void* dynamic_shared();
[[noreturn]] void trap(const char* why);

}  // namespace hipcpu

#define threadIdx (::hipcpu::current_lane()->thread)
#define blockIdx (::hipcpu::grid_position.block)
#define blockDim (::hipcpu::grid_position.block_dim)
#define gridDim (::hipcpu::grid_position.grid_dim)
constexpr int warpSize = ::hipcpu::kWavefront;

inline void __syncthreads() { ::hipcpu::syncthreads(); }
inline void __syncwarp(uint64_t = ~0ull) { ::hipcpu::syncwarp(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { ::hipcpu::trap("__trap() in a kernel"); }
inline int __lane_id() { return ::hipcpu::lane_id(); }

namespace hipcpu {
template <typename T>
inline T shuffle_from(T value, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "the HIP-on-CPU runtime shuffles values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = wavefront_exchange(bits, src, __builtin_return_address(0));
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace hipcpu

// HIP semantics: width divides 64; lanes read within their own segment of `width` lanes.
template <typename T>
__attribute__((noinline)) T __shfl(T var, int src_lane, int width = warpSize) {
  const int self = ::hipcpu::lane_id();
  const int src = (self & ~(width - 1)) + (src_lane & (width - 1));
  return ::hipcpu::shuffle_from(var, src);
}
template <typename T>
__attribute__((noinline)) T __shfl_xor(T var, int lane_mask, int width = warpSize) {
  const int self = ::hipcpu::lane_id();
  int src = self ^ lane_mask;
  if (src >= ((self + width) & ~(width - 1))) src = self;
  return ::hipcpu::shuffle_from(var, src);
}
template <typename T>
__attribute__((noinline)) T __shfl_down(T var, unsigned delta, int width = warpSize) {
  const int self = ::hipcpu::lane_id();
  const int src = (int((self & (width - 1)) + delta) >= width) ? self : self + int(delta);
  return ::hipcpu::shuffle_from(var, src);
}
template <typename T>
__attribute__((noinline)) T __shfl_up(T var, unsigned delta, int width = warpSize) {
  const int self = ::hipcpu::lane_id();
  const int src = (int(self & (width - 1)) - int(delta) < 0) ? self : self - int(delta);
  return ::hipcpu::shuffle_from(var, src);
}

// ---- atomics: plain read-modify-write (no lane runs between two switch points) --------------
template <typename T>
inline T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  T old = *p;
  *p = v;
  return old;
}
template <typename T>
inline T atomicOr(T* p, T v) {
  T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

// ---- math intrinsics -------------------------------------------------------------------------
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
using std::signbit;
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }

// ---- kernel launch ---------------------------------------------------------------------------
// The build rewrites `kernel<<<grid, block, smem, stream>>>(args)` into
// `kernel * ::hipcpu::LaunchConfig(grid, block, smem, stream)(args)`: the configuration binds the
// arguments, and `function * bound` runs the grid with one copy of the parameters per lane.
namespace hipcpu {

struct LaunchConfig;
template <typename... Args>
struct BoundLaunch;

struct LaunchConfig {
  dim3 grid, block;
  size_t dynamic_smem;
  hipStream_t stream;
  LaunchConfig(dim3 g, dim3 b, size_t smem = 0, hipStream_t s = nullptr)
      : grid(g), block(b), dynamic_smem(smem), stream(s) {}
  template <typename... Args>
  BoundLaunch<std::decay_t<Args>...> operator()(Args&&... args) const {
    return BoundLaunch<std::decay_t<Args>...>{*this, std::tuple<std::decay_t<Args>...>(
                                                         std::forward<Args>(args)...)};
  }
};

template <typename... Args>
struct BoundLaunch {
  LaunchConfig config;
  std::tuple<Args...> args;
};

// Runs body(lane) for every thread of every block; records the launch's error for hipGetLastError.
using LaneBody = void (*)(void* closure);
void run_grid(const LaunchConfig& config, const void* kernel, LaneBody body, void* closure);

template <typename... Params>
struct KernelCall {
  void (*kernel)(Params...);
  std::tuple<std::decay_t<Params>...> params;
  static void run(void* self) {
    auto* call = static_cast<KernelCall*>(self);
    std::tuple<std::decay_t<Params>...> mine = call->params;  // by-value parameters, per lane
    std::apply(call->kernel, mine);
  }
};

template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), const LaunchConfig& config, std::tuple<Args...>& args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong argument count");
  KernelCall<Params...> call{kernel, std::apply(
                                         [](auto&... a) {
                                           return std::tuple<std::decay_t<Params>...>(a...);
                                         },
                                         args)};
  run_grid(config, reinterpret_cast<const void*>(kernel), &KernelCall<Params...>::run, &call);
}

}  // namespace hipcpu

template <typename... Params, typename... Args>
inline void operator*(void (*kernel)(Params...), ::hipcpu::BoundLaunch<Args...>&& bound) {
  ::hipcpu::launch(kernel, bound.config, bound.args);
}
