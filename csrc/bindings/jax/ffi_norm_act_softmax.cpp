// XLA FFI handlers of normalization, activations and the fused softmax. Outputs that are FP8
// take scale [1] and a zero amax [1] aliased to the amax result (see ffi_cast_gemm.cpp); for
// high-precision outputs those buffers are ignored. Workspaces are result buffers sized by the
// Python side from the core's own size query.
#include "ffi_tensor.h"
#include "transformer_engine/activation.h"
#include "transformer_engine/normalization.h"
#include "transformer_engine/softmax.h"

namespace te_jax {
namespace {

// x, gamma, beta (empty for RMSNorm), scale, amax_in -> z, mu (empty for RMSNorm), rsigma,
// scale_inv, amax.
ffi::Error norm_fwd_impl(void* stream, Buffer x, Buffer gamma, Buffer beta, Buffer scale,
                         Buffer amax_in, Out z, Out mu, Out rsigma, Out scale_inv, Out amax,
                         float epsilon, int64_t zero_centered_gamma, int64_t rms) {
  (void)amax_in;
  Describer describe(rms ? "te_rmsnorm_fwd" : "te_layernorm_fwd");
  NVTETensor xd = describe(x, "x"), gd = describe(gamma, "gamma");
  NVTETensor zd = describe(z, "z");
  if (is_fp8(zd.dtype)) {
    zd.scale = f32_ptr(scale);
    zd.amax = f32_ptr(amax);
    zd.scale_inv = f32_ptr(scale_inv);
  }
  NVTETensor rsd = describe(rsigma, "rsigma");
  if (rms) {
    if (!describe.problem.empty()) return describe_error(describe);
    return to_error(nvte_rmsnorm_fwd(&xd, &gd, epsilon, int(zero_centered_gamma), &zd, &rsd,
                                     stream));
  }
  NVTETensor bd = describe(beta, "beta"), mud = describe(mu, "mu");
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_layernorm_fwd(&xd, &gd, &bd, epsilon, int(zero_centered_gamma), &zd, &mud,
                                     &rsd, stream));
}

// dz, x, mu (empty for RMSNorm), rsigma, gamma -> dx, dgamma, dbeta (empty for RMSNorm), workspace.
ffi::Error norm_bwd_impl(void* stream, Buffer dz, Buffer x, Buffer mu, Buffer rsigma,
                         Buffer gamma, Out dx, Out dgamma, Out dbeta, Out workspace,
                         int64_t zero_centered_gamma, int64_t rms) {
  Describer describe(rms ? "te_rmsnorm_bwd" : "te_layernorm_bwd");
  NVTETensor dzd = describe(dz, "dz"), xd = describe(x, "x"), rsd = describe(rsigma, "rsigma"),
             gd = describe(gamma, "gamma"), dxd = describe(dx, "dx"),
             dgd = describe(dgamma, "dgamma"), wsd = describe(workspace, "workspace");
  if (rms) {
    if (!describe.problem.empty()) return describe_error(describe);
    return to_error(nvte_rmsnorm_bwd(&dzd, &xd, &rsd, &gd, int(zero_centered_gamma), &dxd, &dgd,
                                     &wsd, stream));
  }
  NVTETensor mud = describe(mu, "mu"), dbd = describe(dbeta, "dbeta");
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_layernorm_bwd(&dzd, &xd, &mud, &rsd, &gd, int(zero_centered_gamma), &dxd,
                                     &dgd, &dbd, &wsd, stream));
}

void set_fp8_meta(NVTETensor* t, Buffer& scale, Out& scale_inv, Out& amax) {
  if (!is_fp8(t->dtype)) return;
  t->scale = f32_ptr(scale);
  t->scale_inv = f32_ptr(scale_inv);
  t->amax = f32_ptr(amax);
}

// x, scale, amax_in -> y, scale_inv, amax.
ffi::Error activation_impl(void* stream, Buffer x, Buffer scale, Buffer amax_in, Out y,
                           Out scale_inv, Out amax, int64_t act, int64_t gated) {
  (void)amax_in;
  Describer describe("te_activation");
  NVTETensor xd = describe(x, "x"), yd = describe(y, "y");
  set_fp8_meta(&yd, scale, scale_inv, amax);
  if (!describe.problem.empty()) return describe_error(describe);
  const auto a = static_cast<NVTEActivation>(act);
  return to_error(gated ? nvte_gated_activation(a, &xd, &yd, stream)
                        : nvte_activation(a, &xd, &yd, stream));
}

