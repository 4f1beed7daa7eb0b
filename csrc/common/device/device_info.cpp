// transformer_engine/device.h, written once in CUDA runtime calls; the ROCm build hipifies it.
// What the vendors' answers mean (the arch's name, which archs lack FP8, the backend's name)
// comes from util/arch.h.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>

#include "transformer_engine/device.h"
#include "util/arch.h"
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
void check_runtime(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
    throw te::Error(kNVTEDeviceError, te::concat(what, " failed: ", cudaGetErrorString(err)));
  }
}
}  // namespace

extern "C" const char* nvte_build_backend(void) { return te::kBuildBackend; }
extern "C" const char* nvte_build_archs(void) { return NVTE_BUILD_ARCHS; }

extern "C" NVTEStatus nvte_device_count(int* count) {
  return te::guard("nvte_device_count", [&] {
    TE_CHECK_ARG(count != nullptr, "count is a null pointer");
    *count = 0;
    check_runtime(cudaGetDeviceCount(count), "cudaGetDeviceCount");
  });
}

extern "C" NVTEStatus nvte_current_device(int* device) {
  return te::guard("nvte_current_device", [&] {
    TE_CHECK_ARG(device != nullptr, "device is a null pointer");
    check_runtime(cudaGetDevice(device), "cudaGetDevice");
  });
}

extern "C" NVTEStatus nvte_device_arch(int device, char* arch, size_t arch_len, char* name,
                                       size_t name_len) {
  return te::guard("nvte_device_arch", [&] {
    cudaDeviceProp prop;
    check_runtime(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    char buf[256];
    te::device_arch_name(prop, buf, sizeof(buf));
    copy_str(buf, arch, arch_len);
    copy_str(prop.name, name, name_len);
  });
}

// The answer is kept per device: check_tensor asks for every FP8 descriptor. Where no device
// lacks FP8 (NVIDIA) it is a constant.
const char* te::fp8_unsupported_arch() {
  if (!kSomeDevicesLackFp8) return nullptr;
  constexpr int kDevices = 64;
  static const char kHasFp8[] = "";
  static std::atomic<const char*> known[kDevices];  // null: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    (void)cudaGetLastError();
    return nullptr;  // the op itself reports the device error
  }
  const char* k = known[device].load(std::memory_order_relaxed);
  if (k == nullptr) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    char arch[256];
    device_arch_name(prop, arch, sizeof(arch));
    const char* lacking = arch_without_fp8(arch);
    k = lacking != nullptr ? lacking : kHasFp8;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == kHasFp8 ? nullptr : k;
}
