// nvte_attention_*: validation shared by every backend, then dispatch. Rules that do not depend
// on the backend live here so that both refuse malformed requests with the same message.
#include <string>

#include "attention/attention_backend.h"
#include "transformer_engine/attention.h"
#include "transformer_engine/device.h"
#include "util/error.h"
#include "util/tensor.h"

namespace te {
namespace attention {
namespace {

const char* format_name(NVTEQKVFormat f) {
  switch (f) {
    case kNVTEQKVFormatBSHD: return "bshd";
    case kNVTEQKVFormatSBHD: return "sbhd";
    case kNVTEQKVFormatTHD: return "thd";
    default: return "invalid";
  }
}

// Dense strides of a tensor with `heads` heads of `dim` and `seqlen` positions in the layout.
LayoutStrides dense_strides(const NVTEAttnParams& p, int64_t heads, int64_t dim, int64_t seqlen) {
  const int64_t token = heads * dim;  // elements of one token (all its heads)
  LayoutStrides s;
  switch (p.qkv_format) {
    case kNVTEQKVFormatBSHD: s.v[0] = seqlen * token; s.v[1] = token; s.v[2] = dim; break;
    case kNVTEQKVFormatSBHD: s.v[0] = p.batch * token; s.v[1] = token; s.v[2] = dim; break;
    default: s.v[0] = token; s.v[1] = dim; s.v[2] = 0; break;  // THD
  }
  return s;
}

// params' strides of one tensor, or its dense ones where they are all zero.
LayoutStrides resolve_strides(const NVTEAttnParams& p, const int64_t given[3], const char* what,
                              int64_t heads, int64_t dim, int64_t seqlen) {
  if (given[0] == 0 && given[1] == 0 && given[2] == 0) return dense_strides(p, heads, dim, seqlen);
  const bool thd = p.qkv_format == kNVTEQKVFormatTHD;
  const int used = thd ? 2 : 3;
  for (int i = 0; i < used; ++i)
    TE_CHECK_ARG(given[i] > 0 && given[i] % 8 == 0, "params.", what, " is (", given[0], ", ",
                 given[1], ", ", given[2], "); expected positive multiples of 8 elements (16-byte "
                 "aligned rows), or all zero for a dense tensor");
  TE_CHECK_ARG(!thd || given[2] == 0, "params.", what, "[2] is ", given[2],
               "; the thd layout has two strided dims (t, h): expected 0");
  LayoutStrides s;
  for (int i = 0; i < 3; ++i) s.v[i] = given[i];
  return s;
}

// Checks the parameters alone and derives the effective mask description.
AttnArgs args_from_params(const NVTEAttnParams* params) {
  TE_CHECK_ARG(params != nullptr, "params is a null pointer");
  const NVTEAttnParams& p = *params;
  TE_CHECK_ARG(p.batch >= 0 && p.num_heads_q > 0 && p.num_heads_kv > 0 && p.max_seqlen_q >= 0 &&
                   p.max_seqlen_kv >= 0 && p.head_dim_qk > 0 && p.head_dim_v > 0,
               "params has batch ", p.batch, ", heads ", p.num_heads_q, "/", p.num_heads_kv,
               ", seqlens ", p.max_seqlen_q, "/", p.max_seqlen_kv, ", head dims ", p.head_dim_qk,
               "/", p.head_dim_v, "; expected non-negative sizes and positive heads/dims");
  TE_CHECK_ARG(p.num_heads_q % p.num_heads_kv == 0, "num_heads_q (", p.num_heads_q,
               ") must be a multiple of num_heads_kv (", p.num_heads_kv, ")");
  TE_CHECK_ARG(p.dtype == kNVTEFloat16 || p.dtype == kNVTEBFloat16, "params.dtype is ",
               nvte_dtype_name(p.dtype), "; expected float16 or bfloat16");
  TE_CHECK_ARG(p.qkv_format >= kNVTEQKVFormatBSHD && p.qkv_format <= kNVTEQKVFormatTHD,
               "params.qkv_format is ", static_cast<int>(p.qkv_format), "; expected 0..2");
  TE_CHECK_ARG(p.mask_type >= kNVTEAttnMaskNone && p.mask_type <= kNVTEAttnMaskArbitrary,
               "params.mask_type is ", static_cast<int>(p.mask_type), "; expected 0..6");
  TE_CHECK_ARG(p.window_left >= -1 && p.window_right >= -1, "window (", p.window_left, ", ",
               p.window_right, ") must have sides >= -1 (-1 = unbounded)");
  TE_CHECK_ARG(p.softmax_scale == p.softmax_scale, "softmax_scale is NaN");
  TE_CHECK_ARG(p.head_dim_qk % 8 == 0 && p.head_dim_v % 8 == 0, "head dims ", p.head_dim_qk,
               "/", p.head_dim_v, " must be multiples of 8");
  if (p.mask_type == kNVTEAttnMaskArbitrary)
    TE_UNSUPPORTED("mask_type arbitrary (a mask tensor) is not supported by the fused kernels");
  AttnArgs a;
  a.p = p;
  a.bottom_right = mask_is_bottom_right(p.mask_type) || !mask_is_causal(p.mask_type);
  a.uses_lengths = p.qkv_format == kNVTEQKVFormatTHD || mask_is_padding(p.mask_type);
  a.window_left = p.window_left;
  a.window_right = mask_is_causal(p.mask_type) ? 0 : p.window_right;
  a.stride_q = resolve_strides(p, p.stride_q, "stride_q", p.num_heads_q, p.head_dim_qk,
                               p.max_seqlen_q);
  a.stride_k = resolve_strides(p, p.stride_k, "stride_k", p.num_heads_kv, p.head_dim_qk,
                               p.max_seqlen_kv);
  a.stride_v = resolve_strides(p, p.stride_v, "stride_v", p.num_heads_kv, p.head_dim_v,
                               p.max_seqlen_kv);
  a.stride_o = resolve_strides(p, p.stride_o, "stride_o", p.num_heads_q, p.head_dim_v,
                               p.max_seqlen_q);
  a.dense = a.stride_q == dense_strides(p, p.num_heads_q, p.head_dim_qk, p.max_seqlen_q) &&
            a.stride_k == dense_strides(p, p.num_heads_kv, p.head_dim_qk, p.max_seqlen_kv) &&
            a.stride_v == dense_strides(p, p.num_heads_kv, p.head_dim_v, p.max_seqlen_kv) &&
            a.stride_o == dense_strides(p, p.num_heads_q, p.head_dim_v, p.max_seqlen_q);
  return a;
}

// Expected shape of q/k/v-like tensors in the layout.
void check_layout(const NVTETensor* t, const char* what, const AttnArgs& a, int64_t heads,
                  int64_t dim, int64_t seqlen) {
  check_tensor(t, what);
  TE_CHECK_ARG(t->dtype == a.p.dtype, what, " has dtype ", nvte_dtype_name(t->dtype),
               "; expected ", nvte_dtype_name(a.p.dtype), " like params.dtype");
  TE_CHECK_ARG(aligned16(t->data) || numel(*t) == 0, what, " must be 16-byte aligned");
  const int64_t* s = t->shape;
  bool ok = false;
  switch (a.p.qkv_format) {
    case kNVTEQKVFormatBSHD:
      ok = t->ndim == 4 && s[0] == a.p.batch && s[1] == seqlen && s[2] == heads && s[3] == dim;
      break;
    case kNVTEQKVFormatSBHD:
      ok = t->ndim == 4 && s[0] == seqlen && s[1] == a.p.batch && s[2] == heads && s[3] == dim;
      break;
    default: ok = t->ndim == 3 && s[1] == heads && s[2] == dim; break;
  }
  TE_CHECK_ARG(ok, what, " has shape ", shape_str(*t), "; expected layout ",
               format_name(a.p.qkv_format), " with batch ", a.p.batch, ", seqlen ", seqlen,
               ", ", heads, " heads, head dim ", dim);
}

void check_lse(const NVTETensor* t, const AttnArgs& a) {
  check_tensor(t, "lse");
  TE_CHECK_ARG(t->dtype == kNVTEFloat32 && t->ndim == 3 && t->shape[0] == a.p.batch &&
                   t->shape[1] == a.p.num_heads_q && t->shape[2] == a.p.max_seqlen_q,
               "lse is ", nvte_dtype_name(t->dtype), " ", shape_str(*t), "; expected float32 [",
               a.p.batch, ", ", a.p.num_heads_q, ", ", a.p.max_seqlen_q, "]");
}

const int32_t* check_cu(const NVTETensor* t, const char* what, const AttnArgs& a) {
  if (!a.uses_lengths) return nullptr;
  TE_CHECK_ARG(t != nullptr && t->data != nullptr, what,
               " is required for the thd layout and padding masks");
  check_tensor(t, what);
  TE_CHECK_ARG(t->dtype == kNVTEInt32 && t->ndim == 1 && t->shape[0] == a.p.batch + 1, what,
               " is ", nvte_dtype_name(t->dtype), " ", shape_str(*t), "; expected int32 [",
               a.p.batch + 1, "]");
  return static_cast<const int32_t*>(t->data);
}

void check_backend_supports(NVTEAttnBackend backend, const AttnArgs& a, int device) {
  switch (backend) {
    case kNVTEAttnBackendPortable:
      if (!a.dense) TE_UNSUPPORTED("the portable kernels take dense q/k/v/out (params.stride_*)");
      portable_check(a.p);
      return;
    case kNVTEAttnBackendCudnn: vendor_check(a, device); return;
    default:
      TE_CHECK_ARG(false, "backend is ", static_cast<int>(backend), "; expected ",
                   static_cast<int>(kNVTEAttnBackendCudnn), " (cudnn) or ",
                   static_cast<int>(kNVTEAttnBackendPortable), " (portable)");
  }
}

int current_device_or_zero() {
  int device = 0;
  // the caller's current device is the one the tensors live on
  return nvte_current_device(&device) == kNVTESuccess ? device : 0;
}

AttnArgs forward_args(NVTEAttnBackend backend, const NVTEAttnParams* params, const NVTETensor* q,
                      const NVTETensor* k, const NVTETensor* v, const NVTETensor* out,
                      const NVTETensor* lse, const NVTETensor* cu_q, const NVTETensor* cu_kv) {
  AttnArgs a = args_from_params(params);
  const bool thd = a.p.qkv_format == kNVTEQKVFormatTHD;
  check_layout(q, "q", a, a.p.num_heads_q, a.p.head_dim_qk, a.p.max_seqlen_q);
  check_layout(k, "k", a, a.p.num_heads_kv, a.p.head_dim_qk, a.p.max_seqlen_kv);
  check_layout(v, "v", a, a.p.num_heads_kv, a.p.head_dim_v, a.p.max_seqlen_kv);
  TE_CHECK_ARG(!thd || k->shape[0] == v->shape[0], "k has ", k->shape[0], " tokens and v ",
               v->shape[0], "; expected the same");
  check_layout(out, "out", a, a.p.num_heads_q, a.p.head_dim_v, a.p.max_seqlen_q);
  TE_CHECK_ARG(!thd || out->shape[0] == q->shape[0], "out has ", out->shape[0],
               " tokens; expected ", q->shape[0], " like q");
  check_lse(lse, a);
  a.cu_q = check_cu(cu_q, "cu_seqlens_q", a);
  a.cu_kv = check_cu(cu_kv, "cu_seqlens_kv", a);
  a.q = q->data;
  a.k = k->data;
  a.v = v->data;
  a.o = out->data;
  a.lse = static_cast<float*>(lse->data);
  (void)backend;
  return a;
}

size_t workspace_size_of(NVTEAttnBackend backend, const AttnArgs& a, bool bwd, int device) {
  return backend == kNVTEAttnBackendPortable ? portable_workspace_size(a.p, bwd)
                                             : vendor_workspace_size(a, bwd, device);
}

void check_workspace(NVTEAttnBackend backend, const AttnArgs& a, bool bwd, void* ws,
                     size_t ws_size, int device) {
  const size_t need = workspace_size_of(backend, a, bwd, device);
  TE_CHECK_ARG(ws_size >= need && (need == 0 || ws != nullptr), "workspace has ", ws_size,
               " bytes; this call needs ", need, " (nvte_attention_workspace_size)");
}

}  // namespace
}  // namespace attention
}  // namespace te