// dy, x, scale, amax_in -> dx, scale_inv, amax.
ffi::Error dactivation_impl(void* stream, Buffer dy, Buffer x, Buffer scale, Buffer amax_in,
                            Out dx, Out scale_inv, Out amax, int64_t act, int64_t gated) {
  (void)amax_in;
  Describer describe("te_dactivation");
  NVTETensor dyd = describe(dy, "dy"), xd = describe(x, "x"), dxd = describe(dx, "dx");
  set_fp8_meta(&dxd, scale, scale_inv, amax);
  if (!describe.problem.empty()) return describe_error(describe);
  const auto a = static_cast<NVTEActivation>(act);
  return to_error(gated ? nvte_dgated_activation(a, &dyd, &xd, &dxd, stream)
                        : nvte_dactivation(a, &dyd, &xd, &dxd, stream));
}

// dy, x, scale, amax_in -> dx, dbias, scale_inv, amax, workspace.
ffi::Error dbias_dactivation_impl(void* stream, Buffer dy, Buffer x, Buffer scale,
                                  Buffer amax_in, Out dx, Out dbias, Out scale_inv, Out amax,
                                  Out workspace, int64_t act) {
  (void)amax_in;
  Describer describe("te_dbias_dactivation");
  NVTETensor dyd = describe(dy, "dy"), xd = describe(x, "x"), dxd = describe(dx, "dx"),
             dbd = describe(dbias, "dbias"), wsd = describe(workspace, "workspace");
  set_fp8_meta(&dxd, scale, scale_inv, amax);
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_dbias_dactivation(static_cast<NVTEActivation>(act), &dyd, &xd, &dxd, &dbd,
                                         &wsd, stream));
}

enum SoftmaxKind : int64_t { kScaled = 0, kMasked = 1, kCausal = 2 };

// x, mask (empty unless masked) -> y.
ffi::Error softmax_fwd_impl(void* stream, Buffer x, Buffer mask, Out y, int64_t kind,
                            float scale) {
  Describer describe("te_softmax_fwd");
  NVTETensor xd = describe(x, "x"), yd = describe(y, "y");
  if (kind == kMasked) {
    NVTETensor md = describe(mask, "mask");
    if (!describe.problem.empty()) return describe_error(describe);
    return to_error(nvte_scaled_masked_softmax_forward(&xd, &md, &yd, scale, stream));
  }
  if (!describe.problem.empty()) return describe_error(describe);
  if (kind == kCausal)
    return to_error(nvte_scaled_upper_triang_masked_softmax_forward(&xd, &yd, scale, stream));
  return to_error(nvte_scaled_softmax_forward(&xd, &yd, scale, stream));
}

// dy, y -> dx.
ffi::Error softmax_bwd_impl(void* stream, Buffer dy, Buffer y, Out dx, int64_t kind,
                            float scale) {
  Describer describe("te_softmax_bwd");
  NVTETensor dyd = describe(dy, "dy"), yd = describe(y, "y"), dxd = describe(dx, "dx");
  if (!describe.problem.empty()) return describe_error(describe);
  if (kind == kMasked)
    return to_error(nvte_scaled_masked_softmax_backward(&dyd, &yd, &dxd, scale, stream));
  if (kind == kCausal)
    return to_error(nvte_scaled_upper_triang_masked_softmax_backward(&dyd, &yd, &dxd, scale,
                                                                     stream));
  return to_error(nvte_scaled_softmax_backward(&dyd, &yd, &dxd, scale, stream));
}

}  // namespace
}  // namespace te_jax

using te_jax::Buffer;
using te_jax::Stream;
namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_fwd_ffi, te_jax::norm_fwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<float>("epsilon")
                                  .Attr<int64_t>("zero_centered_gamma")
                                  .Attr<int64_t>("rms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_bwd_ffi, te_jax::norm_bwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("zero_centered_gamma")
                                  .Attr<int64_t>("rms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_activation_ffi, te_jax::activation_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("act")
                                  .Attr<int64_t>("gated"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dactivation_ffi, te_jax::dactivation_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("act")
                                  .Attr<int64_t>("gated"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dbias_dactivation_ffi, te_jax::dbias_dactivation_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("act"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_softmax_fwd_ffi, te_jax::softmax_fwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("kind")
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_softmax_bwd_ffi, te_jax::softmax_bwd_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<int64_t>("kind")
                                  .Attr<float>("scale"));
