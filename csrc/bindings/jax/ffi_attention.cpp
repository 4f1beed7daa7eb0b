// XLA FFI handlers of fused attention (transformer_engine/attention.h): forward and backward of
// one backend (cuDNN or the portable kernel), the same C entry points the PyTorch frontend calls.
// The parameters travel as one int64 array attribute in the order of
// transformer_engine/jax/primitives/attention.py (_params) plus the float softmax scale; the
// dtype is q's. Empty cu_seqlens buffers mean "none" (no padding, not THD). The workspace is a
// result buffer sized by the Python side from the core's own size query. Rows of padded layouts
// that the kernels leave unwritten are zeroed by the Python side, which knows the lengths.
#include "ffi_tensor.h"
#include "transformer_engine/attention.h"

namespace te_jax {
namespace {

// Order of the "params" attribute (attention.py's _PARAM_ORDER mirrors it).
enum ParamIndex {
  kBackend = 0,
  kBatch,
  kHeadsQ,
  kHeadsKV,
  kSeqlenQ,
  kSeqlenKV,
  kHeadDimQK,
  kHeadDimV,
  kFormat,
  kMask,
  kWindowLeft,
  kWindowRight,
  kDeterministic,
  kParamCount
};

// params -> (backend, NVTEAttnParams); false with `problem` set when the array is malformed.
bool unpack_params(ffi::Span<const int64_t> a, float scale, NVTEDType dtype,
                   NVTEAttnBackend* backend, NVTEAttnParams* p, std::string* problem) {
  if (a.size() != kParamCount) {
    *problem = "te_attention: params has " + std::to_string(a.size()) + " entries; expected " +
               std::to_string(int(kParamCount));
    return false;
  }
  *backend = static_cast<NVTEAttnBackend>(a[kBackend]);
  *p = NVTEAttnParams{};  // zero strides: every tensor dense in its layout
  p->batch = a[kBatch];
  p->num_heads_q = a[kHeadsQ];
  p->num_heads_kv = a[kHeadsKV];
  p->max_seqlen_q = a[kSeqlenQ];
  p->max_seqlen_kv = a[kSeqlenKV];
  p->head_dim_qk = a[kHeadDimQK];
  p->head_dim_v = a[kHeadDimV];
  p->dtype = dtype;
  p->qkv_format = static_cast<NVTEQKVFormat>(a[kFormat]);
  p->mask_type = static_cast<NVTEAttnMaskType>(a[kMask]);
  p->window_left = a[kWindowLeft];
  p->window_right = a[kWindowRight];
  p->softmax_scale = scale;
  p->deterministic = a[kDeterministic] != 0;
  return true;
}

struct OptDesc {
  NVTETensor t{};
  bool present = false;
  const NVTETensor* get() const { return present ? &t : nullptr; }
};

OptDesc optional(Describer& describe, const Buffer& b, const char* what) {
  OptDesc d;
  if (present(b)) {
    d.t = describe(b, what);
    d.present = true;
  }
  return d;
}

// q, k, v, cu_seqlens_q, cu_seqlens_kv -> out, lse, workspace.
ffi::Error attention_fwd_impl(void* stream, Buffer q, Buffer k, Buffer v, Buffer cu_q,
                              Buffer cu_kv, Out out, Out lse, Out workspace,
                              ffi::Span<const int64_t> params, float softmax_scale) {
  Describer describe("te_attention_fwd");
  NVTETensor qd = describe(q, "q"), kd = describe(k, "k"), vd = describe(v, "v");
  NVTETensor od = describe(out, "out"), ld = describe(lse, "lse");
  OptDesc cq = optional(describe, cu_q, "cu_seqlens_q"), ck = optional(describe, cu_kv, "cu_seqlens_kv");
  if (!describe.problem.empty()) return describe_error(describe);
  NVTEAttnBackend backend;
  NVTEAttnParams p;
  if (!unpack_params(params, softmax_scale, qd.dtype, &backend, &p, &describe.problem))
    return describe_error(describe);
  return to_error(nvte_attention_forward(backend, &p, &qd, &kd, &vd, &od, &ld, cq.get(), ck.get(),
                                         workspace->untyped_data(), workspace->size_bytes(),
                                         stream));
}

// q, k, v, out, d_out, lse, cu_seqlens_q, cu_seqlens_kv -> dq, dk, dv, workspace.
ffi::Error attention_bwd_impl(void* stream, Buffer q, Buffer k, Buffer v, Buffer out,
                              Buffer d_out, Buffer lse, Buffer cu_q, Buffer cu_kv, Out dq, Out dk,
                              Out dv, Out workspace, ffi::Span<const int64_t> params,
                              float softmax_scale) {
  Describer describe("te_attention_bwd");
  NVTETensor qd = describe(q, "q"), kd = describe(k, "k"), vd = describe(v, "v");
  NVTETensor od = describe(out, "out"), dod = describe(d_out, "d_out"), ld = describe(lse, "lse");
  NVTETensor dqd = describe(dq, "dq"), dkd = describe(dk, "dk"), dvd = describe(dv, "dv");
  OptDesc cq = optional(describe, cu_q, "cu_seqlens_q"), ck = optional(describe, cu_kv, "cu_seqlens_kv");
  if (!describe.problem.empty()) return describe_error(describe);
  NVTEAttnBackend backend;
  NVTEAttnParams p;
  if (!unpack_params(params, softmax_scale, qd.dtype, &backend, &p, &describe.problem))
    return describe_error(describe);
  return to_error(nvte_attention_backward(backend, &p, &qd, &kd, &vd, &od, &dod, &ld, cq.get(),
                                          ck.get(), &dqd, &dkd, &dvd, workspace->untyped_data(),
                                          workspace->size_bytes(), stream));
}

}  // namespace
}  // namespace te_jax

namespace ffi = xla::ffi;
using te_jax::Buffer;

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_attention_fwd_ffi, te_jax::attention_fwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<te_jax::Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<ffi::Span<const int64_t>>("params")
                                  .Attr<float>("softmax_scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_attention_bwd_ffi, te_jax::attention_bwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<te_jax::Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<ffi::Span<const int64_t>>("params")
                                  .Attr<float>("softmax_scale"));
