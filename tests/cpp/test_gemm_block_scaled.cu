// C API tests of nvte_gemm_block_scaled: block-quantised operands (nvte_quantize_blockwise)
// multiplied on the GPU against the CPU product of the dequantised bytes; its refusals.
#include <cmath>
#include <cstring>

#include "test_common.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/gemm.h"

using namespace te_test;

namespace {

int device_cc() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor;
}

float e4m3_value(uint8_t bits) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E4M3);
  return __half2float(__half(h));
}

// A block-quantised [rows, cols] operand on the device plus its host copies.
struct Operand {
  int64_t rows, cols;
  int dim;
  DeviceBuffer<float> x;
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<float> sinv;
  Operand(int64_t r, int64_t c, int d, unsigned seed, float scale)
      : rows(r), cols(c), dim(d), x(random_floats(size_t(r * c), seed, scale)), q(size_t(r * c)),
        sinv(std::vector<float>(nvte_blockwise_scale_elems(r, c, d), 0.f)) {}
  NVTETensor quantized() { return desc(q.ptr, {rows, cols}, kNVTEFloat8E4M3, nullptr, nullptr, sinv.ptr); }
  bool quantize() {
    NVTETensor i = desc(x.ptr, {rows, cols}, kNVTEFloat32), o = quantized();
    return nvte_quantize_blockwise(&i, &o, nullptr, dim, true, nullptr) == kNVTESuccess;
  }
  // Dequantised values, from the bytes and scales the kernel wrote.
  std::vector<double> dequantized() const {
    auto b = q.download();
    auto s = sinv.download();
    const int64_t ld = dim == 2 ? (((cols + 127) / 128 + 3) / 4 * 4) : ((rows + 3) / 4 * 4);
    std::vector<double> v(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float si = dim == 2 ? s[(r / 128) * ld + c / 128] : s[(c / 128) * ld + r];
        v[r * cols + c] = double(e4m3_value(b[r * cols + c])) * si;
      }
    return v;
  }
};

}  // namespace

TE_TEST(gemm_block_scaled_matches_cpu) {
  const int64_t m = 256, n = 144, k = 384;
  const size_t ws_bytes = nvte_gemm_workspace_size();
  DeviceBuffer<uint8_t> ws(ws_bytes);
  const int dims[][2] = {{2, 1}, {1, 1}, {1, 2}};
  for (auto& d : dims) {
    Operand a(m, k, d[0], 21, 0.3f), b(n, k, d[1], 22, 3.f);
    TE_EXPECT(a.quantize() && b.quantize(), "%s", nvte_last_error_message());
    DeviceBuffer<float> out(size_t(n * m));
    NVTETensor ta = a.quantized(), tb = b.quantized(), td = desc(out.ptr, {n, m}, kNVTEFloat32);
    const auto mode = [](int dim) {
      return dim == 2 ? kNVTEGemmScaleBlock128x128 : kNVTEGemmScaleBlock1x128;
    };
    const NVTEStatus st = nvte_gemm_block_scaled(&ta, mode(d[0]), &tb, mode(d[1]), &td, nullptr,
                                                 ws.ptr, ws_bytes, nullptr);
    if (device_cc() != 90) {
      TE_EXPECT(st == kNVTEUnsupported, "status %d off sm_90", int(st));
      // cuBLASLt off sm_90, hipBLASLt, rocBLAS and the emulation's loop all name the recipe
      TE_EXPECT(std::strstr(nvte_last_error_message(), "Float8BlockScaling") != nullptr,
                "%s", nvte_last_error_message());
      continue;
    }
    TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    const auto av = a.dequantized(), bv = b.dequantized();
    const auto got = out.download();
    int bad = 0;
    double worst = 0;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double want = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          want += bv[j * k + p] * av[i * k + p];
          mag += std::fabs(bv[j * k + p] * av[i * k + p]);
        }
        const double err = std::fabs(got[j * m + i] - want);
        worst = std::fmax(worst, err / (mag + 1e-30));
        // Hopper's FP8 tensor cores accumulate with fewer bits than fp32: about 2^-13 of
        // the products' magnitude was measured on an H100; a wrong scale layout is off by O(1)
        bad += err > 5e-4 * mag + 1e-6;
      }
    TE_EXPECT(bad == 0, "%d of %lld results off (worst relative %g), dims %d x %d", bad,
              (long long)(m * n), worst, d[0], d[1]);
  }
}

TE_TEST(gemm_block_scaled_rejects_bad_arguments) {
  DeviceBuffer<uint8_t> a(128 * 128), b(64 * 128);
  DeviceBuffer<float> s(std::vector<float>(64, 1.f)), out(64 * 128);
  NVTETensor ta = desc(a.ptr, {128, 128}, kNVTEFloat8E4M3, nullptr, nullptr, s.ptr);
  NVTETensor tb = desc(b.ptr, {64, 128}, kNVTEFloat8E4M3, nullptr, nullptr, s.ptr);
  NVTETensor td = desc(out.ptr, {64, 128}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm_block_scaled(&ta, kNVTEGemmScaleBlock128x128, &tb, kNVTEGemmScaleBlock128x128,
                                   &td, nullptr, nullptr, 0, nullptr) == kNVTEInvalidArgument,
            "two 128x128 operands accepted");
  NVTETensor td_bad = desc(out.ptr, {128, 64}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm_block_scaled(&ta, kNVTEGemmScaleBlock128x128, &tb, kNVTEGemmScaleBlock1x128,
                                   &td_bad, nullptr, nullptr, 0, nullptr) == kNVTEInvalidArgument,
            "a D of the wrong shape accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_gemm_block_scaled") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor tb_nosinv = desc(b.ptr, {64, 128}, kNVTEFloat8E4M3);
  TE_EXPECT(nvte_gemm_block_scaled(&ta, kNVTEGemmScaleBlock128x128, &tb_nosinv,
                                   kNVTEGemmScaleBlock1x128, &td, nullptr, nullptr, 0,
                                   nullptr) == kNVTEInvalidArgument,
            "an operand without scales accepted");
}
