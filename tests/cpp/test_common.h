// Device buffers, random data and descriptors for the C API tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "test_harness.h"
#include "transformer_engine/transformer_engine.h"

namespace te_test {

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  // A buffer made by size starts with every bit set (NaN in fp32, fp16, bf16 and OCP FP8):
  // an element an op should write and does not then fails its comparison, an op that needs a
  // zeroed buffer fails unless the test zeroes it, and no test downloads undefined bytes
  // (compute-sanitizer's initcheck would report each one).
  explicit DeviceBuffer(size_t count) : DeviceBuffer(count, 0xff) {}
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size(), -1) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) {
    if (n) cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    if (n) cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  void fill_bytes(int byte) {
    if (n) cudaMemset(ptr, byte, n * sizeof(T));
  }

 private:
  DeviceBuffer(size_t count, int byte) : n(count) {
    if (count) cudaMalloc(&ptr, count * sizeof(T));
    if (byte >= 0) fill_bytes(byte);
  }
};

inline std::vector<float> random_floats(size_t n, unsigned seed, float scale = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline NVTETensor desc(void* data, std::vector<int64_t> shape, NVTEDType dtype, float* amax = nullptr,
                       float* scale = nullptr, float* scale_inv = nullptr) {
  NVTETensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.amax = amax;
  t.scale = scale;
  t.scale_inv = scale_inv;
  return t;
}

// OCP FP8 encodings on the host, the CPU loop the kernels are compared with.
inline uint8_t host_fp8(float x, bool e4m3) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// The largest finite E4M3 / E5M2 value of the FP8 flavour host_fp8 encodes (the build's: OCP on
// NVIDIA and gfx950, FNUZ on gfx942). E4M3: FNUZ saturates 448 to its maximum, 240; E5M2's
// maximum is 57344 in both flavours.
inline float host_fp8_max(bool e4m3) {
  if (!e4m3) return 57344.f;
  return host_fp8(448.f, true) == host_fp8(240.f, true) ? 240.f : 448.f;
}

inline bool cuda_ok() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) std::printf("  CUDA error: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace te_test
