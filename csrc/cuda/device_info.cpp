// NVIDIA implementation of transformer_engine/device.h.
#include <cuda_runtime.h>

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
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    throw te::Error(kNVTEDeviceError, te::concat(what, " failed: ", cudaGetErrorString(err)));
  }
}
}  // namespace

extern "C" const char* nvte_build_backend(void) { return "cuda"; }
extern "C" const char* nvte_build_archs(void) { return NVTE_BUILD_ARCHS; }

extern "C" NVTEStatus nvte_device_count(int* count) {
  return te::guard("nvte_device_count", [&] {
    TE_CHECK_ARG(count != nullptr, "count is a null pointer");
    *count = 0;
    check_cuda(cudaGetDeviceCount(count), "cudaGetDeviceCount");
  });
}

extern "C" NVTEStatus nvte_current_device(int* device) {
  return te::guard("nvte_current_device", [&] {
    TE_CHECK_ARG(device != nullptr, "device is a null pointer");
    check_cuda(cudaGetDevice(device), "cudaGetDevice");
  });
}

extern "C" NVTEStatus nvte_device_arch(int device, char* arch, size_t arch_len, char* name,
                                       size_t name_len) {
  return te::guard("nvte_device_arch", [&] {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(major)");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "cudaDeviceGetAttribute(minor)");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "sm_%d%d", major, minor);
    copy_str(buf, arch, arch_len);
    cudaDeviceProp prop;
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    copy_str(prop.name, name, name_len);
  });
}

// Every NVIDIA device we build for handles FP8 tensors (hardware conversion from sm_89, software
// below): nothing is refused.
const char* te::fp8_unsupported_arch() { return nullptr; }
