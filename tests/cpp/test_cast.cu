// C API tests of the cast, transpose and delayed-scaling families against CPU loops.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "test_common.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/recipe.h"
#include "transformer_engine/transpose.h"

using namespace te_test;

namespace {

// band > 0: nvte_cast_transpose_rows band by band (the last one shorter where band does not
// divide rows) instead of one nvte_cast_transpose.
void check_cast_transpose(int64_t rows, int64_t cols, bool e4m3, unsigned seed, int64_t band = 0) {
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
  if (band > 0) {
    for (int64_t b = 0; b < rows; b += band)
      TE_EXPECT(nvte_cast_transpose_rows(&i, &o, &ot, b, std::min(b + band, rows), nullptr) ==
                    kNVTESuccess, "%s", nvte_last_error_message());
  } else {
    TE_EXPECT(nvte_cast_transpose(&i, &o, &ot, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
  }
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

// Row bands: every byte of the data and the transpose, the amax and scale_inv as one cast's.
TE_TEST(cast_transpose_rows_in_bands_matches_cpu) {
  const int64_t cases[][3] = {{1024, 384, 256}, {1000, 272, 384}, {384, 4096, 128}, {37, 23, 16},
                              {300, 129, 128}};
  unsigned seed = 101;
  for (auto& c : cases) {
    check_cast_transpose(c[0], c[1], true, seed++, c[2]);
    check_cast_transpose(c[0], c[1], false, seed++, c[2]);
  }
  DeviceBuffer<__nv_bfloat16> in(size_t(64 * 32));
  DeviceBuffer<uint8_t> out(size_t(64 * 32)), out_t(size_t(64 * 32));
  DeviceBuffer<float> scale(std::vector<float>{1.f}), amax(std::vector<float>{0.f}),
      scale_inv(std::vector<float>{0.f});
  NVTETensor i = desc(in.ptr, {64, 32}, kNVTEBFloat16);
  NVTETensor o = desc(out.ptr, {64, 32}, kNVTEFloat8E4M3, amax.ptr, scale.ptr, scale_inv.ptr);
  NVTETensor ot = desc(out_t.ptr, {32, 64}, kNVTEFloat8E4M3);
  const int64_t bad[][2] = {{-16, 16}, {16, 16}, {32, 16}, {48, 80}};
  for (auto& r : bad)
    TE_EXPECT(nvte_cast_transpose_rows(&i, &o, &ot, r[0], r[1], nullptr) == kNVTEInvalidArgument,
              "rows [%lld, %lld) of 64 must be refused", (long long)r[0], (long long)r[1]);
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

// ----- fused cast+transpose (cast_transpose_dbias, act_/dact_ forms) --------------------------
// Relu and squared relu are exact in fp32 on both sides, so the host loop below predicts every
// FP8 byte; dbias is compared with a double-precision column sum.

namespace {

float host_srelu(float x) { return x > 0.f ? x * x : 0.f; }
float host_srelu_deriv(float x) { return x > 0.f ? 2.f * x : 0.f; }

// Checks out [rows, cols] and out_t [cols, rows] against fp8(v * scale), amax, scale_inv and
// (when given) dbias against column sums of v.
void expect_fused_result(const char* what, const std::vector<float>& v, int64_t rows, int64_t cols,
                         float scale_v, bool e4m3, const DeviceBuffer<uint8_t>& out,
                         const DeviceBuffer<uint8_t>& out_t, const DeviceBuffer<float>& amax,
                         const DeviceBuffer<float>& scale_inv, const DeviceBuffer<float>* dbias) {
  TE_EXPECT(cuda_ok(), "sync");
  auto got = out.download(), got_t = out_t.download();
  float want_amax = 0.f;
  int bad = 0;
  std::vector<double> sums(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = v[size_t(r * cols + c)];
      want_amax = std::fmax(want_amax, std::fabs(x));
      sums[size_t(c)] += x;
      const uint8_t q = host_fp8(x * scale_v, e4m3);
      bad += got[size_t(r * cols + c)] != q;
      bad += got_t[size_t(c * rows + r)] != q;
    }
  TE_EXPECT(bad == 0, "%s: %d mismatching bytes at %lld x %lld", what, bad, (long long)rows,
            (long long)cols);
  TE_EXPECT(amax.download()[0] == want_amax, "%s: amax %g vs %g", what, amax.download()[0],
            want_amax);
  TE_EXPECT(scale_inv.download()[0] == 1.f / scale_v, "%s: scale_inv", what);
  if (dbias == nullptr) return;
  auto hb = dbias->download();
  int bad_b = 0;
  for (int64_t c = 0; c < cols; ++c)
    bad_b += std::fabs(hb[size_t(c)] - sums[size_t(c)]) > 1e-3 + 1e-5 * std::fabs(sums[size_t(c)]);
  TE_EXPECT(bad_b == 0, "%s: %d dbias mismatches", what, bad_b);
}

// Runs a dbias op twice: the size query (zeroed workspace descriptor), then the real call.
template <typename Call>
void run_with_workspace(const char* what, int64_t rows, int64_t cols, Call call) {
  NVTETensor ws{};
  TE_EXPECT(call(&ws) == kNVTESuccess, "%s query: %s", what, nvte_last_error_message());
  TE_EXPECT(ws.dtype == kNVTEFloat32 && ws.ndim == 2 && ws.shape[1] == cols &&
                ws.shape[0] == (rows + 127) / 128,
            "%s: workspace query answered [%lld, %lld]", what, (long long)ws.shape[0],
            (long long)ws.shape[1]);
  DeviceBuffer<float> wbuf{size_t(ws.shape[0] * ws.shape[1])};
  ws.data = wbuf.ptr;
  TE_EXPECT(call(&ws) == kNVTESuccess, "%s: %s", what, nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "%s sync", what);
}

struct Fp8Out {
  DeviceBuffer<uint8_t> out, out_t;
  DeviceBuffer<float> scale, amax, scale_inv;
  NVTETensor o, ot;
  Fp8Out(int64_t rows, int64_t cols, float scale_v, bool e4m3)
      : out(size_t(rows * cols)), out_t(size_t(rows * cols)), scale(std::vector<float>{scale_v}),
        amax(std::vector<float>{0.f}), scale_inv(std::vector<float>{0.f}) {
    const NVTEDType t8 = e4m3 ? kNVTEFloat8E4M3 : kNVTEFloat8E5M2;
    o = desc(out.ptr, {rows, cols}, t8, amax.ptr, scale.ptr, scale_inv.ptr);
    ot = desc(out_t.ptr, {cols, rows}, t8);
  }
};

}  // namespace

TE_TEST(cast_transpose_dbias_matches_cpu) {
  const int64_t shapes[][2] = {{37, 69}, {256, 128}, {300, 4096}, {1, 16}};
  unsigned seed = 20;
  for (auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1];
    const size_t n = size_t(rows * cols);
    std::vector<float> x = random_floats(n, seed++, 3.f);
    std::vector<__nv_bfloat16> xb(n);
    for (size_t i = 0; i < n; ++i) {
      xb[i] = __float2bfloat16_rn(x[i]);
      x[i] = __bfloat162float(xb[i]);
    }
    DeviceBuffer<__nv_bfloat16> in(xb);
    DeviceBuffer<float> dbias{size_t(cols)};
    Fp8Out f(rows, cols, 20.f, false);
    NVTETensor i = desc(in.ptr, {rows, cols}, kNVTEBFloat16);
    NVTETensor b = desc(dbias.ptr, {cols}, kNVTEFloat32);
    run_with_workspace("cast_transpose_dbias", rows, cols, [&](NVTETensor* ws) {
      return nvte_cast_transpose_dbias(&i, &f.o, &f.ot, &b, ws, nullptr);
    });
    expect_fused_result("cast_transpose_dbias", x, rows, cols, 20.f, false, f.out, f.out_t, f.amax,
                        f.scale_inv, &dbias);
  }
}

TE_TEST(cast_transpose_act_forms_match_cpu) {
  const int64_t shapes[][2] = {{37, 70}, {256, 256}, {64, 48}};
  unsigned seed = 40;
  for (auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1], half = cols / 2;
    const size_t n = size_t(rows * cols);
    std::vector<float> x = random_floats(n, seed++, 2.f), g = random_floats(n, seed++, 1.f);
    DeviceBuffer<float> in(x), grad(g), dbias{size_t(cols)};
    NVTETensor ti = desc(in.ptr, {rows, cols}, kNVTEFloat32);
    // srelu forward
    std::vector<float> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = host_srelu(x[k]);
    Fp8Out f1(rows, cols, 16.f, true);
    TE_EXPECT(nvte_act_cast_transpose(kNVTESRelu, &ti, &f1.o, &f1.ot, nullptr) == kNVTESuccess,
              "%s", nvte_last_error_message());
    expect_fused_result("act srelu", v, rows, cols, 16.f, true, f1.out, f1.out_t, f1.amax,
                        f1.scale_inv, nullptr);
    // sreglu forward: act of the first half times the second half
    std::vector<float> vg(size_t(rows * half));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < half; ++c)
        vg[size_t(r * half + c)] =
            host_srelu(x[size_t(r * cols + c)]) * x[size_t(r * cols + half + c)];
    Fp8Out f2(rows, half, 8.f, true);
    TE_EXPECT(
        nvte_gated_act_cast_transpose(kNVTESRelu, &ti, &f2.o, &f2.ot, nullptr) == kNVTESuccess,
        "%s", nvte_last_error_message());
    expect_fused_result("act sreglu", vg, rows, half, 8.f, true, f2.out, f2.out_t, f2.amax,
                        f2.scale_inv, nullptr);
    // srelu backward with dbias
    for (size_t k = 0; k < n; ++k) v[k] = g[k] * host_srelu_deriv(x[k]);
    Fp8Out f3(rows, cols, 32.f, false);
    NVTETensor tg = desc(grad.ptr, {rows, cols}, kNVTEFloat32);
    NVTETensor tb = desc(dbias.ptr, {cols}, kNVTEFloat32);
    run_with_workspace("dact srelu", rows, cols, [&](NVTETensor* ws) {
      return nvte_dact_dbias_cast_transpose(kNVTESRelu, &tg, &ti, &f3.o, &f3.ot, &tb, ws, nullptr);
    });
    expect_fused_result("dact srelu", v, rows, cols, 32.f, false, f3.out, f3.out_t, f3.amax,
                        f3.scale_inv, &dbias);
    // sreglu backward with dbias: grad [rows, half], result [rows, cols]
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < half; ++c) {
        const float dy = g[size_t(r * half + c)], a = x[size_t(r * cols + c)],
                    b = x[size_t(r * cols + half + c)];
        v[size_t(r * cols + c)] = dy * b * host_srelu_deriv(a);
        v[size_t(r * cols + half + c)] = dy * host_srelu(a);
      }
    Fp8Out f4(rows, cols, 32.f, true);
    NVTETensor tgh = desc(grad.ptr, {rows, half}, kNVTEFloat32);
    run_with_workspace("dgated sreglu", rows, cols, [&](NVTETensor* ws) {
      return nvte_dgated_act_dbias_cast_transpose(kNVTESRelu, &tgh, &ti, &f4.o, &f4.ot, &tb, ws,
                                                  nullptr);
    });
    expect_fused_result("dgated sreglu", v, rows, cols, 32.f, true, f4.out, f4.out_t, f4.amax,
                        f4.scale_inv, &dbias);
    // without dbias: no workspace at all
    Fp8Out f5(rows, cols, 32.f, true);
    TE_EXPECT(nvte_dgated_act_dbias_cast_transpose(kNVTESRelu, &tgh, &ti, &f5.o, &f5.ot, nullptr,
                                                   nullptr, nullptr) == kNVTESuccess,
              "%s", nvte_last_error_message());
    expect_fused_result("dgated sreglu, no dbias", v, rows, cols, 32.f, true, f5.out, f5.out_t,
                        f5.amax, f5.scale_inv, nullptr);
  }
}

TE_TEST(cast_transpose_fused_bad_input_returns_status_and_message) {
  DeviceBuffer<float> in(30);
  Fp8Out f(3, 10, 1.f, true);
  NVTETensor ti = desc(in.ptr, {3, 10}, kNVTEFloat32);
  TE_EXPECT(nvte_act_cast_transpose(static_cast<NVTEActivation>(9), &ti, &f.o, &f.ot, nullptr) ==
                kNVTEInvalidArgument, "activation code 9 accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_act_cast_transpose") != nullptr, "%s",
            nvte_last_error_message());
  // gated form: output must be [3, 5]
  TE_EXPECT(nvte_gated_act_cast_transpose(kNVTEGelu, &ti, &f.o, &f.ot, nullptr) ==
                kNVTEInvalidArgument, "gated output of the input's width accepted");
  NVTETensor odd = desc(in.ptr, {5, 6}, kNVTEFloat32);
  NVTETensor wrong_t = desc(f.out_t.ptr, {5, 6}, kNVTEFloat8E4M3);
  TE_EXPECT(nvte_act_cast_transpose(kNVTEGelu, &odd, &f.o, &wrong_t, nullptr) ==
                kNVTEInvalidArgument, "output_t of the wrong shape accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "output_t") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor hp_out = desc(in.ptr, {3, 10}, kNVTEFloat32);
  TE_EXPECT(nvte_act_cast_transpose(kNVTEGelu, &ti, &hp_out, &f.ot, nullptr) ==
                kNVTEInvalidArgument, "float32 output accepted");
  DeviceBuffer<float> dbias(10);
  NVTETensor tb = desc(dbias.ptr, {10}, kNVTEFloat32);
  NVTETensor small_ws = desc(dbias.ptr, {1, 2}, kNVTEFloat32);
  TE_EXPECT(nvte_cast_transpose_dbias(&ti, &f.o, &f.ot, &tb, &small_ws, nullptr) ==
                kNVTEInvalidArgument, "too small a workspace accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "workspace") != nullptr, "%s",
            nvte_last_error_message());
}

// n casts+transposes in one launch give the bytes, amax and scale_inv of n single launches.
TE_TEST(cast_transpose_multi_matches_single_calls) {
  const int64_t shapes[][2] = {{37, 23}, {256, 128}, {0, 16}, {64, 1024}};
  const float scales[] = {3.5f, 0.25f, 2.f, 11.f};
  for (bool aligned_only : {false, true}) {
    std::vector<DeviceBuffer<__nv_bfloat16>*> ins;
    std::vector<DeviceBuffer<uint8_t>*> bufs;
    std::vector<DeviceBuffer<float>*> meta;
    NVTETensor in_d[4], out_d[2][4], out_t_d[2][4];
    int n = 0;
    for (int k = 0; k < 4; ++k) {
      const int64_t rows = shapes[k][0], cols = shapes[k][1];
      if (aligned_only && (rows % 16 || cols % 16)) continue;
      const size_t count = size_t(rows * cols);
      std::vector<float> x = random_floats(count, 50 + k, 30.f);
      std::vector<__nv_bfloat16> xb(count);
      for (size_t i = 0; i < count; ++i) xb[i] = __float2bfloat16_rn(x[i]);
      ins.push_back(new DeviceBuffer<__nv_bfloat16>(xb));
      in_d[n] = desc(ins.back()->ptr, {rows, cols}, kNVTEBFloat16);
      for (int way = 0; way < 2; ++way) {  // 0: single calls, 1: one multi call
        auto* o = new DeviceBuffer<uint8_t>(count + 1);
        auto* ot = new DeviceBuffer<uint8_t>(count + 1);
        o->fill_bytes(0x5a);
        ot->fill_bytes(0x5a);
        auto* sc = new DeviceBuffer<float>(std::vector<float>{scales[k]});
        auto* am = new DeviceBuffer<float>(std::vector<float>{0.f});
        auto* si = new DeviceBuffer<float>(std::vector<float>{0.f});
        bufs.push_back(o);
        bufs.push_back(ot);
        meta.push_back(sc);
        meta.push_back(am);
        meta.push_back(si);
        out_d[way][n] = desc(o->ptr, {rows, cols}, kNVTEFloat8E4M3, am->ptr, sc->ptr, si->ptr);
        out_t_d[way][n] = desc(ot->ptr, {cols, rows}, kNVTEFloat8E4M3);
      }
      ++n;
    }
    for (int k = 0; k < n; ++k)
      TE_EXPECT(nvte_cast_transpose(&in_d[k], &out_d[0][k], &out_t_d[0][k], nullptr) == kNVTESuccess,
                "%s", nvte_last_error_message());
    const NVTETensor* ip[4];
    NVTETensor *op[4], *otp[4];
    for (int k = 0; k < n; ++k) {
      ip[k] = &in_d[k];
      op[k] = &out_d[1][k];
      otp[k] = &out_t_d[1][k];
    }
    TE_EXPECT(nvte_cast_transpose_multi(n, ip, op, otp, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    // per tensor: way 0 at bufs[4k], bufs[4k+1], meta[6k..6k+2]; way 1 after it
    for (int k = 0; k < n; ++k) {
      TE_EXPECT(bufs[4 * k]->download() == bufs[4 * k + 2]->download(), "data of tensor %d", k);
      TE_EXPECT(bufs[4 * k + 1]->download() == bufs[4 * k + 3]->download(), "transpose of tensor %d", k);
      for (int m = 1; m < 3; ++m)
        TE_EXPECT(meta[6 * k + m]->download() == meta[6 * k + 3 + m]->download(),
                  "amax/scale_inv of tensor %d", k);
    }
    for (auto* p : ins) delete p;
    for (auto* p : bufs) delete p;
    for (auto* p : meta) delete p;
  }
  NVTETensor bad = desc(nullptr, {0, 0}, kNVTEBFloat16);
  const NVTETensor* bp[1] = {&bad};
  NVTETensor* bo[1] = {&bad};
  TE_EXPECT(nvte_cast_transpose_multi(5, bp, bo, bo, nullptr) == kNVTEInvalidArgument,
            "n = 5 must be refused");
}

// Current scaling in one launch: the scales of an amax launch per tensor and the update.
TE_TEST(current_scaling_scales_match_amax_then_update) {
  const size_t n0 = 1000 * 37 + 5, n1 = 4096;
  std::vector<float> x0 = random_floats(n0, 61, 100.f), x1 = random_floats(n1, 62, 0.01f);
  std::vector<__nv_bfloat16> b0(n0);
  for (size_t i = 0; i < n0; ++i) b0[i] = __float2bfloat16_rn(x0[i]);
  std::vector<float> zeros(n1, 0.f);
  DeviceBuffer<__nv_bfloat16> in0(b0);
  DeviceBuffer<float> in1(x1), in2(zeros);
  NVTETensor d[3] = {desc(in0.ptr, {1000 * 37 + 5}, kNVTEBFloat16), desc(in1.ptr, {64, 64}, kNVTEFloat32),
                     desc(in2.ptr, {64, 64}, kNVTEFloat32)};
  const NVTETensor* p[3] = {&d[0], &d[1], &d[2]};
  const float fp8_max = 448.f;
  // reference: amax launches into a one-row history, then the update
  DeviceBuffer<float> hist(std::vector<float>{0.f, 0.f, 0.f}), rscale(std::vector<float>{1.f, 1.f, 7.f}),
      rsinv(std::vector<float>{0.f, 0.f, 0.f});
  for (int k = 0; k < 3; ++k)
    TE_EXPECT(nvte_compute_amax(p[k], hist.ptr + k, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  NVTEScalingGroup g{hist.ptr, rscale.ptr, rsinv.ptr, 1, 3, fp8_max};
  TE_EXPECT(nvte_delayed_scaling_update(&g, 1, kNVTEAmaxMostRecent, 0.f, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  DeviceBuffer<float> amax(std::vector<float>{0.f, 0.f, 0.f}), scale(std::vector<float>{1.f, 1.f, 7.f}),
      sinv(std::vector<float>{0.f, 0.f, 0.f});
  DeviceBuffer<int> counter(std::vector<int>{0});
  for (int rep = 0; rep < 2; ++rep)  // the scratch is left zero: a second launch gives the same
    TE_EXPECT(nvte_current_scaling_scales(p, 3, amax.ptr, counter.ptr, scale.ptr, sinv.ptr, nullptr,
                                          fp8_max, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  TE_EXPECT(scale.download() == rscale.download(), "scales differ from amax + update");
  TE_EXPECT(sinv.download() == rsinv.download(), "scale_invs differ from amax + update");
  TE_EXPECT(scale.download()[2] == 7.f, "an all-zero tensor keeps its scale");
  TE_EXPECT(amax.download() == std::vector<float>({0.f, 0.f, 0.f}), "amax scratch not left zero");
  TE_EXPECT(counter.download()[0] == 0, "counter not left zero");
  TE_EXPECT(nvte_current_scaling_scales(p, 0, amax.ptr, counter.ptr, scale.ptr, sinv.ptr, nullptr,
                                        fp8_max, nullptr) == kNVTEInvalidArgument, "n = 0 must be refused");
}

// Current scaling inside the multi cast (one cooperative launch for a grid that fits the device,
// the scales kernel first for one that does not) gives the bits of the scales kernel followed by
// the plain multi cast.
TE_TEST(cast_transpose_multi_current_scaling_matches_two_steps) {
  const std::vector<std::vector<std::array<int64_t, 2>>> cases = {
      {{64, 1024}, {1024, 1024}}, {{37, 23}}, {{4096, 4096}, {16, 16}}};
  unsigned seed = 70;
  for (const auto& shapes : cases) {
    const int n = int(shapes.size());
    std::vector<DeviceBuffer<__nv_bfloat16>*> ins;
    NVTETensor in_d[4], out_d[2][4], out_t_d[2][4];
    std::vector<DeviceBuffer<uint8_t>*> data[2];
    DeviceBuffer<float> scale0(std::vector<float>(n, 1.f)), sinv0(std::vector<float>(n, 0.f)),
        scale1(std::vector<float>(n, 1.f)), sinv1(std::vector<float>(n, 0.f)),
        amax0(std::vector<float>(n, 0.f)), amax1(std::vector<float>(n, 0.f));
    DeviceBuffer<float> osinv0(std::vector<float>(n, 0.f)), osinv1(std::vector<float>(n, 0.f));
    DeviceBuffer<int> counter0(std::vector<int>{0}), counter1(std::vector<int>{0});
    for (int k = 0; k < n; ++k) {
      const int64_t rows = shapes[k][0], cols = shapes[k][1];
      const size_t count = size_t(rows * cols);
      std::vector<float> x = random_floats(count, seed++, 5.f + k);
      std::vector<__nv_bfloat16> xb(count);
      for (size_t i = 0; i < count; ++i) xb[i] = __float2bfloat16_rn(x[i]);
      ins.push_back(new DeviceBuffer<__nv_bfloat16>(xb));
      in_d[k] = desc(ins.back()->ptr, {rows, cols}, kNVTEBFloat16);
      for (int way = 0; way < 2; ++way) {
        data[way].push_back(new DeviceBuffer<uint8_t>(count));
        data[way].push_back(new DeviceBuffer<uint8_t>(count));
        float* sc = (way ? scale1.ptr : scale0.ptr) + k;
        float* si = (way ? osinv1.ptr : osinv0.ptr) + k;
        out_d[way][k] = desc(data[way][2 * k]->ptr, {rows, cols}, kNVTEFloat8E4M3, nullptr, sc, si);
        out_t_d[way][k] = desc(data[way][2 * k + 1]->ptr, {cols, rows}, kNVTEFloat8E4M3);
      }
    }
    const NVTETensor* ip[4];
    NVTETensor *op0[4], *otp0[4], *op1[4], *otp1[4];
    for (int k = 0; k < n; ++k) {
      ip[k] = &in_d[k];
      op0[k] = &out_d[0][k];
      otp0[k] = &out_t_d[0][k];
      op1[k] = &out_d[1][k];
      otp1[k] = &out_t_d[1][k];
    }
    TE_EXPECT(nvte_current_scaling_scales(ip, n, amax0.ptr, counter0.ptr, scale0.ptr, sinv0.ptr,
                                          nullptr, 448.f, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    TE_EXPECT(nvte_cast_transpose_multi(n, ip, op0, otp0, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    for (int rep = 0; rep < 2; ++rep)
      TE_EXPECT(nvte_cast_transpose_multi_current_scaling(n, ip, op1, otp1, amax1.ptr, counter1.ptr,
                                                          scale1.ptr, sinv1.ptr, nullptr, 448.f,
                                                          nullptr) == kNVTESuccess,
                "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    for (size_t b = 0; b < data[0].size(); ++b)
      TE_EXPECT(data[0][b]->download() == data[1][b]->download(), "FP8 bytes differ (buffer %zu)", b);
    TE_EXPECT(scale0.download() == scale1.download(), "scales differ");
    TE_EXPECT(sinv0.download() == sinv1.download(), "state scale_invs differ");
    TE_EXPECT(osinv0.download() == osinv1.download(), "output scale_invs differ");
    TE_EXPECT(scale1.download()[0] != 1.f, "scale not computed");
    TE_EXPECT(amax1.download() == std::vector<float>(n, 0.f), "amax scratch not left zero");
    TE_EXPECT(counter1.download()[0] == 0, "counter not left zero");
    for (auto* p : ins) delete p;
    for (auto& v : data)
      for (auto* p : v) delete p;
  }
}

namespace {

struct DbiasCase {  // a bf16 input and the buffers of one cast+transpose+dbias
  int64_t rows, cols;
  DeviceBuffer<__nv_bfloat16> in;
  DeviceBuffer<uint8_t> out, out_t;
  DeviceBuffer<__nv_bfloat16> dbias;
  DeviceBuffer<float> ws, sinv;
  DbiasCase(int64_t r, int64_t c, unsigned seed)
      : rows(r), cols(c), in(bf16_random(size_t(r * c), seed)), out(size_t(r * c)),
        out_t(size_t(r * c)), dbias(size_t(c)), ws(size_t(((r + 127) / 128) * c)),
        sinv(std::vector<float>{0.f}) {}
  static std::vector<__nv_bfloat16> bf16_random(size_t n, unsigned seed) {
    std::vector<float> x = random_floats(n, seed, 3.f);
    std::vector<__nv_bfloat16> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = __float2bfloat16_rn(x[i]);
    return b;
  }
  NVTETensor i() { return desc(in.ptr, {rows, cols}, kNVTEBFloat16); }
  NVTETensor o(float* amax, float* scale) {
    return desc(out.ptr, {rows, cols}, kNVTEFloat8E5M2, amax, scale, sinv.ptr);
  }
  NVTETensor ot() { return desc(out_t.ptr, {cols, rows}, kNVTEFloat8E5M2); }
  NVTETensor db() { return desc(dbias.ptr, {cols}, kNVTEBFloat16); }
  NVTETensor w() { return desc(ws.ptr, {(rows + 127) / 128, cols}, kNVTEFloat32); }
  bool same(const DbiasCase& b) const {
    return out.download() == b.out.download() && out_t.download() == b.out_t.download() &&
           sinv.download() == b.sinv.download() &&
           std::memcmp(dbias.download().data(), b.dbias.download().data(), 2 * size_t(cols)) == 0;
  }
};

}  // namespace

// cast+transpose+dbias with current scaling folded in = the scales kernel, then the plain op.
TE_TEST(cast_transpose_dbias_current_scaling_matches_two_steps) {
  const int64_t shapes[][2] = {{64, 1024}, {37, 48}, {300, 256}, {4096, 4096}};
  unsigned seed = 90;
  for (auto& sh : shapes) {
    DbiasCase a(sh[0], sh[1], seed), b(sh[0], sh[1], seed);
    ++seed;
    DeviceBuffer<float> amax_a(std::vector<float>{0.f}), amax_b(std::vector<float>{0.f}),
        scale_a(std::vector<float>{1.f}), scale_b(std::vector<float>{1.f}),
        si_a(std::vector<float>{0.f}), si_b(std::vector<float>{0.f});
    DeviceBuffer<int> counter_a(std::vector<int>{0}), counter_b(std::vector<int>{0});
    NVTETensor ia = a.i(), oa = a.o(nullptr, scale_a.ptr), ota = a.ot(), dba = a.db(), wa = a.w();
    const NVTETensor* pa[1] = {&ia};
    TE_EXPECT(nvte_current_scaling_scales(pa, 1, amax_a.ptr, counter_a.ptr, scale_a.ptr, si_a.ptr,
                                          nullptr, 57344.f, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    TE_EXPECT(nvte_cast_transpose_dbias(&ia, &oa, &ota, &dba, &wa, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    NVTETensor ib = b.i(), ob = b.o(nullptr, scale_b.ptr), otb = b.ot(), dbb = b.db(), wb = b.w();
    TE_EXPECT(nvte_cast_transpose_dbias_current_scaling(&ib, &ob, &otb, &dbb, &wb, amax_b.ptr,
                                                        counter_b.ptr, scale_b.ptr, si_b.ptr, nullptr,
                                                        57344.f, nullptr) == kNVTESuccess, "%s",
              nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    TE_EXPECT(a.same(b), "outputs differ at %lld x %lld", (long long)sh[0], (long long)sh[1]);
    TE_EXPECT(scale_a.download() == scale_b.download() && si_a.download() == si_b.download(),
              "scales differ");
    TE_EXPECT(amax_b.download()[0] == 0.f && counter_b.download()[0] == 0, "scratch not left zero");
  }
}

namespace {

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = __float2bfloat16_rn(x[i]);
  return b;
}

float host_amax(const std::vector<__nv_bfloat16>& x) {
  float a = 0.f;
  for (const auto& v : x) a = std::fmax(a, std::fabs(__bfloat162float(v)));
  return a;
}

}  // namespace

// A bad step under current scaling: a NaN or infinite amax keeps the tensor's scale (the last
// finite one) and adds one to its skipped count, in every entry point that computes the scale
// (the scales kernel, the multi cast's one-launch and two-launch ways, cast+transpose+dbias);
// finite tensors of the same launch get fp8_max / amax and keep their count; an all-zero tensor
// keeps its scale uncounted; a null skipped pointer counts nothing.
TE_TEST(current_scaling_non_finite_amax_keeps_scale_and_counts) {
  const float fp8_max = 448.f;
  {  // nvte_current_scaling_scales: NaN (bf16), +inf (fp32), finite (fp32), all zero
    std::vector<float> x0 = random_floats(1000 * 3 + 7, 201, 6.f), x1 = random_floats(129 * 5, 202, 2.f),
                       x2 = random_floats(77 * 3, 203, 9.f), x3(64, 0.f);
    x0[1234] = NAN;
    x1[17] = INFINITY;
    DeviceBuffer<__nv_bfloat16> in0(to_bf16(x0));
    DeviceBuffer<float> in1(x1), in2(x2), in3(x3);
    NVTETensor d[4] = {desc(in0.ptr, {1000 * 3 + 7}, kNVTEBFloat16), desc(in1.ptr, {129, 5}, kNVTEFloat32),
                       desc(in2.ptr, {77, 3}, kNVTEFloat32), desc(in3.ptr, {8, 8}, kNVTEFloat32)};
    const NVTETensor* p[4] = {&d[0], &d[1], &d[2], &d[3]};
    float a2 = 0.f;
    for (float v : x2) a2 = std::fmax(a2, std::fabs(v));
    const std::vector<float> want_scale = {3.f, 5.f, fp8_max / a2, 7.f};
    DeviceBuffer<float> amax(std::vector<float>(4, 0.f)), scale(std::vector<float>{3.f, 5.f, 1.f, 7.f}),
        sinv(std::vector<float>(4, 0.f));
    DeviceBuffer<int> counter(std::vector<int>{0}), skipped(std::vector<int>{10, 0, 4, 0});
    for (int rep = 0; rep < 2; ++rep)
      TE_EXPECT(nvte_current_scaling_scales(p, 4, amax.ptr, counter.ptr, scale.ptr, sinv.ptr, skipped.ptr,
                                            fp8_max, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
    TE_EXPECT(nvte_current_scaling_scales(p, 4, amax.ptr, counter.ptr, scale.ptr, sinv.ptr, nullptr,
                                          fp8_max, nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    const std::vector<float> got = scale.download(), got_inv = sinv.download();
    TE_EXPECT(got == want_scale, "scales %g %g %g %g, expected %g %g %g %g", got[0], got[1], got[2], got[3],
              want_scale[0], want_scale[1], want_scale[2], want_scale[3]);
    for (int k = 0; k < 4; ++k) TE_EXPECT(got_inv[k] == 1.f / want_scale[k], "scale_inv[%d]", k);
    const std::vector<int> sk = skipped.download();
    TE_EXPECT(sk == std::vector<int>({12, 2, 4, 0}), "skipped %d %d %d %d, expected 12 2 4 0", sk[0], sk[1],
              sk[2], sk[3]);
    TE_EXPECT(amax.download() == std::vector<float>(4, 0.f) && counter.download()[0] == 0,
              "scratch not left zero");
  }
  // nvte_cast_transpose_multi_current_scaling: a grid that fits the device (one launch) and one
  // that does not (the scales kernel, then the casts); tensor 0 holds a NaN
  const std::vector<std::vector<std::array<int64_t, 2>>> cases = {{{37, 23}, {64, 130}},
                                                                  {{4096, 4096}, {16, 48}}};
  unsigned seed = 210;
  for (const auto& shapes : cases) {
    std::vector<__nv_bfloat16> h[2];
    for (int k = 0; k < 2; ++k) h[k] = to_bf16(random_floats(size_t(shapes[k][0] * shapes[k][1]), seed++, 4.f));
    h[0][h[0].size() / 2 + 3] = __float2bfloat16_rn(NAN);
    DeviceBuffer<__nv_bfloat16> in0(h[0]), in1(h[1]);
    DeviceBuffer<uint8_t> o0(h[0].size()), ot0(h[0].size()), o1(h[1].size()), ot1(h[1].size());
    DeviceBuffer<float> amax(std::vector<float>(2, 0.f)), scale(std::vector<float>{9.f, 1.f}),
        sinv(std::vector<float>(2, 0.f)), osinv(std::vector<float>(2, 0.f));
    DeviceBuffer<int> counter(std::vector<int>{0}), skipped(std::vector<int>{2, 6});
    const int64_t r0 = shapes[0][0], c0 = shapes[0][1], r1 = shapes[1][0], c1 = shapes[1][1];
    NVTETensor in_d[2] = {desc(in0.ptr, {r0, c0}, kNVTEBFloat16), desc(in1.ptr, {r1, c1}, kNVTEBFloat16)};
    NVTETensor out_d[2] = {desc(o0.ptr, {r0, c0}, kNVTEFloat8E4M3, nullptr, scale.ptr, osinv.ptr),
                           desc(o1.ptr, {r1, c1}, kNVTEFloat8E4M3, nullptr, scale.ptr + 1, osinv.ptr + 1)};
    NVTETensor out_t_d[2] = {desc(ot0.ptr, {c0, r0}, kNVTEFloat8E4M3), desc(ot1.ptr, {c1, r1}, kNVTEFloat8E4M3)};
    const NVTETensor* ip[2] = {&in_d[0], &in_d[1]};
    NVTETensor* op[2] = {&out_d[0], &out_d[1]};
    NVTETensor* otp[2] = {&out_t_d[0], &out_t_d[1]};
    TE_EXPECT(nvte_cast_transpose_multi_current_scaling(2, ip, op, otp, amax.ptr, counter.ptr, scale.ptr,
                                                        sinv.ptr, skipped.ptr, fp8_max, nullptr) == kNVTESuccess,
              "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    const std::vector<float> got = scale.download();
    TE_EXPECT(got[0] == 9.f && got[1] == fp8_max / host_amax(h[1]), "multi %lld x %lld: scales %g %g",
              (long long)r0, (long long)c0, got[0], got[1]);
    TE_EXPECT(sinv.download()[0] == 1.f / 9.f, "multi: scale_inv of the NaN tensor");
    TE_EXPECT(skipped.download() == std::vector<int>({3, 6}), "multi %lld x %lld: skipped %d %d, expected 3 6",
              (long long)r0, (long long)c0, skipped.download()[0], skipped.download()[1]);
    TE_EXPECT(amax.download() == std::vector<float>(2, 0.f) && counter.download()[0] == 0,
              "multi: scratch not left zero");
  }
  // nvte_cast_transpose_dbias_current_scaling: one launch and two launches, +inf in the input
  const int64_t dshapes[][2] = {{37, 48}, {4096, 4096}};
  for (auto& sh : dshapes) {
    DbiasCase c(sh[0], sh[1], seed++);
    std::vector<__nv_bfloat16> x = c.in.download();
    x[x.size() - 5] = __float2bfloat16_rn(-INFINITY);
    c.in.upload(x);
    DeviceBuffer<float> amax(std::vector<float>{0.f}), scale(std::vector<float>{0.25f}),
        sinv(std::vector<float>{0.f});
    DeviceBuffer<int> counter(std::vector<int>{0}), skipped(std::vector<int>{1});
    NVTETensor i = c.i(), o = c.o(nullptr, scale.ptr), ot = c.ot(), db = c.db(), w = c.w();
    TE_EXPECT(nvte_cast_transpose_dbias_current_scaling(&i, &o, &ot, &db, &w, amax.ptr, counter.ptr, scale.ptr,
                                                        sinv.ptr, skipped.ptr, 57344.f, nullptr) == kNVTESuccess,
              "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    TE_EXPECT(scale.download()[0] == 0.25f && sinv.download()[0] == 4.f,
              "dbias %lld x %lld: scale %g, expected the last finite 0.25", (long long)sh[0], (long long)sh[1],
              scale.download()[0]);
    TE_EXPECT(skipped.download()[0] == 2, "dbias %lld x %lld: skipped %d, expected 2", (long long)sh[0],
              (long long)sh[1], skipped.download()[0]);
    TE_EXPECT(amax.download()[0] == 0.f && counter.download()[0] == 0, "dbias: scratch not left zero");
  }
}

// cast+transpose+dbias with a step's delayed update folded in = the plain op, then the update
// (the groups include the cast's own history; 5 groups take the separate update launch).
TE_TEST(cast_transpose_dbias_update_matches_two_steps) {
  for (int num_groups : {1, 2, 5}) {
    for (int64_t rows : {64, 300}) {
      DbiasCase a(rows, 256, 7 + unsigned(rows)), b(rows, 256, 7 + unsigned(rows));
      std::vector<float> h0 = random_floats(4 * 2 * 6, 40 + num_groups, 2.f);
      for (auto& v : h0) v = std::fabs(v);
      DeviceBuffer<float> hist_a(h0), hist_b(h0);  // 6 groups' worth: [4, 2] each
      DeviceBuffer<float> sc_a(std::vector<float>(12, 2.f)), sc_b(std::vector<float>(12, 2.f)),
          si_a(std::vector<float>(12, 0.f)), si_b(std::vector<float>(12, 0.f));
      DeviceBuffer<int> counter(std::vector<int>{0});
      auto groups_of = [&](DeviceBuffer<float>& h, DeviceBuffer<float>& sc, DeviceBuffer<float>& si) {
        std::vector<NVTEScalingGroup> g;
        for (int k = 0; k < num_groups; ++k)
          g.push_back(NVTEScalingGroup{h.ptr + 8 * k, sc.ptr + 2 * k, si.ptr + 2 * k, 4, 2, 57344.f});
        return g;
      };
      auto ga = groups_of(hist_a, sc_a, si_a), gb = groups_of(hist_b, sc_b, si_b);
      // the cast records into column 1 of group 0's history and casts with that tensor's scale
      NVTETensor ia = a.i(), oa = a.o(hist_a.ptr + 1, sc_a.ptr + 1), ota = a.ot(), dba = a.db(), wa = a.w();
      TE_EXPECT(nvte_cast_transpose_dbias(&ia, &oa, &ota, &dba, &wa, nullptr) == kNVTESuccess, "%s",
                nvte_last_error_message());
      TE_EXPECT(nvte_delayed_scaling_update(ga.data(), num_groups, kNVTEAmaxMax, 1.f, nullptr) == kNVTESuccess,
                "%s", nvte_last_error_message());
      NVTETensor ib = b.i(), ob = b.o(hist_b.ptr + 1, sc_b.ptr + 1), otb = b.ot(), dbb = b.db(), wb = b.w();
      TE_EXPECT(nvte_cast_transpose_dbias_update(&ib, &ob, &otb, &dbb, &wb, gb.data(), num_groups,
                                                 kNVTEAmaxMax, 1.f, counter.ptr, nullptr) == kNVTESuccess,
                "%s", nvte_last_error_message());
      TE_EXPECT(cuda_ok(), "sync");
      TE_EXPECT(a.same(b), "outputs differ (%d groups, %lld rows)", num_groups, (long long)rows);
      TE_EXPECT(hist_a.download() == hist_b.download(), "histories differ (%d groups)", num_groups);
      TE_EXPECT(sc_a.download() == sc_b.download() && si_a.download() == si_b.download(),
                "scales differ (%d groups)", num_groups);
      TE_EXPECT(counter.download()[0] == 0, "counter not left zero");
    }
  }
}
