// C API tests of the normalization family against CPU loops in double precision.
#include <cmath>
#include <cstring>

#include "test_common.h"
#include "transformer_engine/normalization.h"

using namespace te_test;

namespace {

struct CpuNorm {
  std::vector<double> z, mu, rs, dx, dg, db;
};

// LayerNorm (rms = false) or RMSNorm forward and backward on the CPU.
CpuNorm cpu_norm(const std::vector<float>& x, const std::vector<float>& g,
                 const std::vector<float>& b, const std::vector<float>& dz, int64_t rows,
                 int64_t cols, bool rms, bool zcg, double eps) {
  CpuNorm r;
  r.z.resize(x.size());
  r.dx.resize(x.size());
  r.mu.resize(rows);
  r.rs.resize(rows);
  r.dg.assign(cols, 0.0);
  r.db.assign(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = &x[i * cols];
    double mu = 0, var = 0;
    if (!rms) {
      for (int64_t c = 0; c < cols; ++c) mu += xr[c];
      mu /= cols;
    }
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(var / cols + eps);
    r.mu[i] = mu;
    r.rs[i] = rs;
    double sdy = 0, sdyx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double gg = g[c] + (zcg ? 1.0 : 0.0);
      const double xhat = (xr[c] - mu) * rs;
      r.z[i * cols + c] = xhat * gg + (rms ? 0.0 : b[c]);
      const double dy = dz[i * cols + c] * gg;
      sdy += dy;
      sdyx += dy * xhat;
      r.dg[c] += dz[i * cols + c] * xhat;
      r.db[c] += dz[i * cols + c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (xr[c] - mu) * rs;
      const double dy = dz[i * cols + c] * (g[c] + (zcg ? 1.0 : 0.0));
      r.dx[i * cols + c] = rs * (dy - (rms ? 0.0 : sdy / cols) - xhat * sdyx / cols);
    }
  }
  return r;
}

std::vector<__nv_bfloat16> to_bf16(std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = __float2bfloat16_rn(v[i]);
    v[i] = __bfloat162float(out[i]);  // the CPU reference sees the rounded inputs
  }
  return out;
}