using namespace te::attention;  // NOLINT

extern "C" const char* nvte_attention_backend_name(NVTEAttnBackend backend) {
  switch (backend) {
    case kNVTEAttnBackendCudnn: return "cudnn";
    case kNVTEAttnBackendPortable: return "portable";
    default: return "invalid";
  }
}

extern "C" NVTEStatus nvte_attention_support(NVTEAttnBackend backend,
                                             const NVTEAttnParams* params, int device) {
  return te::guard("nvte_attention_support", [&] {
    AttnArgs a = args_from_params(params);
    check_backend_supports(backend, a, device);
  });
}

extern "C" NVTEStatus nvte_attention_workspace_size(NVTEAttnBackend backend,
                                                    const NVTEAttnParams* params,
                                                    bool is_backward, int device,
                                                    size_t* bytes) {
  return te::guard("nvte_attention_workspace_size", [&] {
    TE_CHECK_ARG(bytes != nullptr, "bytes is a null pointer");
    AttnArgs a = args_from_params(params);
    check_backend_supports(backend, a, device);
    *bytes = workspace_size_of(backend, a, is_backward, device);
  });
}

extern "C" NVTEStatus nvte_attention_forward(NVTEAttnBackend backend,
                                             const NVTEAttnParams* params, const NVTETensor* q,
                                             const NVTETensor* k, const NVTETensor* v,
                                             NVTETensor* out, NVTETensor* lse,
                                             const NVTETensor* cu_seqlens_q,
                                             const NVTETensor* cu_seqlens_kv, void* workspace,
                                             size_t workspace_size, NVTEStream stream) {
  return te::guard("nvte_attention_forward", [&] {
    AttnArgs a = forward_args(backend, params, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv);
    const int device = current_device_or_zero();
    check_backend_supports(backend, a, device);
    check_workspace(backend, a, false, workspace, workspace_size, device);
    a.workspace = workspace;
    a.workspace_size = workspace_size;
    a.stream = stream;
    if (a.p.batch == 0 || a.p.max_seqlen_q == 0) return;
    if (backend == kNVTEAttnBackendPortable) portable_forward(a);
    else vendor_forward(a);
  });
}

