// C API tests of the fused softmax family against CPU loops in double precision.
#include <cmath>
#include <cstring>

#include "test_common.h"
#include "transformer_engine/softmax.h"

using namespace te_test;

namespace {

enum Kind { kPlain, kMasked, kCausal };

// Forward and backward on the CPU; `mask` is [mb, 1, sq, sk] (broadcast over heads) for kMasked.
void cpu_softmax(const std::vector<float>& x, const std::vector<uint8_t>& mask,
                 const std::vector<float>& dy, int64_t b, int64_t h, int64_t sq, int64_t sk,
                 int64_t mb, float scale, Kind kind, std::vector<double>* y,
                 std::vector<double>* dx) {
  y->assign(x.size(), 0.0);
  dx->assign(x.size(), 0.0);
  for (int64_t r = 0; r < b * h * sq; ++r) {
    const int64_t q = r % sq, bi = r / (h * sq);
    auto masked = [&](int64_t j) {
      if (kind == kCausal) return j > q;
      if (kind == kMasked) return mask[((mb == 1 ? 0 : bi) * sq + q) * sk + j] != 0;
      return false;
    };
    double mx = -INFINITY, sum = 0, dot = 0;
    for (int64_t j = 0; j < sk; ++j)
      if (!masked(j)) mx = std::fmax(mx, double(x[r * sk + j]) * scale);
    for (int64_t j = 0; j < sk; ++j)
      if (!masked(j)) sum += std::exp(double(x[r * sk + j]) * scale - mx);
    for (int64_t j = 0; j < sk; ++j) {
      const double v = masked(j) ? 0.0 : std::exp(double(x[r * sk + j]) * scale - mx) / sum;
      (*y)[r * sk + j] = v;
      dot += v * dy[r * sk + j];
    }
    for (int64_t j = 0; j < sk; ++j)
      (*dx)[r * sk + j] = scale * (*y)[r * sk + j] * (dy[r * sk + j] - dot);
  }
}

void check(Kind kind, int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t mb, unsigned seed) {
  const size_t n = size_t(b * h * sq * sk);
  const float scale = 0.125f;
  std::vector<float> x = random_floats(n, seed, 4.f), dy = random_floats(n, seed + 1);
  std::vector<__half> xh(n), dyh(n);
  for (size_t i = 0; i < n; ++i) {
    xh[i] = __float2half_rn(x[i]);
    x[i] = __half2float(xh[i]);
    dyh[i] = __float2half_rn(dy[i]);
    dy[i] = __half2float(dyh[i]);
  }
  std::vector<uint8_t> mask(size_t(mb * sq * sk));
  std::vector<float> m = random_floats(mask.size(), seed + 2);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = m[i] > 0.5f;
  std::vector<double> want_y, want_dx;
  cpu_softmax(x, mask, dy, b, h, sq, sk, mb, scale, kind, &want_y, &want_dx);

  DeviceBuffer<__half> dx_in(xh), ddy(dyh), dyout(n), ddx(n);
  DeviceBuffer<uint8_t> dmask(mask);
  const std::vector<int64_t> shape = kind == kCausal ? std::vector<int64_t>{b * h, sq, sk}
                                                     : std::vector<int64_t>{b, h, sq, sk};
  NVTETensor tx = desc(dx_in.ptr, shape, kNVTEFloat16), ty = desc(dyout.ptr, shape, kNVTEFloat16);
  NVTETensor tm = desc(dmask.ptr, {mb, 1, sq, sk}, kNVTEByte);
  NVTEStatus st;
  if (kind == kCausal)
    st = nvte_scaled_upper_triang_masked_softmax_forward(&tx, &ty, scale, nullptr);
  else if (kind == kMasked)
    st = nvte_scaled_masked_softmax_forward(&tx, &tm, &ty, scale, nullptr);
  else
    st = nvte_scaled_softmax_forward(&tx, &ty, scale, nullptr);
  TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());
  NVTETensor tdy = desc(ddy.ptr, shape, kNVTEFloat16), tdx = desc(ddx.ptr, shape, kNVTEFloat16);
  st = kind == kCausal
           ? nvte_scaled_upper_triang_masked_softmax_backward(&tdy, &ty, &tdx, scale, nullptr)
       : kind == kMasked ? nvte_scaled_masked_softmax_backward(&tdy, &ty, &tdx, scale, nullptr)
                         : nvte_scaled_softmax_backward(&tdy, &ty, &tdx, scale, nullptr);
  TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto y = dyout.download(), dx = ddx.download();
  int bad_y = 0, bad_dx = 0;
  for (size_t i = 0; i < n; ++i) {
    const double gy = __half2float(y[i]), gdx = __half2float(dx[i]);
    bad_y += std::fabs(gy - want_y[i]) > 1e-3 * std::fabs(want_y[i]) + 1e-5;
    // dx is computed from the rounded y: allow y's rounding through the formula.
    bad_dx += std::fabs(gdx - want_dx[i]) > 4e-3 * std::fabs(want_dx[i]) + 2e-4;
    if (want_y[i] == 0.0) bad_y += gy != 0.0;  // masked elements are exact zeros
  }
  TE_EXPECT(bad_y == 0 && bad_dx == 0, "kind %d [%lld, %lld, %lld, %lld]: %d y, %d dx mismatches",
            int(kind), (long long)b, (long long)h, (long long)sq, (long long)sk, bad_y, bad_dx);
}

}  // namespace

TE_TEST(softmax_matches_cpu) {
  const int64_t shapes[][4] = {{2, 3, 5, 37}, {1, 2, 16, 128}, {1, 1, 8, 4096}, {1, 1, 2, 16384},
                               {1, 1, 3, 1001}, {1, 1, 2, 16392}};
  unsigned seed = 1;
  for (auto& s : shapes) {
    check(kPlain, s[0], s[1], s[2], s[3], 1, seed++);
    check(kMasked, s[0], s[1], s[2], s[3], 1, seed++);
    check(kMasked, s[0], s[1], s[2], s[3], s[0], seed++);
  }
  const int64_t causal[][2] = {{3, 37}, {2, 128}, {1, 1000}, {1, 1001}};
  for (auto& c : causal) check(kCausal, c[0], 1, c[1], c[1], 1, seed++);
}

TE_TEST(softmax_bad_input_returns_status) {
  DeviceBuffer<float> x(64), y(64);
  NVTETensor tx = desc(x.ptr, {4, 16}, kNVTEFloat32), ty = desc(y.ptr, {4, 16}, kNVTEFloat32);
  TE_EXPECT(nvte_scaled_softmax_forward(&tx, &ty, 1.f, nullptr) == kNVTEInvalidArgument,
            "float32 accepted");
  const char* msg = nvte_last_error_message();
  TE_EXPECT(std::strstr(msg, "nvte_scaled_softmax_forward: input") != nullptr, "%s", msg);
  NVTETensor tx16 = desc(x.ptr, {2, 4, 8}, kNVTEFloat16);
  NVTETensor ty16 = desc(y.ptr, {2, 4, 8}, kNVTEFloat16);
  TE_EXPECT(nvte_scaled_upper_triang_masked_softmax_forward(&tx16, &ty16, 1.f, nullptr) ==
                kNVTEInvalidArgument, "sq != sk accepted");
}
