// AMD implementation of transformer_engine/device.h. The arch comes from gcnArchName
// ("gfx942:sramecc+:xnack-"), with the target features stripped.
#include <hip/hip_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "transformer_engine/device.h"
#include "util/error.h"
#include "util/tensor.h"

#ifndef NVTE_BUILD_ARCHS
#define NVTE_BUILD_ARCHS ""
#endif

namespace {
void copy_str(const char* src, char* dst, size_t len) {
  if (dst == nullptr || len == 0) return;
  std::snprintf(dst, len, "%s", src);
}
void check_hip(hipError_t err, const char* what) {
  if (err != hipSuccess) {
    (void)hipGetLastError();
    throw te::Error(kNVTEDeviceError, te::concat(what, " failed: ", hipGetErrorString(err)));
  }
}
}  // namespace

extern "C" const char* nvte_build_backend(void) { return "rocm"; }
extern "C" const char* nvte_build_archs(void) { return NVTE_BUILD_ARCHS; }

extern "C" NVTEStatus nvte_device_count(int* count) {
  return te::guard("nvte_device_count", [&] {
    TE_CHECK_ARG(count != nullptr, "count is a null pointer");
    *count = 0;
    check_hip(hipGetDeviceCount(count), "hipGetDeviceCount");
  });
}

extern "C" NVTEStatus nvte_current_device(int* device) {
  return te::guard("nvte_current_device", [&] {
    TE_CHECK_ARG(device != nullptr, "device is a null pointer");
    check_hip(hipGetDevice(device), "hipGetDevice");
  });
}

extern "C" NVTEStatus nvte_device_arch(int device, char* arch, size_t arch_len, char* name,
                                       size_t name_len) {
  return te::guard("nvte_device_arch", [&] {
    hipDeviceProp_t prop;
    check_hip(hipGetDeviceProperties(&prop, device), "hipGetDeviceProperties");
    char buf[sizeof(prop.gcnArchName)];
    std::snprintf(buf, sizeof(buf), "%s", prop.gcnArchName);
    if (char* colon = std::strchr(buf, ':')) *colon = '\0';
    copy_str(buf, arch, arch_len);
    copy_str(prop.name, name, name_len);
  });
}

// MI200 (gfx90a) and MI100 (gfx908) have neither FP8 conversions nor FP8 matrix instructions.
// The answer is kept per device: check_tensor asks for every FP8 descriptor.
const char* te::fp8_unsupported_arch() {
  constexpr int kDevices = 64;
  static std::atomic<signed char> known[kDevices];  // 0 unknown, 1 has FP8, -1 gfx90a, -2 gfx908
  int device = 0;
  if (hipGetDevice(&device) != hipSuccess || device < 0 || device >= kDevices) {
    (void)hipGetLastError();
    return nullptr;  // the op itself reports the device error
  }
  signed char k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    hipDeviceProp_t prop;
    if (hipGetDeviceProperties(&prop, device) != hipSuccess) {
      (void)hipGetLastError();
      return nullptr;
    }
    k = std::strncmp(prop.gcnArchName, "gfx90a", 6) == 0   ? -1
        : std::strncmp(prop.gcnArchName, "gfx908", 6) == 0 ? -2
                                                           : 1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == -1 ? "gfx90a" : k == -2 ? "gfx908" : nullptr;
}
