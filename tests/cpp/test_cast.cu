// C API tests of the cast, transpose and delayed-scaling families against CPU loops.
#include <cmath>

#include "test_common.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/recipe.h"
#include "transformer_engine/transpose.h"

using namespace te_test;

namespace {

void check_cast_transpose(int64_t rows, int64_t cols, bool e4m3, unsigned seed) {
  const size_t n = size_t(rows * cols);
  std::vector<float> x = random_floats(n, seed, 40.f);
  std::vector<__nv_bfloat16> xb(n);
  for (size_t i = 0; i < n; ++i) xb[i] = __float2bfloat16_rn(x[i]);
  DeviceBuffer<__nv_bfloat16> in(xb);
  DeviceBuffer<uint8_t> out(n), out_t(n);
  out.fill_bytes(0x5a);
  out_t.fill_bytes(0x5a);
  const float scale_v = 3.5f;
  DeviceBuffer<float> scale(std::vector<float>{scale_v}), amax(std::vector<float>{0.f}),
      scale_inv(std::vector<float>{0.f});
  NVTEDType t8 = e4m3 ? kNVTEFloat8E4M3 : kNVTEFloat8E5M2;
  NVTETensor i = desc(in.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor o = desc(out.ptr, {rows, cols}, t8, amax.ptr, scale.ptr, scale_inv.ptr);
  NVTETensor ot = desc(out_t.ptr, {cols, rows}, t8);
  TE_EXPECT(nvte_cast_transpose(&i, &o, &ot, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = out.download(), got_t = out_t.download();
  float want_amax = 0.f;
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = __bfloat162float(xb[r * cols + c]);
      want_amax = std::fmax(want_amax, std::fabs(v));
      const uint8_t q = host_fp8(v * scale_v, e4m3);
      bad += got[r * cols + c] != q;
      bad += got_t[c * rows + r] != q;
    }
  TE_EXPECT(bad == 0, "%d mismatching bytes at %lld x %lld", bad, (long long)rows, (long long)cols);
  TE_EXPECT(amax.download()[0] == want_amax, "amax %g vs %g", amax.download()[0], want_amax);
  TE_EXPECT(scale_inv.download()[0] == 1.f / scale_v, "scale_inv");
}

}  // namespace

TE_TEST(cast_transpose_matches_cpu) {
  const int64_t shapes[][2] = {{37, 23}, {128, 128}, {256, 4096}, {1, 1}, {48, 16}, {300, 129}};
  unsigned seed = 1;
  for (auto& s : shapes) {
    check_cast_transpose(s[0], s[1], true, seed++);
    check_cast_transpose(s[0], s[1], false, seed++);
  }
}

TE_TEST(quantize_and_dequantize_match_cpu) {
  const size_t n = 1000 * 37 + 5;
  std::vector<float> x = random_floats(n, 7, 100.f);
  DeviceBuffer<float> in(x), deq(n);
  DeviceBuffer<uint8_t> q(n);
  DeviceBuffer<float> scale(std::vector<float>{2.f}), amax(std::vector<float>{0.f}),
      scale_inv(std::vector<float>{0.f});
  NVTETensor i = desc(in.ptr, {int64_t(n)}, kNVTEFloat32);
  NVTETensor o = desc(q.ptr, {int64_t(n)}, kNVTEFloat8E4M3, amax.ptr, scale.ptr, scale_inv.ptr);
  TE_EXPECT(nvte_quantize(&i, &o, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  NVTETensor d = desc(deq.ptr, {int64_t(n)}, kNVTEFloat32);
  TE_EXPECT(nvte_dequantize(&o, &d, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = q.download();
  auto back = deq.download();
  int bad = 0, bad_deq = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t want = host_fp8(x[k] * 2.f, true);
    bad += got[k] != want;
    __half_raw h = __nv_cvt_fp8_to_halfraw(want, __NV_E4M3);
    bad_deq += back[k] != __half2float(__half(h)) * 0.5f;
  }
  TE_EXPECT(bad == 0 && bad_deq == 0, "%d quantize / %d dequantize mismatches", bad, bad_deq);
}

TE_TEST(delayed_scaling_update_matches_cpu) {
  const int64_t len = 5, n = 7;
  std::vector<float> h = random_floats(size_t(len * n), 3, 10.f);
  for (auto& v : h) v = std::fabs(v);
  for (int64_t l = 0; l < len; ++l) h[l * n + 2] = 0.f;  // amax 0 keeps the old scale
  h[1 * n + 3] = INFINITY;                                // non-finite amax keeps it too
  std::vector<float> s(n, 1.5f);
  DeviceBuffer<float> hist(h), scale(s), scale_inv{size_t(n)};
  NVTEScalingGroup g{hist.ptr, scale.ptr, scale_inv.ptr, len, n, 448.f};
  TE_EXPECT(nvte_delayed_scaling_update(&g, 1, kNVTEAmaxMax, 1.f, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto nh = hist.download(), ns = scale.download(), nsi = scale_inv.download();
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.f;
    for (int64_t l = 0; l < len; ++l) amax = std::fmax(amax, h[l * n + j]);
    const float cand = (448.f / amax) / 2.f;
    const float want = (amax > 0 && std::isfinite(amax)) ? cand : 1.5f;
    TE_EXPECT(ns[j] == want, "scale[%lld] %g vs %g", (long long)j, ns[j], want);
    TE_EXPECT(nsi[j] == 1.f / want, "scale_inv[%lld]", (long long)j);
    TE_EXPECT(nh[j] == 0.f, "history row 0 cleared");
    for (int64_t l = 1; l + 1 < len; ++l)
      TE_EXPECT(nh[l * n + j] == h[(l + 1) * n + j], "history rolled by one at row %lld", (long long)l);
    TE_EXPECT(nh[(len - 1) * n + j] == h[j], "roll wraps row 0 to the end");
  }
}

TE_TEST(bad_input_returns_status_and_message) {
  DeviceBuffer<float> in(16);
  DeviceBuffer<uint8_t> out(8);
  NVTETensor i = desc(in.ptr, {16}, kNVTEFloat32);
  NVTETensor o = desc(out.ptr, {8}, kNVTEFloat8E4M3);
  TE_EXPECT(nvte_quantize(&i, &o, nullptr) == kNVTEInvalidArgument, "size mismatch accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_quantize") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor wrong = desc(in.ptr, {16}, kNVTEInt32);
  NVTETensor o16 = desc(out.ptr, {16}, kNVTEFloat8E4M3);
  TE_EXPECT(nvte_quantize(&wrong, &o16, nullptr) == kNVTEInvalidArgument, "int32 input accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "int32") != nullptr, "%s", nvte_last_error_message());
}
