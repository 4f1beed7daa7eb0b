// C API tests of nvte_gemm against CPU loops: layouts, epilogues, accumulation, FP8 operands and
// output, the statuses of refused requests, and the same bits from every thread.
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "test_common.h"
#include "transformer_engine/gemm.h"

using namespace te_test;

namespace {

struct Workspace {
  DeviceBuffer<uint8_t> buf{nvte_gemm_workspace_size()};
};

float gelu(float x) { return 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
float dgelu(float x) {
  const float t = std::tanh(0.7978845608f * (x + 0.044715f * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 3.f * 0.044715f * x * x);
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}
std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// Row-major product D[n][m] = op_b(B) @ op_a(A), as documented in gemm.h.
std::vector<double> cpu_gemm(const std::vector<float>& a, const std::vector<float>& b, bool transa,
                             bool transb, int64_t m, int64_t n, int64_t k) {
  std::vector<double> d(size_t(m * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double bv = transb ? b[p * n + i] : b[i * k + p];  // B [k, n] or [n, k]
        const double av = transa ? a[j * k + p] : a[p * m + j];  // A [m, k] or [k, m]
        s += av * bv;
      }
      d[i * m + j] = s;
    }
  return d;
}

bool close(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// bf16 GEMM with an epilogue, compared element by element with the CPU loop.
void check_bf16(bool transa, bool transb, int64_t m, int64_t n, int64_t k, NVTEGemmEpilogue epi,
                float beta, unsigned seed) {
  Workspace ws;
  auto a = from_bf16(to_bf16(random_floats(size_t(m * k), seed)));
  auto b = from_bf16(to_bf16(random_floats(size_t(n * k), seed + 1)));
  auto bias = from_bf16(to_bf16(random_floats(size_t(m), seed + 2)));
  auto aux_in = from_bf16(to_bf16(random_floats(size_t(m * n), seed + 3, 2.f)));
  auto d0 = from_bf16(to_bf16(random_floats(size_t(m * n), seed + 4)));
  DeviceBuffer<__nv_bfloat16> da(to_bf16(a)), db(to_bf16(b)), dd(to_bf16(d0)), dbias(to_bf16(bias)),
      daux(to_bf16(aux_in));
  NVTETensor A = desc(da.ptr, transa ? std::vector<int64_t>{m, k} : std::vector<int64_t>{k, m},
                      kNVTEBFloat16);
  NVTETensor B = desc(db.ptr, transb ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k},
                      kNVTEBFloat16);
  NVTETensor D = desc(dd.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor Bias = desc(dbias.ptr, {m}, kNVTEBFloat16);
  NVTETensor Aux = desc(daux.ptr, {n, m}, kNVTEBFloat16);
  const NVTEStatus st = nvte_gemm(&A, transa, &B, transb, &D, &Bias, &Aux, epi, 1.f, beta, false,
                                  ws.buf.ptr, ws.buf.n, nullptr);
  TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto want = cpu_gemm(a, b, transa, transb, m, n, k);
  auto got = from_bf16(dd.download());
  auto got_aux = from_bf16(daux.download());
  auto got_bias = from_bf16(dbias.download());
  std::vector<double> bgrad(size_t(m), 0.0), bgrad_tol(size_t(m), 0.0);
  int bad = 0, bad_aux = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const size_t idx = size_t(i * m + j);
      double r = want[idx] + beta * d0[idx];
      // Libraries may round the summands to bf16 before adding them (beta != 0, the unfused
      // epilogue), and the GELU epilogues use a hardware tanh (up to ~2e-3 absolute on gelu').
      double atol = 1e-3 * std::sqrt(double(k)) + 1e-2 * (std::fabs(want[idx]) + std::fabs(beta * d0[idx]));
      if (epi == kNVTEGemmEpilogueBias || epi == kNVTEGemmEpilogueBiasGeluAux) {
        r += bias[j];
        atol += 1e-2 * std::fabs(bias[j]);
      }
      if (epi != kNVTEGemmEpilogueNone && epi != kNVTEGemmEpilogueBias) atol += 5e-3 * std::fabs(r);
      if (epi == kNVTEGemmEpilogueGeluAux || epi == kNVTEGemmEpilogueBiasGeluAux) {
        bad_aux += !close(got_aux[idx], r, 1.6e-2, atol);
        r = gelu(float(r));
      }
      if (epi == kNVTEGemmEpilogueDGelu || epi == kNVTEGemmEpilogueDGeluBGrad) r *= dgelu(aux_in[idx]);
      bgrad[size_t(j)] += r;
      bgrad_tol[size_t(j)] += atol + 1e-2 * std::fabs(r);  // D may be summed after rounding
      bad += !close(got[idx], r, 1.6e-2, atol);
    }
  TE_EXPECT(bad == 0 && bad_aux == 0, "%d D / %d aux mismatches, %s%s m=%lld n=%lld k=%lld epi %d",
            bad, bad_aux, transa ? "T" : "N", transb ? "T" : "N", (long long)m, (long long)n,
            (long long)k, int(epi));
  if (epi == kNVTEGemmEpilogueDGeluBGrad) {
    int bad_b = 0;
    for (int64_t j = 0; j < m; ++j) bad_b += !close(got_bias[j], bgrad[j], 2e-2, bgrad_tol[j]);
    TE_EXPECT(bad_b == 0, "%d bias-gradient mismatches", bad_b);
  }
}

int compute_major() {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major;
}
int compute_minor() {
  int minor = 0;
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return minor;
}

}  // namespace

TE_TEST(gemm_bf16_layouts_and_epilogues_match_cpu) {
  const bool layouts[][2] = {{true, false}, {false, false}, {false, true}};
  const NVTEGemmEpilogue epis[] = {kNVTEGemmEpilogueNone, kNVTEGemmEpilogueBias,
                                   kNVTEGemmEpilogueGeluAux, kNVTEGemmEpilogueBiasGeluAux,
                                   kNVTEGemmEpilogueDGelu, kNVTEGemmEpilogueDGeluBGrad};
  unsigned seed = 1;
  for (auto& l : layouts)
    for (auto e : epis) {
      check_bf16(l[0], l[1], 37, 29, 23, e, 0.f, seed++);   // odd: unfused GELU path
      check_bf16(l[0], l[1], 64, 48, 80, e, 1.f, seed++);   // aligned, accumulating
    }
}

TE_TEST(gemm_fp8_tn_matches_cpu) {
  if (compute_major() * 10 + compute_minor() < 89) return;  // no FP8 tensor cores
  Workspace ws;
  const int64_t m = 64, n = 32, k = 48;
  // |result * 2| stays well under 448, so saturation (library-defined) is not exercised here.
  auto a = random_floats(size_t(m * k), 5, 4.f), b = random_floats(size_t(n * k), 6, 8.f);
  std::vector<uint8_t> qa(a.size()), qb(b.size()), qb4(b.size());
  std::vector<float> fa(a.size()), fb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    qa[i] = host_fp8(a[i], true);
    fa[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(qa[i], __NV_E4M3))) * 0.25f;
  }
  for (size_t i = 0; i < b.size(); ++i) {
    qb[i] = host_fp8(b[i], false);
    qb4[i] = host_fp8(b[i], true);
    fb[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(qb[i], __NV_E5M2))) * 0.5f;
  }
  DeviceBuffer<uint8_t> da(qa), db(qb), db4(qb4), dq(size_t(m * n));
  DeviceBuffer<float> dd(size_t(m * n)), sa(std::vector<float>{0.25f}), sb(std::vector<float>{0.5f}),
      scale(std::vector<float>{2.f}), amax(std::vector<float>{0.f}), scale_inv(std::vector<float>{0.f});
  NVTETensor A = desc(da.ptr, {m, k}, kNVTEFloat8E4M3, nullptr, nullptr, sa.ptr);
  NVTETensor B = desc(db.ptr, {n, k}, kNVTEFloat8E5M2, nullptr, nullptr, sb.ptr);
  NVTETensor D = desc(dd.ptr, {n, m}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm(&A, true, &B, false, &D, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f, 0.f,
                      false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  // FP8 output E4M3 with scale 2: amax and scale_inv written on the device.
  NVTETensor A2 = desc(da.ptr, {m, k}, kNVTEFloat8E4M3, nullptr, nullptr, sa.ptr);
  NVTETensor B2 = desc(db4.ptr, {n, k}, kNVTEFloat8E4M3, nullptr, nullptr, sb.ptr);
  NVTETensor Q = desc(dq.ptr, {n, m}, kNVTEFloat8E4M3, amax.ptr, scale.ptr, scale_inv.ptr);
  TE_EXPECT(nvte_gemm(&A2, true, &B2, false, &Q, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f, 0.f,
                      true, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto want = cpu_gemm(fa, fb, true, false, m, n, k);
  auto got = dd.download();
  int bad = 0;
  // FP8 tensor cores accumulate in fewer bits than fp32 even without fast accumulation.
  for (size_t i = 0; i < got.size(); ++i) bad += !close(got[i], want[i], 2e-3, 2e-2);
  TE_EXPECT(bad == 0, "%d fp32-out mismatches", bad);
  std::vector<float> fb4(qb4.size());
  for (size_t i = 0; i < qb4.size(); ++i)
    fb4[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(qb4[i], __NV_E4M3))) * 0.5f;
  auto want4 = cpu_gemm(fa, fb4, true, false, m, n, k);
  double want_amax = 0;
  for (double v : want4) want_amax = std::fmax(want_amax, std::fabs(v));
  TE_EXPECT(std::fabs(amax.download()[0] - want_amax) <= 5e-3 * want_amax, "amax %g vs %g",
            amax.download()[0], want_amax);
  TE_EXPECT(scale_inv.download()[0] == 0.5f, "scale_inv");
  auto q = dq.download();
  int bad_q = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const float deq = __half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3))) * 0.5f;
    const double sat = std::fmax(-224.0, std::fmin(224.0, want4[i]));  // 448 / scale
    bad_q += !close(deq, sat, 0.125, 0.07);
  }
  TE_EXPECT(bad_q == 0, "%d fp8-out mismatches", bad_q);
}

