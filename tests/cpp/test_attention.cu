// C API tests of the attention family: the portable backend's forward and backward against CPU
// loops in double precision (GQA, causal bottom-right, odd lengths), cuDNN when built (else its
// refusal carries a reason), and argument errors returned as values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "test_common.h"
#include "transformer_engine/attention.h"

using namespace te_test;

namespace {

struct Dims {
  int64_t b = 2, hq = 4, hkv = 2, sq = 37, skv = 53, d = 64;
};

NVTEAttnParams params_of(const Dims& s, NVTEAttnMaskType mask) {
  NVTEAttnParams p{};
  p.batch = s.b;
  p.num_heads_q = s.hq;
  p.num_heads_kv = s.hkv;
  p.max_seqlen_q = s.sq;
  p.max_seqlen_kv = s.skv;
  p.head_dim_qk = s.d;
  p.head_dim_v = s.d;
  p.dtype = kNVTEFloat16;
  p.qkv_format = kNVTEQKVFormatBSHD;
  p.mask_type = mask;
  p.window_left = -1;
  p.window_right = -1;
  p.softmax_scale = 1.f / std::sqrt(float(s.d));
  p.deterministic = true;
  return p;
}

// bshd index
int64_t at(const Dims& s, int64_t b, int64_t pos, int64_t h, int64_t heads, int64_t seqlen,
           int64_t d) {
  return ((b * seqlen + pos) * heads + h) * s.d + d;
}

// Forward out / lse and the backward gradients on the CPU, causal bottom-right (or no mask).
void cpu_attention(const Dims& s, bool causal, float scale, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<float>& d_o, std::vector<double>* out,
                   std::vector<double>* lse, std::vector<double>* dq, std::vector<double>* dk,
                   std::vector<double>* dv) {
  out->assign(q.size(), 0.0);
  dq->assign(q.size(), 0.0);
  dk->assign(k.size(), 0.0);
  dv->assign(v.size(), 0.0);
  lse->assign(size_t(s.b * s.hq * s.sq), 0.0);
  const int64_t group = s.hq / s.hkv, off = s.skv - s.sq;
  std::vector<double> p(s.skv), dp(s.skv);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < s.sq; ++i) {
        const int64_t hk = h / group;
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.d; ++d)
            dot += double(q[at(s, b, i, h, s.hq, s.sq, d)]) * k[at(s, b, j, hk, s.hkv, s.skv, d)];
          p[j] = (causal && j > i + off) ? -INFINITY : dot * scale;
          mx = std::fmax(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < s.skv; ++j) sum += std::isinf(p[j]) ? 0.0 : std::exp(p[j] - mx);
        for (int64_t j = 0; j < s.skv; ++j) p[j] = std::isinf(p[j]) ? 0.0 : std::exp(p[j] - mx) / sum;
        (*lse)[(b * s.hq + h) * s.sq + i] = mx + std::log(sum);
        double delta = 0;
        for (int64_t d = 0; d < s.d; ++d) {
          double o = 0;
          for (int64_t j = 0; j < s.skv; ++j) o += p[j] * v[at(s, b, j, hk, s.hkv, s.skv, d)];
          (*out)[at(s, b, i, h, s.hq, s.sq, d)] = o;
          delta += o * d_o[at(s, b, i, h, s.hq, s.sq, d)];
        }
        for (int64_t j = 0; j < s.skv; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < s.d; ++d)
            acc += double(d_o[at(s, b, i, h, s.hq, s.sq, d)]) * v[at(s, b, j, hk, s.hkv, s.skv, d)];
          dp[j] = p[j] * (acc - delta);
        }
        for (int64_t j = 0; j < s.skv; ++j)
          for (int64_t d = 0; d < s.d; ++d) {
            (*dv)[at(s, b, j, hk, s.hkv, s.skv, d)] += p[j] * d_o[at(s, b, i, h, s.hq, s.sq, d)];
            (*dk)[at(s, b, j, hk, s.hkv, s.skv, d)] +=
                scale * dp[j] * q[at(s, b, i, h, s.hq, s.sq, d)];
            (*dq)[at(s, b, i, h, s.hq, s.sq, d)] +=
                scale * dp[j] * k[at(s, b, j, hk, s.hkv, s.skv, d)];
          }
      }
}

std::vector<__half> to_half(std::vector<float>* x) {
  std::vector<__half> h(x->size());
  for (size_t i = 0; i < x->size(); ++i) {
    h[i] = __float2half_rn((*x)[i]);
    (*x)[i] = __half2float(h[i]);
  }
  return h;
}

// max |got - want| / max |want| over a buffer
double rel_err(const std::vector<__half>& got, const std::vector<double>& want) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::fmax(err, std::fabs(double(__half2float(got[i])) - want[i]));
    scale = std::fmax(scale, std::fabs(want[i]));
  }
  return err / scale;
}

