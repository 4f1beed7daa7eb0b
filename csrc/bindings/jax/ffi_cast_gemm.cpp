// XLA FFI handlers of the FP8 casts, the GEMM and the delayed-scaling update.
//
// amax outputs: the core accumulates max(amax, ...) into them, and XLA hands out uninitialised
// result buffers, so the Python side passes a zero amax as an input aliased to the amax result
// (input_output_aliases). FP8 scale inputs are [1] float32.
#include "ffi_tensor.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/gemm.h"
#include "transformer_engine/recipe.h"
#include "transformer_engine/transpose.h"

namespace te_jax {
namespace {

// x, scale, amax_in -> data, scale_inv, amax (amax aliases amax_in).
ffi::Error quantize_impl(void* stream, Buffer x, Buffer scale, Buffer amax_in, Out data,
                         Out scale_inv, Out amax) {
  (void)amax_in;
  Describer describe("te_quantize");
  NVTETensor in = describe(x, "x");
  NVTETensor out = describe(data, "data", f32_ptr(amax), f32_ptr(scale), f32_ptr(scale_inv));
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_quantize(&in, &out, stream));
}

ffi::Error cast_transpose_impl(void* stream, Buffer x, Buffer scale, Buffer amax_in, Out data,
                               Out data_t, Out scale_inv, Out amax) {
  (void)amax_in;
  Describer describe("te_cast_transpose");
  NVTETensor in = describe(x, "x");
  NVTETensor out = describe(data, "data", f32_ptr(amax), f32_ptr(scale), f32_ptr(scale_inv));
  NVTETensor out_t = describe(data_t, "data_t");
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_cast_transpose(&in, &out, &out_t, stream));
}

// A, B, a_scale_inv, b_scale_inv, bias, aux_in, d_scale, d_amax_in ->
// D, bias_grad, aux_out, d_scale_inv, d_amax, workspace. Unused optional buffers are empty.
ffi::Error gemm_impl(void* stream, Buffer a, Buffer b, Buffer a_scale_inv, Buffer b_scale_inv,
                     Buffer bias, Buffer aux_in, Buffer d_scale, Buffer d_amax_in, Out d,
                     Out bias_grad, Out aux_out, Out d_scale_inv, Out d_amax, Out workspace,
                     int64_t transa, int64_t transb, int64_t epilogue, float alpha,
                     int64_t use_fast_accum) {
  (void)d_amax_in;
  Describer describe("te_gemm");
  NVTETensor ad = describe(a, "A", nullptr, nullptr, f32_ptr(a_scale_inv));
  NVTETensor bd = describe(b, "B", nullptr, nullptr, f32_ptr(b_scale_inv));
  NVTETensor dd = describe(d, "D", f32_ptr(d_amax), f32_ptr(d_scale), f32_ptr(d_scale_inv));
  NVTETensor bias_d{}, aux_d{};
  NVTETensor* bias_p = nullptr;
  NVTETensor* aux_p = nullptr;
  const auto epi = static_cast<NVTEGemmEpilogue>(epilogue);
  if (epi == kNVTEGemmEpilogueBias || epi == kNVTEGemmEpilogueBiasGeluAux) {
    bias_d = describe(bias, "bias");
    bias_p = &bias_d;
  } else if (epi == kNVTEGemmEpilogueDGeluBGrad) {
    bias_d = describe(bias_grad, "bias_grad");
    bias_p = &bias_d;
  }
  if (epi == kNVTEGemmEpilogueGeluAux || epi == kNVTEGemmEpilogueBiasGeluAux) {
    aux_d = describe(aux_out, "gelu_input");
    aux_p = &aux_d;
  } else if (epi == kNVTEGemmEpilogueDGelu || epi == kNVTEGemmEpilogueDGeluBGrad) {
    aux_d = describe(aux_in, "gelu_input");
    aux_p = &aux_d;
  }
  if (!describe.problem.empty()) return describe_error(describe);
  return to_error(nvte_gemm(&ad, transa != 0, &bd, transb != 0, &dd, bias_p, aux_p, epi, alpha,
                            0.0f, use_fast_accum != 0, workspace->untyped_data(),
                            workspace->size_bytes(), stream));
}

// history [L, n], scale [n] -> history, scale (both aliased, updated in place), scale_inv [n].
ffi::Error delayed_scaling_update_impl(void* stream, Buffer history_in, Buffer scale_in,
                                       Out history, Out scale, Out scale_inv, float fp8_max,
                                       int64_t algo, float margin) {
  (void)history_in;
  (void)scale_in;
  const auto dims = history->dimensions();
  if (dims.size() != 2 || history->element_type() != ffi::DataType::F32 ||
      scale->element_type() != ffi::DataType::F32 || scale->element_count() != size_t(dims[1]))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "te_delayed_scaling_update: expected float32 history [L, n] and scale [n]");
  NVTEScalingGroup group{};
  group.amax_history = f32_ptr(history);
  group.scale = f32_ptr(scale);
  group.scale_inv = f32_ptr(scale_inv);
  group.history_len = dims[0];
  group.num_tensors = dims[1];
  group.fp8_max = fp8_max;
  return to_error(nvte_delayed_scaling_update(&group, 1, static_cast<NVTEAmaxAlgo>(algo), margin,
                                              stream));
}

}  // namespace
}  // namespace te_jax

using te_jax::Buffer;
using te_jax::Out;
using te_jax::Stream;
namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_quantize_ffi, te_jax::quantize_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_cast_transpose_ffi, te_jax::cast_transpose_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_gemm_ffi, te_jax::gemm_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()  // A
                                  .Arg<Buffer>()  // B
                                  .Arg<Buffer>()  // A scale_inv
                                  .Arg<Buffer>()  // B scale_inv
                                  .Arg<Buffer>()  // bias
                                  .Arg<Buffer>()  // gelu input (dgelu epilogues)
                                  .Arg<Buffer>()  // D scale
                                  .Arg<Buffer>()  // D amax (zeros, aliased)
                                  .Ret<Buffer>()  // D
                                  .Ret<Buffer>()  // bias grad
                                  .Ret<Buffer>()  // gelu input (gelu epilogues)
                                  .Ret<Buffer>()  // D scale_inv
                                  .Ret<Buffer>()  // D amax
                                  .Ret<Buffer>()  // workspace
                                  .Attr<int64_t>("transa")
                                  .Attr<int64_t>("transb")
                                  .Attr<int64_t>("epilogue")
                                  .Attr<float>("alpha")
                                  .Attr<int64_t>("use_fast_accum"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_delayed_scaling_update_ffi, te_jax::delayed_scaling_update_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<Buffer>()
                                  .Arg<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Ret<Buffer>()
                                  .Attr<float>("fp8_max")
                                  .Attr<int64_t>("algo")
                                  .Attr<float>("margin"));