bool near(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// bf16 x / dz / z / dx with fp32 gamma, beta and weight gradients (the mixed-precision case).
void check_bf16_fp32(int64_t rows, int64_t cols, bool rms, bool zcg, unsigned seed) {
  const size_t n = size_t(rows * cols);
  std::vector<float> x = random_floats(n, seed, 2.f), dz = random_floats(n, seed + 1);
  std::vector<float> g = random_floats(cols, seed + 2, 0.5f), b = random_floats(cols, seed + 3);
  for (auto& v : x) v += 0.5f;
  for (auto& v : g) v += zcg ? 0.f : 1.f;
  auto xb = to_bf16(x), dzb = to_bf16(dz);
  const CpuNorm want = cpu_norm(x, g, b, dz, rows, cols, rms, zcg, 1e-5);

  DeviceBuffer<__nv_bfloat16> dx_in(xb), ddz(dzb), dzout(n), ddx(n);
  DeviceBuffer<float> dg(g), dbeta_in(b), mu(rows), rs(rows), dgam(cols), dbet(cols);
  NVTETensor tx = desc(dx_in.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor tg = desc(dg.ptr, {cols}, kNVTEFloat32), tb = desc(dbeta_in.ptr, {cols}, kNVTEFloat32);
  NVTETensor tz = desc(dzout.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor tmu = desc(mu.ptr, {rows}, kNVTEFloat32), trs = desc(rs.ptr, {rows}, kNVTEFloat32);
  NVTEStatus st = rms ? nvte_rmsnorm_fwd(&tx, &tg, 1e-5f, zcg, &tz, &trs, nullptr)
                      : nvte_layernorm_fwd(&tx, &tg, &tb, 1e-5f, zcg, &tz, &tmu, &trs, nullptr);
  TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());

  NVTETensor tdz = desc(ddz.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor tdx = desc(ddx.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor tdg = desc(dgam.ptr, {cols}, kNVTEFloat32), tdb = desc(dbet.ptr, {cols}, kNVTEFloat32);
  NVTETensor ws = desc(nullptr, {0}, kNVTEByte);
  auto bwd = [&]() {
    return rms ? nvte_rmsnorm_bwd(&tdz, &tx, &trs, &tg, zcg, &tdx, &tdg, &ws, nullptr)
               : nvte_layernorm_bwd(&tdz, &tx, &tmu, &trs, &tg, zcg, &tdx, &tdg, &tdb, &ws,
                                    nullptr);
  };
  TE_EXPECT(bwd() == kNVTESuccess, "query: %s", nvte_last_error_message());
  TE_EXPECT(ws.ndim == 1 && ws.shape[0] >= 16, "workspace size %lld", (long long)ws.shape[0]);
  DeviceBuffer<uint8_t> wsbuf(size_t(ws.shape[0]));
  ws.data = wsbuf.ptr;
  TE_EXPECT(bwd() == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");

  auto z = dzout.download(), dxv = ddx.download();
  auto muv = mu.download(), rsv = rs.download(), dgv = dgam.download(), dbv = dbet.download();
  int bad_z = 0, bad_dx = 0, bad_stat = 0, bad_w = 0;
  for (size_t i = 0; i < n; ++i) {
    bad_z += !near(__bfloat162float(z[i]), want.z[i], 1.6e-2, 1e-2);
    bad_dx += !near(__bfloat162float(dxv[i]), want.dx[i], 1.6e-2, 2e-2);
  }
  for (int64_t i = 0; i < rows; ++i) {
    bad_stat += !near(rsv[i], want.rs[i], 1e-5, 1e-6);
    if (!rms) bad_stat += !near(muv[i], want.mu[i], 1e-5, 1e-5);
  }
  for (int64_t c = 0; c < cols; ++c) {
    bad_w += !near(dgv[c], want.dg[c], 1e-4, 1e-4 * rows);
    if (!rms) bad_w += !near(dbv[c], want.db[c], 1e-4, 1e-4 * rows);
  }
  TE_EXPECT(bad_z == 0 && bad_dx == 0 && bad_stat == 0 && bad_w == 0,
            "%s %lld x %lld zcg=%d: %d z, %d dx, %d stats, %d weight-grad mismatches",
            rms ? "rmsnorm" : "layernorm", (long long)rows, (long long)cols, int(zcg), bad_z,
            bad_dx, bad_stat, bad_w);
}

}  // namespace

TE_TEST(normalization_matches_cpu) {
  const int64_t shapes[][2] = {{37, 23}, {64, 768}, {16, 4096}, {3, 1001}, {5, 16384}, {1, 40000}};
  unsigned seed = 11;
  for (auto& s : shapes)
    for (int rms = 0; rms < 2; ++rms)
      for (int zcg = 0; zcg < 2; ++zcg) check_bf16_fp32(s[0], s[1], rms, zcg, seed++);
}

TE_TEST(normalization_empty_rows_zero_weight_grads) {
  const int64_t cols = 64;
  DeviceBuffer<float> g(std::vector<float>(cols, 1.f)), dg(cols), db(cols);
  dg.fill_bytes(0x7f);
  db.fill_bytes(0x7f);
  NVTETensor x = desc(nullptr, {0, cols}, kNVTEBFloat16), dz = x, dx = x;
  NVTETensor stat = desc(nullptr, {0}, kNVTEFloat32);
  NVTETensor tg = desc(g.ptr, {cols}, kNVTEFloat32);
  NVTETensor tdg = desc(dg.ptr, {cols}, kNVTEFloat32), tdb = desc(db.ptr, {cols}, kNVTEFloat32);
  NVTETensor ws = desc(nullptr, {0}, kNVTEByte);
  TE_EXPECT(nvte_layernorm_bwd(&dz, &x, &stat, &stat, &tg, 0, &dx, &tdg, &tdb, &ws, nullptr) ==
                kNVTESuccess, "%s", nvte_last_error_message());
  DeviceBuffer<uint8_t> wsbuf(size_t(ws.shape[0]));
  ws.data = wsbuf.ptr;
  TE_EXPECT(nvte_layernorm_bwd(&dz, &x, &stat, &stat, &tg, 0, &dx, &tdg, &tdb, &ws, nullptr) ==
                kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  int nonzero = 0;
  for (float v : dg.download()) nonzero += v != 0.f;
  for (float v : db.download()) nonzero += v != 0.f;
  TE_EXPECT(nonzero == 0, "%d weight-gradient values not zeroed", nonzero);
}

TE_TEST(normalization_fp8_output_within_one_step) {
  const int64_t rows = 48, cols = 1024;
  const size_t n = size_t(rows * cols);
  std::vector<float> x = random_floats(n, 5, 2.f), g(cols, 1.f), b(cols, 0.f), dz(n, 0.f);
  auto xb = to_bf16(x);
  const CpuNorm want = cpu_norm(x, g, b, dz, rows, cols, false, false, 1e-5);
  DeviceBuffer<__nv_bfloat16> din(xb);
  DeviceBuffer<float> dg(g), dbt(b);
  DeviceBuffer<uint8_t> out(n);
  const float scale_v = 20.f;
  DeviceBuffer<float> scale(std::vector<float>{scale_v}), amax(std::vector<float>{0.f}),
      scale_inv(std::vector<float>{0.f});
  NVTETensor tx = desc(din.ptr, {rows, cols}, kNVTEBFloat16);
  NVTETensor tg = desc(dg.ptr, {cols}, kNVTEFloat32), tb = desc(dbt.ptr, {cols}, kNVTEFloat32);
  NVTETensor tz = desc(out.ptr, {rows, cols}, kNVTEFloat8E4M3, amax.ptr, scale.ptr, scale_inv.ptr);
  TE_EXPECT(nvte_layernorm_fwd(&tx, &tg, &tb, 1e-5f, 0, &tz, nullptr, nullptr, nullptr) ==
                kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto got = out.download();
  int far = 0, exact = 0;
  double want_amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t q = host_fp8(float(want.z[i]) * scale_v, true);
    const int a = (got[i] & 0x80) ? -(got[i] & 0x7f) : (got[i] & 0x7f);
    const int w = (q & 0x80) ? -(q & 0x7f) : (q & 0x7f);
    far += std::abs(a - w) > 1;
    exact += a == w;
    want_amax = std::fmax(want_amax, std::fabs(want.z[i]));
  }
  TE_EXPECT(far == 0 && exact >= 0.99 * n, "%d bytes more than one step off, %d exact of %zu", far,
            exact, n);
  TE_EXPECT(near(amax.download()[0], want_amax, 1e-5, 1e-5), "amax %g vs %g",
            amax.download()[0], want_amax);
  TE_EXPECT(scale_inv.download()[0] == 1.f / scale_v, "scale_inv");
}

// The *_bwd_residual variants: dx = (plain backward) + dresidual, rounded once; the weight
// gradients bit for bit those of the plain call; dresidual may be dx itself.
TE_TEST(normalization_backward_adds_residual_gradient) {
  const int64_t shapes[][2] = {{37, 23}, {64, 768}, {5, 16384}, {3, 1001}};
  unsigned seed = 41;
  for (auto& s : shapes) {
    for (int rms = 0; rms < 2; ++rms) {
      const int64_t rows = s[0], cols = s[1];
      const size_t n = size_t(rows * cols);
      std::vector<float> x = random_floats(n, seed, 2.f), dz = random_floats(n, seed + 1);
      std::vector<float> dr = random_floats(n, seed + 2, 3.f), g = random_floats(cols, seed + 3);
      std::vector<float> b = random_floats(cols, seed + 4);
      seed += 5;
      auto xb = to_bf16(x), dzb = to_bf16(dz), drb = to_bf16(dr);
      DeviceBuffer<__nv_bfloat16> dx_in(xb), ddz(dzb), dres(drb), z(n), dx_plain(n), dx_res(drb);
      DeviceBuffer<float> dg(g), db_in(b), mu(rows), rs(rows), dg1(cols), db1(cols), dg2(cols),
          db2(cols);
      NVTETensor tx = desc(dx_in.ptr, {rows, cols}, kNVTEBFloat16);
      NVTETensor tg = desc(dg.ptr, {cols}, kNVTEFloat32), tb = desc(db_in.ptr, {cols}, kNVTEFloat32);
      NVTETensor tz = desc(z.ptr, {rows, cols}, kNVTEBFloat16);
      NVTETensor tmu = desc(mu.ptr, {rows}, kNVTEFloat32), trs = desc(rs.ptr, {rows}, kNVTEFloat32);
      TE_EXPECT((rms ? nvte_rmsnorm_fwd(&tx, &tg, 1e-5f, 0, &tz, &trs, nullptr)
                     : nvte_layernorm_fwd(&tx, &tg, &tb, 1e-5f, 0, &tz, &tmu, &trs, nullptr)) ==
                    kNVTESuccess, "%s", nvte_last_error_message());
      NVTETensor tdz = desc(ddz.ptr, {rows, cols}, kNVTEBFloat16);
      NVTETensor tres = desc(dres.ptr, {rows, cols}, kNVTEBFloat16);
      NVTETensor tdx1 = desc(dx_plain.ptr, {rows, cols}, kNVTEBFloat16);
      NVTETensor tdx2 = desc(dx_res.ptr, {rows, cols}, kNVTEBFloat16);  // in place: dresidual too
      NVTETensor tres2 = tdx2;
      NVTETensor tdg1 = desc(dg1.ptr, {cols}, kNVTEFloat32), tdb1 = desc(db1.ptr, {cols}, kNVTEFloat32);
      NVTETensor tdg2 = desc(dg2.ptr, {cols}, kNVTEFloat32), tdb2 = desc(db2.ptr, {cols}, kNVTEFloat32);
      NVTETensor ws = desc(nullptr, {0}, kNVTEByte);
      auto plain = [&]() {
        return rms ? nvte_rmsnorm_bwd(&tdz, &tx, &trs, &tg, 0, &tdx1, &tdg1, &ws, nullptr)
                   : nvte_layernorm_bwd(&tdz, &tx, &tmu, &trs, &tg, 0, &tdx1, &tdg1, &tdb1, &ws,
                                        nullptr);
      };
      auto fused = [&](NVTETensor* r) {
        return rms ? nvte_rmsnorm_bwd_residual(&tdz, &tx, &trs, &tg, 0, r, &tdx2, &tdg2, &ws,
                                               nullptr)
                   : nvte_layernorm_bwd_residual(&tdz, &tx, &tmu, &trs, &tg, 0, r, &tdx2, &tdg2,
                                                 &tdb2, &ws, nullptr);
      };
      TE_EXPECT(plain() == kNVTESuccess, "query: %s", nvte_last_error_message());
      DeviceBuffer<uint8_t> wsbuf(size_t(ws.shape[0]));
      ws.data = wsbuf.ptr;
      TE_EXPECT(plain() == kNVTESuccess, "%s", nvte_last_error_message());
      TE_EXPECT(fused(&tres2) == kNVTESuccess, "%s", nvte_last_error_message());
      TE_EXPECT(cuda_ok(), "sync");
      auto d1 = dx_plain.download(), d2 = dx_res.download();
      int bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const double want = double(__bfloat162float(d1[i])) + double(__bfloat162float(drb[i]));
        // the plain dx was rounded once before the add: half a bf16 step of it, then one more
        bad += !near(__bfloat162float(d2[i]), want, 1.2e-2, 1e-2 * std::fabs(__bfloat162float(d1[i])) + 1e-3);
      }
      auto g1 = dg1.download(), g2 = dg2.download(), b1 = db1.download(), b2 = db2.download();
      int diff_w = 0;
      for (int64_t c = 0; c < cols; ++c) diff_w += g1[c] != g2[c] || (!rms && b1[c] != b2[c]);
      TE_EXPECT(bad == 0 && diff_w == 0, "%s %lld x %lld: %d dx mismatches, %d weight-grad diffs",
                rms ? "rmsnorm" : "layernorm", (long long)rows, (long long)cols, bad, diff_w);
      NVTETensor short_res = desc(dres.ptr, {rows, cols - 1}, kNVTEBFloat16);
      TE_EXPECT(fused(&short_res) == kNVTEInvalidArgument, "short dresidual accepted");
      TE_EXPECT(std::strstr(nvte_last_error_message(), "dresidual has shape") != nullptr, "%s",
                nvte_last_error_message());
      TE_EXPECT(fused(nullptr) == kNVTEInvalidArgument, "null dresidual accepted");
    }
  }
}

TE_TEST(normalization_bad_input_returns_status) {
  DeviceBuffer<float> x(64), g(8), z(64);
  NVTETensor tx = desc(x.ptr, {4, 16}, kNVTEFloat32), tg = desc(g.ptr, {8}, kNVTEFloat32);
  NVTETensor tz = desc(z.ptr, {4, 16}, kNVTEFloat32);
  TE_EXPECT(nvte_rmsnorm_fwd(&tx, &tg, 1e-5f, 0, &tz, nullptr, nullptr) == kNVTEInvalidArgument,
            "short gamma accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "nvte_rmsnorm_fwd: gamma") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor tz8 = desc(z.ptr, {4, 16}, kNVTEFloat8E4M3);
  NVTETensor tg16 = desc(g.ptr, {16}, kNVTEFloat32);
  TE_EXPECT(nvte_rmsnorm_fwd(&tx, &tg16, 1e-5f, 0, &tz8, nullptr, nullptr) == kNVTEInvalidArgument,
            "FP8 output without scale accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "scale") != nullptr, "%s",
            nvte_last_error_message());
}