void run_backend(NVTEAttnBackend backend, bool causal, const Dims& s = Dims(),
                 bool deterministic = true) {
  NVTEAttnParams p = params_of(s, causal ? kNVTEAttnMaskCausalBottomRight : kNVTEAttnMaskNone);
  p.deterministic = deterministic;
  NVTEStatus st = nvte_attention_support(backend, &p, 0);
  if (st != kNVTESuccess) {
    // the cuDNN backend may be absent from this build; a refusal must say why
    TE_EXPECT(backend == kNVTEAttnBackendCudnn && st == kNVTEUnsupported &&
                  std::strlen(nvte_last_error_message()) > 0,
              "%s refused: %s", nvte_attention_backend_name(backend), nvte_last_error_message());
    return;
  }
  const size_t nq = size_t(s.b * s.sq * s.hq * s.d), nk = size_t(s.b * s.skv * s.hkv * s.d);
  std::vector<float> q = random_floats(nq, 1), k = random_floats(nk, 2), v = random_floats(nk, 3),
                     d_o = random_floats(nq, 4);
  auto qh = to_half(&q), kh = to_half(&k), vh = to_half(&v), doh = to_half(&d_o);
  std::vector<double> out, lse, dq, dk, dv;
  cpu_attention(s, causal, p.softmax_scale, q, k, v, d_o, &out, &lse, &dq, &dk, &dv);

  DeviceBuffer<__half> dq_in(qh), dk_in(kh), dv_in(vh), ddo(doh), dout(nq), ddq(nq), ddk(nk),
      ddv(nk);
  DeviceBuffer<float> dlse(size_t(s.b * s.hq * s.sq));
  // Outputs and workspace start as finite garbage (0x55 bytes: 85.3 in fp16, 1.5e13 in fp32),
  // not as memory nothing wrote: an output element a backend forgets fails the comparisons
  // below, and compute-sanitizer's initcheck finds no read of unwritten memory (left unwritten,
  // it reported reads inside cuDNN's backward, in its dO . O row-sum kernel
  // compute_dot_do_o_specialized, of bytes the test had not written; filled, none).
  for (DeviceBuffer<__half>* out : {&dout, &ddq, &ddk, &ddv}) out->fill_bytes(0x55);
  dlse.fill_bytes(0x55);
  NVTETensor tq = desc(dq_in.ptr, {s.b, s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor tk = desc(dk_in.ptr, {s.b, s.skv, s.hkv, s.d}, kNVTEFloat16);
  NVTETensor tv = desc(dv_in.ptr, {s.b, s.skv, s.hkv, s.d}, kNVTEFloat16);
  NVTETensor to = desc(dout.ptr, {s.b, s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor tdo = desc(ddo.ptr, {s.b, s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor tl = desc(dlse.ptr, {s.b, s.hq, s.sq}, kNVTEFloat32);
  NVTETensor tdq = desc(ddq.ptr, {s.b, s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor tdk = desc(ddk.ptr, {s.b, s.skv, s.hkv, s.d}, kNVTEFloat16);
  NVTETensor tdv = desc(ddv.ptr, {s.b, s.skv, s.hkv, s.d}, kNVTEFloat16);
  size_t ws_fwd = 0, ws_bwd = 0;
  TE_EXPECT(nvte_attention_workspace_size(backend, &p, false, 0, &ws_fwd) == kNVTESuccess, "%s",
            nvte_last_error_message());
  TE_EXPECT(nvte_attention_workspace_size(backend, &p, true, 0, &ws_bwd) == kNVTESuccess, "%s",
            nvte_last_error_message());
  DeviceBuffer<uint8_t> ws(std::max(ws_fwd, ws_bwd) + 1);
  ws.fill_bytes(0x55);
  st = nvte_attention_forward(backend, &p, &tq, &tk, &tv, &to, &tl, nullptr, nullptr, ws.ptr,
                              ws.n, nullptr);
  TE_EXPECT(st == kNVTESuccess, "forward: %s", nvte_last_error_message());
  st = nvte_attention_backward(backend, &p, &tq, &tk, &tv, &to, &tdo, &tl, nullptr, nullptr, &tdq,
                               &tdk, &tdv, ws.ptr, ws.n, nullptr);
  TE_EXPECT(st == kNVTESuccess, "backward: %s", nvte_last_error_message());
  TE_EXPECT(cuda_ok(), "device error");
  const char* name = nvte_attention_backend_name(backend);
  TE_EXPECT(rel_err(dout.download(), out) < 4e-3, "%s out rel err %g", name,
            rel_err(dout.download(), out));
  const std::vector<float> lse_got = dlse.download();
  double lse_err = 0;
  for (size_t i = 0; i < lse.size(); ++i) lse_err = std::fmax(lse_err, std::fabs(lse_got[i] - lse[i]));
  TE_EXPECT(lse_err < 2e-3, "%s lse err %g", name, lse_err);
  TE_EXPECT(rel_err(ddq.download(), dq) < 1e-2, "%s dq rel err %g", name,
            rel_err(ddq.download(), dq));
  TE_EXPECT(rel_err(ddk.download(), dk) < 1e-2, "%s dk rel err %g", name,
            rel_err(ddk.download(), dk));
  TE_EXPECT(rel_err(ddv.download(), dv) < 1e-2, "%s dv rel err %g", name,
            rel_err(ddv.download(), dv));
}

}  // namespace

TE_TEST(attention_portable_matches_cpu) {
  for (NVTEAttnPortableVariant variant : {kNVTEAttnPortableAuto, kNVTEAttnPortableFmaOnly}) {
    TE_EXPECT(nvte_attention_set_portable_variant(variant) == kNVTESuccess, "%s",
              nvte_last_error_message());
    run_backend(kNVTEAttnBackendPortable, false);
    run_backend(kNVTEAttnBackendPortable, true);
  }
  nvte_attention_set_portable_variant(kNVTEAttnPortableAuto);
  TE_EXPECT(nvte_attention_set_portable_variant(static_cast<NVTEAttnPortableVariant>(5)) ==
                kNVTEInvalidArgument,
            "bad variant");
}

// The single-pass backward of non-deterministic calls at head dim 128 over several key blocks
// (128 keys) and query tiles (64): the warpgroup-MMA kernel on an H100 (portable_bwd_wgmma.cu),
// the mma.sync one on other NVIDIA GPUs.
TE_TEST(attention_portable_single_pass_d128_matches_cpu) {
  Dims s;
  s.sq = 150;
  s.skv = 203;
  s.d = 128;
  TE_EXPECT(nvte_attention_set_portable_variant(kNVTEAttnPortableAuto) == kNVTESuccess, "%s",
            nvte_last_error_message());
  run_backend(kNVTEAttnBackendPortable, false, s, false);
  run_backend(kNVTEAttnBackendPortable, true, s, false);
}

TE_TEST(attention_cudnn_matches_cpu_or_says_why) {
  run_backend(kNVTEAttnBackendCudnn, false);
  run_backend(kNVTEAttnBackendCudnn, true);
}

TE_TEST(attention_errors_are_values) {
  Dims s;
  NVTEAttnParams p = params_of(s, kNVTEAttnMaskCausal);
  p.num_heads_kv = 3;  // 4 % 3 != 0
  TE_EXPECT(nvte_attention_support(kNVTEAttnBackendPortable, &p, 0) == kNVTEInvalidArgument,
            "GQA ratio");
  TE_EXPECT(std::string(nvte_last_error_message()).find("num_heads_q") != std::string::npos,
            "message names the argument: %s", nvte_last_error_message());
  p = params_of(s, kNVTEAttnMaskArbitrary);
  TE_EXPECT(nvte_attention_support(kNVTEAttnBackendPortable, &p, 0) == kNVTEUnsupported,
            "arbitrary mask");
  p = params_of(s, kNVTEAttnMaskNone);
  p.head_dim_qk = p.head_dim_v = 96;
  TE_EXPECT(nvte_attention_support(kNVTEAttnBackendPortable, &p, 0) == kNVTEUnsupported,
            "head dim 96");
  p = params_of(s, kNVTEAttnMaskNone);
  TE_EXPECT(nvte_attention_support(static_cast<NVTEAttnBackend>(7), &p, 0) == kNVTEInvalidArgument,
            "unknown backend");
  // thd without cu_seqlens, and a wrong output shape
  p.qkv_format = kNVTEQKVFormatTHD;
  DeviceBuffer<__half> buf(size_t(s.b * s.skv * s.hq * s.d));
  DeviceBuffer<float> l(size_t(s.b * s.hq * s.sq));
  NVTETensor tq = desc(buf.ptr, {s.b * s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor tk = desc(buf.ptr, {s.b * s.skv, s.hkv, s.d}, kNVTEFloat16);
  NVTETensor tl = desc(l.ptr, {s.b, s.hq, s.sq}, kNVTEFloat32);
  TE_EXPECT(nvte_attention_forward(kNVTEAttnBackendPortable, &p, &tq, &tk, &tk, &tq, &tl, nullptr,
                                   nullptr, nullptr, 0, nullptr) == kNVTEInvalidArgument,
            "thd without cu_seqlens");
  TE_EXPECT(std::string(nvte_last_error_message()).find("cu_seqlens_q") != std::string::npos,
            "message: %s", nvte_last_error_message());
  p.qkv_format = kNVTEQKVFormatBSHD;
  NVTETensor bad = desc(buf.ptr, {s.b, s.sq, s.hq, s.d + 8}, kNVTEFloat16);
  NVTETensor bq = desc(buf.ptr, {s.b, s.sq, s.hq, s.d}, kNVTEFloat16);
  NVTETensor bk = desc(buf.ptr, {s.b, s.skv, s.hkv, s.d}, kNVTEFloat16);
  TE_EXPECT(nvte_attention_forward(kNVTEAttnBackendPortable, &p, &bq, &bk, &bk, &bad, &tl, nullptr,
                                   nullptr, nullptr, 0, nullptr) == kNVTEInvalidArgument,
            "bad out shape");
  TE_EXPECT(std::string(nvte_last_error_message()).find("out") != std::string::npos, "message: %s",
            nvte_last_error_message());
}
