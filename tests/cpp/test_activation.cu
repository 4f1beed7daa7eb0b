// C API tests of the activation family against CPU loops in double precision.
#include <cmath>
#include <cstdint>

#include "test_common.h"
#include "transformer_engine/activation.h"

using namespace te_test;

namespace {

double act_value(NVTEActivation a, double x) {
  const double s17 = 1.0 / (1.0 + std::exp(-1.702 * x)), s1 = 1.0 / (1.0 + std::exp(-x));
  switch (a) {
    case kNVTEGelu: return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case kNVTERelu: return x > 0 ? x : 0;
    case kNVTEQGelu: return x * s17;
    case kNVTESRelu: return x > 0 ? x * x : 0;
    default: return x * s1;
  }
}

double act_deriv(NVTEActivation a, double x) {
  const double h = 1e-6;  // central difference of the double model (smooth away from 0)
  if (a == kNVTERelu) return x > 0 ? 1 : 0;
  if (a == kNVTESRelu) return x > 0 ? 2 * x : 0;
  return (act_value(a, x + h) - act_value(a, x - h)) / (2 * h);
}

bool near(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

const NVTEActivation kAll[] = {kNVTEGelu, kNVTERelu, kNVTEQGelu, kNVTESRelu, kNVTESilu};

}  // namespace

TE_TEST(act_plain_forward_backward_fp32) {
  const int64_t rows = 37, cols = 23;
  const size_t n = size_t(rows * cols);
  std::vector<float> x = random_floats(n, 1, 2.f), g = random_floats(n, 2, 1.f);
  DeviceBuffer<float> dx_in(x), dg(g), y(n), dx(n);
  for (NVTEActivation a : kAll) {
    NVTETensor ti = desc(dx_in.ptr, {rows, cols}, kNVTEFloat32);
    NVTETensor tg = desc(dg.ptr, {rows, cols}, kNVTEFloat32);
    NVTETensor ty = desc(y.ptr, {rows, cols}, kNVTEFloat32);
    NVTETensor tdx = desc(dx.ptr, {rows, cols}, kNVTEFloat32);
    TE_EXPECT(nvte_activation(a, &ti, &ty, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
    TE_EXPECT(nvte_dactivation(a, &tg, &ti, &tdx, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    auto hy = y.download(), hdx = dx.download();
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += !near(hy[i], act_value(a, x[i]), 2e-6, 2e-6);
      bad += !near(hdx[i], g[i] * act_deriv(a, x[i]), 1e-4, 1e-5);
    }
    TE_EXPECT(bad == 0, "%s: %d mismatches", nvte_activation_name(a), bad);
  }
}

TE_TEST(act_gated_bf16_matches_cpu) {
  const int64_t widths[] = {23, 64};  // odd width: scalar path; 64: 16-element vectors
  for (int64_t nw : widths) {
    const int64_t rows = 19;
    const size_t nin = size_t(rows * 2 * nw), nout = size_t(rows * nw);
    std::vector<float> xf = random_floats(nin, 3, 2.f), gf = random_floats(nout, 4, 1.f);
    std::vector<__nv_bfloat16> xb(nin), gb(nout);
    for (size_t i = 0; i < nin; ++i) xb[i] = __float2bfloat16_rn(xf[i]);
    for (size_t i = 0; i < nout; ++i) gb[i] = __float2bfloat16_rn(gf[i]);
    DeviceBuffer<__nv_bfloat16> in(xb), grad(gb), y(nout), dx(nin);
    for (NVTEActivation a : kAll) {
      NVTETensor ti = desc(in.ptr, {rows, 2 * nw}, kNVTEBFloat16);
      NVTETensor tg = desc(grad.ptr, {rows, nw}, kNVTEBFloat16);
      NVTETensor ty = desc(y.ptr, {rows, nw}, kNVTEBFloat16);
      NVTETensor tdx = desc(dx.ptr, {rows, 2 * nw}, kNVTEBFloat16);
      TE_EXPECT(nvte_gated_activation(a, &ti, &ty, nullptr) == kNVTESuccess, "%s",
                nvte_last_error_message());
      TE_EXPECT(nvte_dgated_activation(a, &tg, &ti, &tdx, nullptr) == kNVTESuccess, "%s",
                nvte_last_error_message());
      TE_EXPECT(cuda_ok(), "sync");
      auto hy = y.download(), hdx = dx.download();
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < nw; ++c) {
          const double av = __bfloat162float(xb[r * 2 * nw + c]);
          const double bv = __bfloat162float(xb[r * 2 * nw + nw + c]);
          const double gv = __bfloat162float(gb[r * nw + c]);
          bad += !near(__bfloat162float(hy[r * nw + c]), act_value(a, av) * bv, 1e-2, 1e-5);
          bad += !near(__bfloat162float(hdx[r * 2 * nw + c]), gv * bv * act_deriv(a, av), 1.6e-2, 1e-4);
          bad += !near(__bfloat162float(hdx[r * 2 * nw + nw + c]), gv * act_value(a, av), 1e-2, 1e-5);
        }
      TE_EXPECT(bad == 0, "%s width %lld: %d mismatches", nvte_activation_name(a), (long long)nw, bad);
    }
  }
}

TE_TEST(act_relu_fp8_output_bit_exact) {
  const size_t n = 4096 + 7;
  std::vector<float> x = random_floats(n, 5, 3.f);
  DeviceBuffer<float> in(x), scale(std::vector<float>{20.f}), amax(std::vector<float>{0.f}),
      scale_inv(std::vector<float>{0.f});
  DeviceBuffer<uint8_t> out(n);
  NVTETensor ti = desc(in.ptr, {int64_t(n)}, kNVTEFloat32);
  NVTETensor to = desc(out.ptr, {int64_t(n)}, kNVTEFloat8E4M3, amax.ptr, scale.ptr, scale_inv.ptr);
  TE_EXPECT(nvte_relu(&ti, &to, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = out.download();
  float want_amax = 0.f;
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float r = x[i] > 0 ? x[i] : 0.f;
    want_amax = std::fmax(want_amax, r);
    bad += got[i] != host_fp8(r * 20.f, true);
  }
  TE_EXPECT(bad == 0, "%d mismatching bytes", bad);
  TE_EXPECT(amax.download()[0] == want_amax, "amax %g vs %g", amax.download()[0], want_amax);
  TE_EXPECT(scale_inv.download()[0] == 1.f / 20.f, "scale_inv");
}

TE_TEST(act_dbias_dact_matches_cpu) {
  const int64_t shapes[][2] = {{300, 136}, {37, 23}, {1, 8}, {2048, 64}};
  for (auto& sh : shapes) {
    const int64_t rows = sh[0], cols = sh[1];
    const size_t n = size_t(rows * cols);
    std::vector<float> x = random_floats(n, 6, 2.f), g = random_floats(n, 7, 1.f);
    DeviceBuffer<float> in(x), grad(g), dx(n), dbias{size_t(cols)};
    for (NVTEActivation a : kAll) {
      NVTETensor ti = desc(in.ptr, {rows, cols}, kNVTEFloat32);
      NVTETensor tg = desc(grad.ptr, {rows, cols}, kNVTEFloat32);
      NVTETensor tdx = desc(dx.ptr, {rows, cols}, kNVTEFloat32);
      NVTETensor tb = desc(dbias.ptr, {cols}, kNVTEFloat32);
      NVTETensor ws{};
      TE_EXPECT(nvte_dbias_dactivation(a, &tg, &ti, &tdx, &tb, &ws, nullptr) == kNVTESuccess, "%s",
                nvte_last_error_message());
      TE_EXPECT(ws.dtype == kNVTEFloat32 && ws.ndim == 2 && ws.shape[1] == cols, "workspace query");
      DeviceBuffer<float> wbuf{size_t(ws.shape[0] * ws.shape[1])};
      ws.data = wbuf.ptr;
      TE_EXPECT(nvte_dbias_dactivation(a, &tg, &ti, &tdx, &tb, &ws, nullptr) == kNVTESuccess, "%s",
                nvte_last_error_message());
      TE_EXPECT(cuda_ok(), "sync");
      auto hdx = dx.download(), hb = dbias.download();
      int bad = 0;
      std::vector<double> sums(size_t(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = size_t(r * cols + c);
          bad += !near(hdx[i], g[i] * act_deriv(a, x[i]), 1e-4, 1e-5);
          sums[size_t(c)] += hdx[i];
        }
      for (int64_t c = 0; c < cols; ++c) bad += !near(hb[size_t(c)], sums[size_t(c)], 1e-5, 1e-4);
      TE_EXPECT(bad == 0, "%s %lld x %lld: %d mismatches", nvte_activation_name(a),
                (long long)rows, (long long)cols, bad);
    }
  }
}

TE_TEST(act_bad_input_returns_status_and_message) {
  DeviceBuffer<float> in(30), out(15);
  NVTETensor ti = desc(in.ptr, {3, 5}, kNVTEFloat32);
  NVTETensor to = desc(out.ptr, {3, 2}, kNVTEFloat32);
  TE_EXPECT(nvte_swiglu(&ti, &to, nullptr) == kNVTEInvalidArgument, "odd gated width accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_gated_activation") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor t16 = desc(out.ptr, {3, 5}, kNVTEFloat16);
  TE_EXPECT(nvte_gelu(&ti, &t16, nullptr) == kNVTEInvalidArgument, "fp16 output of fp32 input");
  TE_EXPECT(nvte_activation(NVTEActivation(9), &ti, &ti, nullptr) == kNVTEInvalidArgument,
            "bad activation code accepted");
}
