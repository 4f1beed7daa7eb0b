// AMD fail-safes of the C API, run against the emulated library (plain host C++: device memory is
// host memory there). The device is made to report MI200's arch (gfx90a), which has no FP8: FP8
// casts and GEMMs must come back kNVTEUnsupported with a message naming the arch, while the same
// ops in bfloat16 still run.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "transformer_engine/cast.h"
#include "transformer_engine/gemm.h"
#include "transformer_engine/transformer_engine.h"

extern "C" void hipcpu_report_arch(const char* gcn_arch_name);

namespace {
int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("[%s] %s\n", ok ? "  OK  " : " FAIL ", what);
  if (!ok) {
    std::printf("       last error: %s\n", nvte_last_error_message());
    ++failures;
  }
}

NVTETensor tensor(void* data, NVTEDType dtype, int64_t rows, int64_t cols, float* scale = nullptr,
                  float* scale_inv = nullptr) {
  NVTETensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.scale = scale;
  t.scale_inv = scale_inv;
  return t;
}
}  // namespace

int main() {
  hipcpu_report_arch("gfx90a:sramecc+:xnack-");
  std::vector<float> x(37 * 23, 0.5f);
  std::vector<unsigned char> q(x.size());
  float scale = 1.f, scale_inv = 1.f;
  NVTETensor in = tensor(x.data(), kNVTEFloat32, 37, 23);
  NVTETensor out8 = tensor(q.data(), kNVTEFloat8E4M3, 37, 23, &scale, &scale_inv);
  const NVTEStatus cast = nvte_quantize(&in, &out8, nullptr);
  expect(cast == kNVTEUnsupported && std::strstr(nvte_last_error_message(), "gfx90a") &&
             std::strstr(nvte_last_error_message(), "nvte_quantize"),
         "gfx90a: nvte_quantize to FP8 is refused, naming the op and the arch");

  std::vector<unsigned char> a(16 * 32, 0x38), b(16 * 32, 0x38);
  std::vector<float> d(16 * 16);
  // The workspace must be 256-byte aligned: over-allocate and align by hand.
  std::vector<unsigned char> ws_storage((1 << 20) + 256);
  unsigned char* ws_data = ws_storage.data() + (256 - reinterpret_cast<uintptr_t>(ws_storage.data()) % 256) % 256;
  const size_t ws_size = 1 << 20;
  NVTETensor A = tensor(a.data(), kNVTEFloat8E4M3, 16, 32, nullptr, &scale_inv);
  NVTETensor B = tensor(b.data(), kNVTEFloat8E4M3, 16, 32, nullptr, &scale_inv);
  NVTETensor D = tensor(d.data(), kNVTEFloat32, 16, 16);
  const NVTEStatus gemm = nvte_gemm(&A, true, &B, false, &D, nullptr, nullptr,
                                    kNVTEGemmEpilogueNone, 1.f, 0.f, false, ws_data, ws_size,
                                    nullptr);
  expect(gemm == kNVTEUnsupported && std::strstr(nvte_last_error_message(), "gfx90a"),
         "gfx90a: FP8 nvte_gemm is refused, naming the arch");

  std::vector<unsigned short> a16(16 * 32, 0x3f80), b16(16 * 32, 0x3f80);  // bfloat16 1.0
  NVTETensor A16 = tensor(a16.data(), kNVTEBFloat16, 16, 32);
  NVTETensor B16 = tensor(b16.data(), kNVTEBFloat16, 16, 32);
  const NVTEStatus bf16 = nvte_gemm(&A16, true, &B16, false, &D, nullptr, nullptr,
                                    kNVTEGemmEpilogueNone, 1.f, 0.f, false, ws_data, ws_size,
                                    nullptr);
  expect(bf16 == kNVTESuccess && d[0] == 32.f && d[255] == 32.f,
         "gfx90a: a bfloat16 GEMM still runs (k = 32 ones: every entry 32)");
  std::printf("%d tests, %d passed, %d failed\n", 3, 3 - failures, failures);
  return failures ? 1 : 0;
}
