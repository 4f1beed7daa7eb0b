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
    case kNVTESigmoid: return s1;
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

const NVTEActivation kAll[] = {kNVTEGelu, kNVTERelu, kNVTEQGelu, kNVTESRelu, kNVTESilu,
                               kNVTESigmoid};

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

// Clamped SwiGLU (limit 0.75, alpha 1.702: inputs of scale 2 hit both clamps) against the double
// model, odd width.
TE_TEST(act_clamped_swiglu_fp32_matches_cpu) {
  const int64_t rows = 19, nw = 23;
  const double limit = 0.75, alpha = 1.702;
  const size_t nin = size_t(rows * 2 * nw), nout = size_t(rows * nw);
  std::vector<float> x = random_floats(nin, 8, 2.f), g = random_floats(nout, 9, 1.f);
  DeviceBuffer<float> in(x), grad(g), y(nout), dx(nin);
  NVTETensor ti = desc(in.ptr, {rows, 2 * nw}, kNVTEFloat32);
  NVTETensor tg = desc(grad.ptr, {rows, nw}, kNVTEFloat32);
  NVTETensor ty = desc(y.ptr, {rows, nw}, kNVTEFloat32);
  NVTETensor tdx = desc(dx.ptr, {rows, 2 * nw}, kNVTEFloat32);
  TE_EXPECT(nvte_clamped_swiglu(&ti, &ty, float(limit), float(alpha), nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(nvte_clamped_dswiglu(&tg, &ti, &tdx, float(limit), float(alpha), nullptr) == kNVTESuccess,
            "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto hy = y.download(), hdx = dx.download();
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < nw; ++c) {
      const double a = x[r * 2 * nw + c], b = x[r * 2 * nw + nw + c], dy = g[r * nw + c];
      const double ac = std::fmin(a, limit), bc = std::fmax(-limit, std::fmin(b, limit));
      const double s = 1.0 / (1.0 + std::exp(-alpha * ac)), gate = ac * s;
      const double dgate = a > limit ? 0.0 : s + alpha * ac * s * (1 - s);
      const double dlin = (b < -limit || b > limit) ? 0.0 : 1.0;
      bad += !near(hy[r * nw + c], gate * (bc + 1), 2e-6, 2e-6);
      bad += !near(hdx[r * 2 * nw + c], dy * (bc + 1) * dgate, 2e-6, 2e-6);
      bad += !near(hdx[r * 2 * nw + nw + c], dy * gate * dlin, 2e-6, 2e-6);
    }
  TE_EXPECT(bad == 0, "%d mismatches", bad);
  TE_EXPECT(nvte_clamped_swiglu(&ti, &ty, 0.f, float(alpha), nullptr) == kNVTEInvalidArgument,
            "limit 0 accepted");
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

// ----- nvte_dbias: plain column sums ------------------------------------------------------------

namespace {

// Host values of dtype `dt` rounded from fp32, and their bytes for the device.
struct HostMatrix {
  std::vector<double> values;    // what the device sees, exactly
  std::vector<uint8_t> bytes;
};

HostMatrix make_matrix(size_t n, NVTEDType dt, unsigned seed) {
  std::vector<float> f = random_floats(n, seed, 1.f);
  HostMatrix m;
  m.values.resize(n);
  const size_t es = dt == kNVTEFloat32 ? 4 : 2;
  m.bytes.resize(n * es);
  for (size_t i = 0; i < n; ++i) {
    if (dt == kNVTEFloat32) {
      std::memcpy(&m.bytes[i * 4], &f[i], 4);
      m.values[i] = f[i];
    } else if (dt == kNVTEFloat16) {
      const __half h = __float2half_rn(f[i]);
      std::memcpy(&m.bytes[i * 2], &h, 2);
      m.values[i] = __half2float(h);
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(f[i]);
      std::memcpy(&m.bytes[i * 2], &b, 2);
      m.values[i] = __bfloat162float(b);
    }
  }
  return m;
}

double host_value(const std::vector<uint8_t>& bytes, size_t i, NVTEDType dt) {
  if (dt == kNVTEFloat32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  if (dt == kNVTEFloat16) {
    __half h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return __half2float(h);
  }
  __nv_bfloat16 b;
  std::memcpy(&b, &bytes[i * 2], 2);
  return __bfloat162float(b);
}

// Relative rounding of one value stored in dt (half an ulp, with slack for the fp32 sum).
double out_rtol(NVTEDType dt) {
  return dt == kNVTEFloat32 ? 1e-6 : dt == kNVTEFloat16 ? 1e-3 : 8e-3;
}

// Runs nvte_dbias (size query, then the call) on grad bytes placed `offset` elements into a
// device buffer; returns the status of the call and the dbias bytes.
NVTEStatus run_dbias(const HostMatrix& g, int64_t rows, int64_t cols, NVTEDType gt, NVTEDType bt,
                     size_t offset, std::vector<uint8_t>* out) {
  const size_t es = gt == kNVTEFloat32 ? 4 : 2, bs = bt == kNVTEFloat32 ? 4 : 2;
  DeviceBuffer<uint8_t> grad(g.bytes.size() + offset * es + 16), dbias(size_t(cols) * bs + 16);
  if (!g.bytes.empty())
    cudaMemcpy(grad.ptr + offset * es, g.bytes.data(), g.bytes.size(), cudaMemcpyHostToDevice);
  dbias.fill_bytes(0x7f);  // not zeros: rows == 0 must write them
  NVTETensor tg = desc(grad.ptr + offset * es, {rows, cols}, gt);
  NVTETensor tb = desc(dbias.ptr, {cols}, bt);
  NVTETensor ws{};
  NVTEStatus st = nvte_dbias(&tg, &tb, &ws, nullptr);
  if (st != kNVTESuccess) return st;
  if (!(ws.dtype == kNVTEFloat32 && ws.ndim == 2 && ws.shape[1] == cols && ws.shape[0] >= 0)) {
    std::printf("  bad workspace query: ndim %d\n", ws.ndim);
    return kNVTEDeviceError;
  }
  DeviceBuffer<float> wbuf{size_t(ws.shape[0] * ws.shape[1])};
  ws.data = wbuf.ptr;
  st = nvte_dbias(&tg, &tb, &ws, nullptr);
  if (st != kNVTESuccess) return st;
  if (!cuda_ok()) return kNVTEDeviceError;
  std::vector<uint8_t> all = dbias.download();
  out->assign(all.begin(), all.begin() + int64_t(size_t(cols) * bs));
  return st;
}

}  // namespace

TE_TEST(act_dbias_column_sums_match_cpu) {
  // Odd widths and unaligned pointers take the scalar path; 1032 = whole strips and a part;
  // 64/65 rows are the edge of a single row block; 20000 x 40 many row blocks of a narrow strip.
  const int64_t shapes[][2] = {{0, 24},    {1, 8},      {1, 4096},  {37, 23},    {64, 136},
                               {65, 136},  {300, 1000}, {4096, 96}, {5000, 1032}, {20000, 40},
                               {3000, 4104}, {129, 4097}};
  const NVTEDType types[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};
  unsigned seed = 100;
  for (auto& sh : shapes) {
    const int64_t rows = sh[0], cols = sh[1];
    for (NVTEDType gt : types) {
      const HostMatrix g = make_matrix(size_t(rows * cols), gt, ++seed);
      std::vector<double> sum(size_t(cols), 0.0), abs_sum(size_t(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const double v = g.values[size_t(r * cols + c)];
          sum[size_t(c)] += v;
          abs_sum[size_t(c)] += std::fabs(v);
        }
      for (NVTEDType bt : {kNVTEFloat32, gt}) {
        for (size_t offset : {size_t(0), size_t(1)}) {
          std::vector<uint8_t> out;
          const NVTEStatus st = run_dbias(g, rows, cols, gt, bt, offset, &out);
          TE_EXPECT(st == kNVTESuccess, "%lld x %lld: %s", (long long)rows, (long long)cols,
                    nvte_last_error_message());
          if (st != kNVTESuccess) continue;
          int bad = 0;
          double worst = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double got = host_value(out, size_t(c), bt), want = sum[size_t(c)];
            // fp32 sums in another order than the double loop: a few ulps of the absolute sum,
            // then one rounding to the output dtype. A missing or repeated row is off by ~1.
            const double tol = 1e-6 * abs_sum[size_t(c)] + out_rtol(bt) * std::fabs(want) + 1e-30;
            const double err = std::fabs(got - want);
            bad += !(err <= tol);  // NaN counts as bad
            worst = std::fmax(worst, err / tol);
          }
          TE_EXPECT(bad == 0, "%s -> %s %lld x %lld offset %zu: %d of %lld columns off (worst %.2g x tol)",
                    nvte_dtype_name(gt), nvte_dtype_name(bt), (long long)rows, (long long)cols,
                    offset, bad, (long long)cols, worst);
        }
      }
    }
  }
}

TE_TEST(act_dbias_is_deterministic) {
  const int64_t rows = 8192, cols = 2048;
  const HostMatrix g = make_matrix(size_t(rows * cols), kNVTEBFloat16, 7);
  std::vector<uint8_t> a, b;
  TE_EXPECT(run_dbias(g, rows, cols, kNVTEBFloat16, kNVTEFloat32, 0, &a) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(run_dbias(g, rows, cols, kNVTEBFloat16, kNVTEFloat32, 0, &b) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(a.size() == size_t(cols) * 4 && a == b, "two calls differ");
}

TE_TEST(act_dbias_bad_input_returns_status_and_message) {
  DeviceBuffer<float> buf(64), ws(64);
  auto fails_with = [](NVTEStatus st, const char* a, const char* b) {
    const char* msg = nvte_last_error_message();
    return st == kNVTEInvalidArgument && std::strstr(msg, "nvte_dbias") != nullptr &&
           std::strstr(msg, a) != nullptr && std::strstr(msg, b) != nullptr;
  };
  NVTETensor g = desc(buf.ptr, {4, 6}, kNVTEFloat32);
  NVTETensor db = desc(buf.ptr, {6}, kNVTEFloat32);
  NVTETensor w{};
  // FP8 input
  NVTETensor g8 = desc(buf.ptr, {4, 6}, kNVTEFloat8E4M3);
  TE_EXPECT(fails_with(nvte_dbias(&g8, &db, &w, nullptr), "grad has dtype float8_e4m3",
                       "expected float32, float16 or bfloat16"), "%s", nvte_last_error_message());
  // not 2-D
  NVTETensor g3 = desc(buf.ptr, {2, 2, 6}, kNVTEFloat32);
  TE_EXPECT(fails_with(nvte_dbias(&g3, &db, &w, nullptr), "grad has shape [2, 2, 6]", "2-D"), "%s",
            nvte_last_error_message());
  NVTETensor g1 = desc(buf.ptr, {6}, kNVTEFloat32);
  TE_EXPECT(fails_with(nvte_dbias(&g1, &db, &w, nullptr), "grad has shape [6]", "2-D"), "%s",
            nvte_last_error_message());
  // dbias of the wrong length or dtype
  NVTETensor db5 = desc(buf.ptr, {5}, kNVTEFloat32);
  TE_EXPECT(fails_with(nvte_dbias(&g, &db5, &w, nullptr), "dbias has shape [5]", "expected [6]"),
            "%s", nvte_last_error_message());
  NVTETensor db8 = desc(buf.ptr, {6}, kNVTEFloat8E5M2);
  TE_EXPECT(fails_with(nvte_dbias(&g, &db8, &w, nullptr), "dbias has dtype float8_e5m2",
                       "expected float32"), "%s", nvte_last_error_message());
  // a workspace too small for the real call
  const int64_t rows = 4096, cols = 256;
  DeviceBuffer<float> big{size_t(rows * cols)}, out{size_t(cols)};
  NVTETensor gb = desc(big.ptr, {rows, cols}, kNVTEFloat32);
  NVTETensor ob = desc(out.ptr, {cols}, kNVTEFloat32);
  NVTETensor q{};
  TE_EXPECT(nvte_dbias(&gb, &ob, &q, nullptr) == kNVTESuccess && q.ndim == 2 && q.shape[0] > 1,
            "query for %lld rows: %s", (long long)rows, nvte_last_error_message());
  NVTETensor small = desc(ws.ptr, {64}, kNVTEFloat32);
  TE_EXPECT(fails_with(nvte_dbias(&gb, &ob, &small, nullptr), "workspace", "at least"), "%s",
            nvte_last_error_message());
  TE_EXPECT(nvte_dbias(&gb, &ob, nullptr, nullptr) == kNVTEInvalidArgument, "null workspace");
}