TE_TEST(gemm_refusals_return_status) {
  Workspace ws;
  DeviceBuffer<uint8_t> a8(64 * 64), b8(64 * 64);
  DeviceBuffer<float> d(64 * 64), one(std::vector<float>{1.f});
  // FP8 with m = 40: invalid argument, whatever the device.
  NVTETensor A = desc(a8.ptr, {40, 32}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor B = desc(b8.ptr, {16, 32}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor D = desc(d.ptr, {16, 40}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm(&A, true, &B, false, &D, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f, 0.f,
                      true, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEInvalidArgument,
            "m=40 FP8 accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "multiples of 16") != nullptr, "%s",
            nvte_last_error_message());
  // FP8 NN on Hopper/Ada: unsupported, with the layout named.
  const int cc = compute_major() * 10 + compute_minor();
  NVTETensor A2 = desc(a8.ptr, {32, 32}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor B2 = desc(b8.ptr, {16, 32}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor D2 = desc(d.ptr, {16, 32}, kNVTEFloat32);
  const NVTEStatus nn = nvte_gemm(&A2, false, &B2, false, &D2, nullptr, nullptr,
                                  kNVTEGemmEpilogueNone, 1.f, 0.f, true, ws.buf.ptr, ws.buf.n,
                                  nullptr);
  if (cc >= 89 && cc < 100)
    TE_EXPECT(nn == kNVTEUnsupported && std::strstr(nvte_last_error_message(), "TN layout"),
              "FP8 NN on sm_%d: status %d, %s", cc, int(nn), nvte_last_error_message());
  // Mismatched reduction dimension, missing bias, bad epilogue value.
  DeviceBuffer<float> fa(64 * 64), fb(64 * 64);
  NVTETensor FA = desc(fa.ptr, {8, 16}, kNVTEFloat32), FB = desc(fb.ptr, {4, 15}, kNVTEFloat32);
  NVTETensor FD = desc(d.ptr, {4, 8}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm(&FA, true, &FB, false, &FD, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f, 0.f,
                      false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEInvalidArgument, "k mismatch");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "reduction dimension") != nullptr, "%s",
            nvte_last_error_message());
  NVTETensor FB2 = desc(fb.ptr, {4, 16}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm(&FA, true, &FB2, false, &FD, nullptr, nullptr, kNVTEGemmEpilogueBias, 1.f,
                      0.f, false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEInvalidArgument,
            "missing bias accepted");
  TE_EXPECT(nvte_gemm(&FA, true, &FB2, false, &FD, nullptr, nullptr, NVTEGemmEpilogue(42), 1.f,
                      0.f, false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEInvalidArgument,
            "epilogue 42 accepted");
  TE_EXPECT(nvte_gemm_workspace_size() >= (size_t(32) << 20), "workspace size %zu",
            nvte_gemm_workspace_size());
}

TE_TEST(gemm_empty_batch_zeroes_bias_grad) {
  Workspace ws;
  const int64_t m = 24, k = 16;
  DeviceBuffer<float> a(size_t(m * k)), bias(std::vector<float>(size_t(m), 7.f)), dummy(16);
  NVTETensor A = desc(a.ptr, {m, k}, kNVTEFloat32);
  NVTETensor B = desc(nullptr, {0, k}, kNVTEFloat32);
  NVTETensor D = desc(nullptr, {0, m}, kNVTEFloat32);
  NVTETensor Bias = desc(bias.ptr, {m}, kNVTEFloat32);
  NVTETensor Aux = desc(nullptr, {0, m}, kNVTEFloat32);
  TE_EXPECT(nvte_gemm(&A, true, &B, false, &D, &Bias, &Aux, kNVTEGemmEpilogueDGeluBGrad, 1.f, 0.f,
                      false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  for (float v : bias.download()) TE_EXPECT(v == 0.f, "bias grad over no rows is %g", v);
}

// BGradB (the wgrad layout NT): D = op(B) op(A) and the bias = B's column sums, fused by the
// library where it can, else by the portable epilogue; any other layout is refused.
TE_TEST(gemm_bgradb_sums_b_and_refuses_other_layouts) {
  Workspace ws;
  const int64_t m = 64, n = 48, k = 80;
  auto a = from_bf16(to_bf16(random_floats(size_t(k * m), 11)));
  auto b = from_bf16(to_bf16(random_floats(size_t(k * n), 12)));
  DeviceBuffer<__nv_bfloat16> da(to_bf16(a)), db(to_bf16(b)), dd(static_cast<size_t>(n * m)),
      dbias(static_cast<size_t>(n));
  NVTETensor A = desc(da.ptr, {k, m}, kNVTEBFloat16), B = desc(db.ptr, {k, n}, kNVTEBFloat16);
  NVTETensor D = desc(dd.ptr, {n, m}, kNVTEBFloat16), Bias = desc(dbias.ptr, {n}, kNVTEBFloat16);
  TE_EXPECT(nvte_gemm(&A, false, &B, true, &D, &Bias, nullptr, kNVTEGemmEpilogueBGradB, 1.f, 0.f,
                      false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto want = cpu_gemm(a, b, false, true, m, n, k);
  auto got = from_bf16(dd.download());
  auto got_bias = from_bf16(dbias.download());
  int bad = 0, bad_b = 0;
  for (size_t i = 0; i < want.size(); ++i)
    bad += !close(got[i], want[i], 1.6e-2, 1e-3 * std::sqrt(double(k)));
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0.0, mag = 0.0;
    for (int64_t r = 0; r < k; ++r) {
      sum += b[size_t(r * n + j)];
      mag += std::fabs(b[size_t(r * n + j)]);
    }
    bad_b += !close(got_bias[size_t(j)], sum, 1.6e-2, 1e-5 * mag + 1e-3);
  }
  TE_EXPECT(bad == 0 && bad_b == 0, "%d D / %d bias mismatches", bad, bad_b);
  NVTETensor Bn = desc(db.ptr, {n, k}, kNVTEBFloat16);  // transb = false
  TE_EXPECT(nvte_gemm(&A, false, &Bn, false, &D, &Bias, nullptr, kNVTEGemmEpilogueBGradB, 1.f,
                      0.f, false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEUnsupported,
            "BGradB with layout NN accepted");
  TE_EXPECT(std::strstr(nvte_last_error_message(), "BGradB") != nullptr, "%s",
            nvte_last_error_message());
}

// ---- nvte_gemm_with_c: the addend C in a buffer of its own ------------------------------------

namespace {

bool has_message(const char* part) { return std::strstr(nvte_last_error_message(), part) != nullptr; }

// bf16 D = epilogue(op(A) op(B) + beta C) with a distinct bf16 C, against the CPU loop. D starts
// as NaN (0xFFFF), so a library that read D instead of C (or added C twice) shows; C must come
// back untouched. beta = 0 fills C with NaN too: it must not be read at all.
void check_with_c(bool transa, bool transb, int64_t m, int64_t n, int64_t k, NVTEGemmEpilogue epi,
                  float beta, unsigned seed) {
  Workspace ws;
  auto a = from_bf16(to_bf16(random_floats(size_t(m * k), seed)));
  auto b = from_bf16(to_bf16(random_floats(size_t(n * k), seed + 1)));
  auto bias = from_bf16(to_bf16(random_floats(size_t(m), seed + 2)));
  auto c0 = from_bf16(to_bf16(random_floats(size_t(m * n), seed + 4, 2.f)));
  DeviceBuffer<__nv_bfloat16> da(to_bf16(a)), db(to_bf16(b)), dc(to_bf16(c0)), dbias(to_bf16(bias)),
      dd(size_t(m * n)), daux(size_t(m * n));
  dd.fill_bytes(0xFF);
  daux.fill_bytes(0xFF);
  if (beta == 0.f) dc.fill_bytes(0xFF);
  const auto c_before = dc.download();
  NVTETensor A = desc(da.ptr, transa ? std::vector<int64_t>{m, k} : std::vector<int64_t>{k, m},
                      kNVTEBFloat16);
  NVTETensor B = desc(db.ptr, transb ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k},
                      kNVTEBFloat16);
  NVTETensor C = desc(dc.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor D = desc(dd.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor Bias = desc(dbias.ptr, {m}, kNVTEBFloat16);
  NVTETensor Aux = desc(daux.ptr, {n, m}, kNVTEBFloat16);
  const NVTEStatus st = nvte_gemm_with_c(&A, transa, &B, transb, &C, &D, &Bias, &Aux, epi, 1.f,
                                         beta, false, ws.buf.ptr, ws.buf.n, nullptr);
  TE_EXPECT(st == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto want = cpu_gemm(a, b, transa, transb, m, n, k);
  auto got = from_bf16(dd.download());
  auto got_aux = from_bf16(daux.download());
  int bad = 0, bad_aux = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const size_t idx = size_t(i * m + j);
      const double cv = beta != 0.f ? beta * c0[idx] : 0.0;
      double r = want[idx] + cv;
      // as check_bf16: the summands may be rounded to bf16 before they are added
      double atol = 1e-3 * std::sqrt(double(k)) + 1e-2 * (std::fabs(want[idx]) + std::fabs(cv));
      if (epi == kNVTEGemmEpilogueBias || epi == kNVTEGemmEpilogueBiasGeluAux) {
        r += bias[j];
        atol += 1e-2 * std::fabs(bias[j]);
      }
      if (epi == kNVTEGemmEpilogueBiasGeluAux) {
        atol += 5e-3 * std::fabs(r);
        bad_aux += !close(got_aux[idx], r, 1.6e-2, atol);
        r = gelu(float(r));
      }
      bad += !close(got[idx], r, 1.6e-2, atol);  // NaN never compares close
    }
  const char* l = transa ? (transb ? "TT" : "TN") : (transb ? "NT" : "NN");
  TE_EXPECT(bad == 0 && bad_aux == 0, "%d D / %d aux mismatches, %s m=%lld n=%lld k=%lld epi %d "
            "beta %g", bad, bad_aux, l, (long long)m, (long long)n, (long long)k, int(epi), beta);
  const auto c_after = dc.download();
  TE_EXPECT(std::memcmp(c_before.data(), c_after.data(), c_after.size() * 2) == 0,
            "C was written (%s epi %d)", l, int(epi));
}

}  // namespace

TE_TEST(gemm_with_c_distinct_addend_matches_cpu) {
  const bool layouts[][2] = {{true, false}, {false, false}, {false, true}};
  const NVTEGemmEpilogue epis[] = {kNVTEGemmEpilogueNone, kNVTEGemmEpilogueBias,
                                   kNVTEGemmEpilogueBiasGeluAux};
  unsigned seed = 101;
  for (auto& l : layouts)
    for (auto e : epis)
      for (float beta : {1.f, 0.5f}) {
        check_with_c(l[0], l[1], 64, 48, 80, e, beta, seed++);  // fused library epilogues
        check_with_c(l[0], l[1], 37, 29, 23, e, beta, seed++);  // odd: the unfused GELU path
      }
  // beta = 0: C (NaN here) is not read; k = 0: D = epilogue(beta C), the portable kernel
  check_with_c(true, false, 64, 48, 80, kNVTEGemmEpilogueBias, 0.f, seed++);
  check_with_c(true, false, 40, 24, 0, kNVTEGemmEpilogueBiasGeluAux, 0.5f, seed++);
  check_with_c(false, true, 40, 24, 0, kNVTEGemmEpilogueNone, 1.f, seed++);
}

// C == D is nvte_gemm with beta: accumulation into D; so is C = NULL.
TE_TEST(gemm_with_c_same_as_d_accumulates) {
  Workspace ws;
  const int64_t m = 48, n = 32, k = 64;
  auto a = from_bf16(to_bf16(random_floats(size_t(m * k), 201)));
  auto b = from_bf16(to_bf16(random_floats(size_t(n * k), 202)));
  auto d0 = from_bf16(to_bf16(random_floats(size_t(m * n), 203)));
  auto bias = from_bf16(to_bf16(random_floats(size_t(m), 204)));
  DeviceBuffer<__nv_bfloat16> da(to_bf16(a)), db(to_bf16(b)), dd(to_bf16(d0)), dd2(to_bf16(d0)),
      dbias(to_bf16(bias));
  NVTETensor A = desc(da.ptr, {m, k}, kNVTEBFloat16), B = desc(db.ptr, {n, k}, kNVTEBFloat16);
  NVTETensor D = desc(dd.ptr, {n, m}, kNVTEBFloat16), D2 = desc(dd2.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor Bias = desc(dbias.ptr, {m}, kNVTEBFloat16);
  TE_EXPECT(nvte_gemm_with_c(&A, true, &B, false, &D, &D, &Bias, nullptr, kNVTEGemmEpilogueBias,
                             1.f, 1.f, false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess,
            "%s", nvte_last_error_message());
  TE_EXPECT(nvte_gemm_with_c(&A, true, &B, false, nullptr, &D2, &Bias, nullptr,
                             kNVTEGemmEpilogueBias, 1.f, 1.f, false, ws.buf.ptr, ws.buf.n,
                             nullptr) == kNVTESuccess, "%s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "sync");
  auto want = cpu_gemm(a, b, true, false, m, n, k);
  auto got = from_bf16(dd.download()), got2 = from_bf16(dd2.download());
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = want[i] + d0[i] + bias[i % size_t(m)];
    const double atol = 1e-3 * std::sqrt(double(k)) + 1e-2 * (std::fabs(want[i]) + std::fabs(d0[i]) +
                                                               std::fabs(bias[i % size_t(m)]));
    bad += !close(got[i], r, 1.6e-2, atol) || got2[i] != got[i];
  }
  TE_EXPECT(bad == 0, "%d mismatches of C == D / C = NULL accumulation", bad);
}

// FP8 operands with a bf16 D and a distinct bf16 C (cuBLASLt: C's type = D's type for FP8 inputs),
// with and without the bias epilogue: y = x W^T + b + residual in FP8.
TE_TEST(gemm_with_c_fp8_operands_bf16_addend) {
  if (compute_major() * 10 + compute_minor() < 89) return;  // no FP8 tensor cores
  Workspace ws;
  const int64_t m = 64, n = 32, k = 48;
  auto a = random_floats(size_t(m * k), 211, 4.f), b = random_floats(size_t(n * k), 212, 8.f);
  std::vector<uint8_t> qa(a.size()), qb(b.size());
  std::vector<float> fa(a.size()), fb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    qa[i] = host_fp8(a[i], true);
    fa[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(qa[i], __NV_E4M3))) * 0.25f;
  }
  for (size_t i = 0; i < b.size(); ++i) {
    qb[i] = host_fp8(b[i], true);
    fb[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(qb[i], __NV_E4M3))) * 0.5f;
  }
  auto c0 = from_bf16(to_bf16(random_floats(size_t(m * n), 213, 4.f)));
  auto bias = from_bf16(to_bf16(random_floats(size_t(m), 214)));
  DeviceBuffer<uint8_t> da(qa), db(qb);
  DeviceBuffer<__nv_bfloat16> dc(to_bf16(c0)), dd(size_t(m * n)), dbias(to_bf16(bias));
  DeviceBuffer<float> sa(std::vector<float>{0.25f}), sb(std::vector<float>{0.5f});
  NVTETensor A = desc(da.ptr, {m, k}, kNVTEFloat8E4M3, nullptr, nullptr, sa.ptr);
  NVTETensor B = desc(db.ptr, {n, k}, kNVTEFloat8E4M3, nullptr, nullptr, sb.ptr);
  NVTETensor C = desc(dc.ptr, {n, m}, kNVTEBFloat16), D = desc(dd.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor Bias = desc(dbias.ptr, {m}, kNVTEBFloat16);
  auto want = cpu_gemm(fa, fb, true, false, m, n, k);
  for (bool with_bias : {false, true}) {
    dd.fill_bytes(0xFF);
    TE_EXPECT(nvte_gemm_with_c(&A, true, &B, false, &C, &D, with_bias ? &Bias : nullptr, nullptr,
                               with_bias ? kNVTEGemmEpilogueBias : kNVTEGemmEpilogueNone, 1.f,
                               1.f, true, ws.buf.ptr, ws.buf.n, nullptr) == kNVTESuccess,
              "%s", nvte_last_error_message());
    TE_EXPECT(cuda_ok(), "sync");
    auto got = from_bf16(dd.download());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double bv = with_bias ? bias[i % size_t(m)] : 0.0;
      const double r = want[i] + c0[i] + bv;
      const double atol = 2e-2 + 1e-2 * (std::fabs(want[i]) + std::fabs(c0[i]) + std::fabs(bv));
      bad += !close(got[i], r, 1.6e-2, atol);
    }
    TE_EXPECT(bad == 0, "%d mismatches (FP8 x FP8 + bf16 C, bias %d)", bad, int(with_bias));
  }
}

TE_TEST(gemm_with_c_refusals_return_status) {
  Workspace ws;
  const int64_t m = 32, n = 16, k = 32;
  DeviceBuffer<__nv_bfloat16> a(size_t(m * k)), b(size_t(n * k)), c(size_t(2 * m * n)),
      d(size_t(2 * m * n));
  DeviceBuffer<float> cf(size_t(m * n)), one(std::vector<float>{1.f});
  NVTETensor A = desc(a.ptr, {m, k}, kNVTEBFloat16), B = desc(b.ptr, {n, k}, kNVTEBFloat16);
  NVTETensor D = desc(d.ptr, {n, m}, kNVTEBFloat16);
  auto call = [&](const NVTETensor* A_, const NVTETensor* B_, const NVTETensor* C_,
                  NVTETensor* D_) {
    return nvte_gemm_with_c(A_, true, B_, false, C_, D_, nullptr, nullptr, kNVTEGemmEpilogueNone,
                            1.f, 1.f, true, ws.buf.ptr, ws.buf.n, nullptr);
  };
  NVTETensor C_shape = desc(c.ptr, {n, m + 1}, kNVTEBFloat16);
  TE_EXPECT(call(&A, &B, &C_shape, &D) == kNVTEInvalidArgument, "C of the wrong shape accepted");
  TE_EXPECT(has_message("nvte_gemm_with_c") && has_message("C has shape") &&
                has_message("expected D's shape [16, 32]"), "%s", nvte_last_error_message());
  NVTETensor C_type = desc(cf.ptr, {n, m}, kNVTEFloat32);
  TE_EXPECT(call(&A, &B, &C_type, &D) == kNVTEInvalidArgument, "C of the wrong dtype accepted");
  TE_EXPECT(has_message("C has dtype float32") && has_message("like D"), "%s",
            nvte_last_error_message());
  // C overlapping D at another address (half a row further on)
  NVTETensor D_over = desc(d.ptr, {n, m}, kNVTEBFloat16);
  NVTETensor C_over = desc(d.ptr + m / 2, {n, m}, kNVTEBFloat16);
  TE_EXPECT(call(&A, &B, &C_over, &D_over) == kNVTEInvalidArgument, "overlapping C accepted");
  TE_EXPECT(has_message("C overlaps D"), "%s", nvte_last_error_message());
  // FP8 D with a distinct C, whatever beta (checked before any device query: on every device)
  DeviceBuffer<uint8_t> a8(size_t(m * k)), b8(size_t(n * k)), d8(size_t(m * n));
  NVTETensor A8 = desc(a8.ptr, {m, k}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor B8 = desc(b8.ptr, {n, k}, kNVTEFloat8E4M3, nullptr, nullptr, one.ptr);
  NVTETensor D8 = desc(d8.ptr, {n, m}, kNVTEFloat8E4M3, nullptr, one.ptr, nullptr);
  NVTETensor C16 = desc(c.ptr, {n, m}, kNVTEBFloat16);
  for (float beta : {1.f, 0.f}) {
    TE_EXPECT(nvte_gemm_with_c(&A8, true, &B8, false, &C16, &D8, nullptr, nullptr,
                               kNVTEGemmEpilogueNone, 1.f, beta, true, ws.buf.ptr, ws.buf.n,
                               nullptr) == kNVTEInvalidArgument,
              "FP8 D with a distinct C accepted (beta %g)", beta);
    TE_EXPECT(has_message("nvte_gemm_with_c") && has_message("high-precision D"), "%s",
              nvte_last_error_message());
  }
  // nvte_gemm's own errors keep its name
  NVTETensor Bk = desc(b.ptr, {n, k - 1}, kNVTEBFloat16);
  TE_EXPECT(nvte_gemm(&A, true, &Bk, false, &D, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f, 0.f,
                      false, ws.buf.ptr, ws.buf.n, nullptr) == kNVTEInvalidArgument, "k mismatch");
  TE_EXPECT(std::strncmp(nvte_last_error_message(), "nvte_gemm: ", 11) == 0, "%s",
            nvte_last_error_message());
}

// The same product on two threads, one after the other, gives the same bits. A problem this
// large has its algorithm timed once (cuBLASLt, gemm_cublaslt.cpp): the second thread's plan takes
// the first thread's choice instead of timing again, where noise could pick another algorithm
// (autograd runs the backward, and recomputed forwards, on a thread of its own). The threads are
// plain std::threads that bind no context themselves, as a C API caller's may: the library binds
// the device's context on a thread's first GEMM. The emulated device runs a reference loop (no
// algorithms), on a small problem.
TE_TEST(gemm_same_problem_same_bits_on_every_thread) {
#if defined(TE_HIPCPU_EMULATION)
  const int64_t m = 64, n = 48, k = 96;
#else
  const int64_t m = 2048, n = 2048, k = 4096;  // 3.4e10 flops: above the timing threshold
#endif
  Workspace ws;
  DeviceBuffer<__nv_bfloat16> da(to_bf16(random_floats(size_t(m * k), 81))),
      db(to_bf16(random_floats(size_t(n * k), 82))), d1(size_t(m * n)), d2(size_t(m * n));
  std::string message1, message2;  // the error message is per thread
  auto product = [&](DeviceBuffer<__nv_bfloat16>& d, NVTEStatus* status, bool* synced,
                     std::string* message) {
    NVTETensor A = desc(da.ptr, {m, k}, kNVTEBFloat16);
    NVTETensor B = desc(db.ptr, {n, k}, kNVTEBFloat16);
    NVTETensor D = desc(d.ptr, {n, m}, kNVTEBFloat16);
    *status = nvte_gemm(&A, true, &B, false, &D, nullptr, nullptr, kNVTEGemmEpilogueNone, 1.f,
                        0.f, false, ws.buf.ptr, ws.buf.n, nullptr);
    *message = nvte_last_error_message();
    *synced = cuda_ok();
  };
  NVTEStatus st1 = kNVTEDeviceError, st2 = kNVTEDeviceError;
  bool ok1 = false, ok2 = false;
  std::thread([&] { product(d1, &st1, &ok1, &message1); }).join();
  std::thread([&] { product(d2, &st2, &ok2, &message2); }).join();
  TE_EXPECT(st1 == kNVTESuccess && ok1, "first thread: status %d, %s", int(st1), message1.c_str());
  TE_EXPECT(st2 == kNVTESuccess && ok2, "second thread: status %d, %s", int(st2), message2.c_str());
  const auto h1 = d1.download(), h2 = d2.download();
  TE_EXPECT(std::memcmp(h1.data(), h2.data(), h1.size() * sizeof(h1[0])) == 0,
            "the second thread's product differs from the first's");
}
