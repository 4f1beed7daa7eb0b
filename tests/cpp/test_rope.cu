// C API tests of the fused RoPE family against a CPU loop of the definition in rope.h.
#include <cmath>
#include <cstdint>

#include "test_common.h"
#include "transformer_engine/rope.h"

using namespace te_test;

namespace {

// Forward (or backward) of one token row of h heads of d elements, rotary dim R, in double.
void cpu_rope_row(const float* x, float* y, const float* f, int h, int d, int R, bool inter,
                  bool backward) {
  for (int hh = 0; hh < h; ++hh) {
    const float* xi = x + hh * d;
    float* yo = y + hh * d;
    for (int k = 0; k < d; ++k) yo[k] = xi[k];
    for (int k = 0; k < R; ++k) {
      int p;      // partner element
      double sg;  // sign of the partner term
      if (inter) { p = k ^ 1; sg = (k % 2 == 0) ? -1 : 1; }
      else { p = k < R / 2 ? k + R / 2 : k - R / 2; sg = k < R / 2 ? -1 : 1; }
      // forward: x[k] c[k] + sg x[p] s[k]; backward (transpose): g[k] c[k] - sg g[p] s[p]
      const double s = backward ? -std::sin(double(f[p])) : std::sin(double(f[k]));
      yo[k] = float(xi[k] * std::cos(double(f[k])) + sg * xi[p] * s);
    }
  }
}

void check(NVTERopeFormat fmt, bool inter, bool backward, int h, int d, int R) {
  const int s = 13, b = 3;
  const int64_t tokens = int64_t(s) * b;
  const size_t n = size_t(tokens * h * d);
  std::vector<float> x = random_floats(n, 11, 1.f), f = random_floats(size_t(s * R), 12, 30.f);
  std::vector<int32_t> cu = {0, 5, 5, 20, int32_t(tokens)};
  DeviceBuffer<float> dx(x), df(f), dy(n);
  DeviceBuffer<int32_t> dcu(cu);
  std::vector<int64_t> shape;
  if (fmt == kNVTERopeSBHD) shape = {s, b, h, d};
  else if (fmt == kNVTERopeBSHD) shape = {b, s, h, d};
  else shape = {tokens, h, d};
  NVTETensor ti = desc(dx.ptr, shape, kNVTEFloat32), to = desc(dy.ptr, shape, kNVTEFloat32);
  // thd positions reach 19 (sequence 20..38), so thd gets more freqs rows.
  std::vector<float> fth = random_floats(size_t(tokens * R), 12, 30.f);
  DeviceBuffer<float> dfth(fth);
  const bool thd = fmt == kNVTERopeTHD;
  NVTETensor tf = thd ? desc(dfth.ptr, {tokens, 1, 1, R}, kNVTEFloat32)
                      : desc(df.ptr, {s, 1, 1, R}, kNVTEFloat32);
  NVTETensor tc = desc(dcu.ptr, {int64_t(cu.size())}, kNVTEInt32);
  auto fn = backward ? nvte_fused_rope_backward : nvte_fused_rope_forward;
  TE_EXPECT(fn(&ti, &tf, thd ? &tc : nullptr, &to, fmt, inter, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = dy.download();
  std::vector<float> want(n);
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t pos;
    if (fmt == kNVTERopeSBHD) pos = t / b;
    else if (fmt == kNVTERopeBSHD) pos = t % s;
    else { int k = 0; while (k + 1 < int(cu.size()) - 1 && cu[k + 1] <= t) ++k; pos = t - cu[k]; }
    const float* fr = (thd ? fth.data() : f.data()) + pos * R;
    cpu_rope_row(&x[size_t(t * h * d)], &want[size_t(t * h * d)], fr, h, d, R, inter, backward);
  }
  int bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::fabs(got[i] - want[i]) > 2e-5 + 2e-5 * std::fabs(want[i]);
  TE_EXPECT(bad == 0, "fmt %d inter %d bwd %d h %d d %d R %d: %d mismatches", int(fmt), int(inter),
            int(backward), h, d, R, bad);
}

}  // namespace

TE_TEST(rope_matches_cpu) {
  const int heads[][3] = {{4, 64, 64}, {3, 40, 24}, {2, 33, 16}, {1, 128, 32}};
  for (auto fmt : {kNVTERopeSBHD, kNVTERopeBSHD, kNVTERopeTHD})
    for (bool inter : {false, true})
      for (bool bwd : {false, true})
        for (auto& hd : heads) check(fmt, inter, bwd, hd[0], hd[1], hd[2]);
}

TE_TEST(rope_bad_input_returns_status_and_message) {
  DeviceBuffer<float> x(4 * 2 * 3 * 8), f(4 * 10);
  NVTETensor ti = desc(x.ptr, {4, 2, 3, 8}, kNVTEFloat32);
  NVTETensor tf = desc(f.ptr, {4, 1, 1, 10}, kNVTEFloat32);  // rotary dim 10 > head dim 8
  TE_EXPECT(nvte_fused_rope_forward(&ti, &tf, nullptr, &ti, kNVTERopeSBHD, 0, nullptr) ==
                kNVTEInvalidArgument, "rotary dim > head dim accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_fused_rope_forward") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor t3 = desc(x.ptr, {8, 3, 8}, kNVTEFloat32);
  NVTETensor tf8 = desc(f.ptr, {4, 1, 1, 8}, kNVTEFloat32);
  TE_EXPECT(nvte_fused_rope_forward(&t3, &tf8, nullptr, &t3, kNVTERopeTHD, 0, nullptr) ==
                kNVTEInvalidArgument, "thd without cu_seqlens accepted");
}