extern "C" NVTEStatus nvte_attention_backward(
    NVTEAttnBackend backend, const NVTEAttnParams* params, const NVTETensor* q,
    const NVTETensor* k, const NVTETensor* v, const NVTETensor* out, const NVTETensor* d_out,
    const NVTETensor* lse, const NVTETensor* cu_seqlens_q, const NVTETensor* cu_seqlens_kv,
    NVTETensor* dq, NVTETensor* dk, NVTETensor* dv, void* workspace, size_t workspace_size,
    NVTEStream stream) {
  return te::guard("nvte_attention_backward", [&] {
    AttnArgs a = forward_args(backend, params, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv);
    check_layout(d_out, "d_out", a, a.p.num_heads_q, a.p.head_dim_v, a.p.max_seqlen_q);
    check_layout(dq, "dq", a, a.p.num_heads_q, a.p.head_dim_qk, a.p.max_seqlen_q);
    check_layout(dk, "dk", a, a.p.num_heads_kv, a.p.head_dim_qk, a.p.max_seqlen_kv);
    check_layout(dv, "dv", a, a.p.num_heads_kv, a.p.head_dim_v, a.p.max_seqlen_kv);
    if (a.p.qkv_format == kNVTEQKVFormatTHD) {
      TE_CHECK_ARG(d_out->shape[0] == q->shape[0] && dq->shape[0] == q->shape[0] &&
                       dk->shape[0] == k->shape[0] && dv->shape[0] == k->shape[0],
                   "d_out/dq/dk/dv must have the token counts of q/q/k/v");
    }
    const int device = current_device_or_zero();
    check_backend_supports(backend, a, device);
    check_workspace(backend, a, true, workspace, workspace_size, device);
    a.d_o = d_out->data;
    a.dq = dq->data;
    a.dk = dk->data;
    a.dv = dv->data;
    a.workspace = workspace;
    a.workspace_size = workspace_size;
    a.stream = stream;
    if (a.p.batch == 0 || a.p.max_seqlen_kv == 0) return;
    if (backend == kNVTEAttnBackendPortable) portable_backward(a);
    else vendor_backward(a);
  });
}
