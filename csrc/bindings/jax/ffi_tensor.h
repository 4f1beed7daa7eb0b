// Shared pieces of the XLA FFI handlers: FFI buffers as NVTETensor descriptors, NVTEStatus as an
// FFI error. Plain C++ over the C API and XLA's header-only FFI API: no CUDA/HIP headers, so the
// same file builds with nvcc's host compiler and with hipcc. The stream reaches the C API as the
// opaque NVTEStream it already is.
#pragma once

#include <string>

#include "transformer_engine/transformer_engine.h"
#include "xla/ffi/api/ffi.h"

namespace te_jax {

namespace ffi = xla::ffi;

using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;
// The runtime's stream (cudaStream_t / hipStream_t) as an untyped pointer.
using Stream = ffi::PlatformStream<void*>;

// FFI element type -> NVTEDType. FP8 OCP and FNUZ map to one format: the core picks the
// device's encoding. Booleans (masks) are bytes.
inline bool nvte_dtype_of(ffi::DataType t, NVTEDType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = kNVTEFloat32; return true;
    case ffi::DataType::F16: *out = kNVTEFloat16; return true;
    case ffi::DataType::BF16: *out = kNVTEBFloat16; return true;
    case ffi::DataType::F8E4M3FN:
    case ffi::DataType::F8E4M3FNUZ: *out = kNVTEFloat8E4M3; return true;
    case ffi::DataType::F8E5M2:
    case ffi::DataType::F8E5M2FNUZ: *out = kNVTEFloat8E5M2; return true;
    case ffi::DataType::S32: *out = kNVTEInt32; return true;
    case ffi::DataType::S64: *out = kNVTEInt64; return true;
    case ffi::DataType::PRED:
    case ffi::DataType::U8:
    case ffi::DataType::S8: *out = kNVTEByte; return true;
    default: return false;
  }
}

inline bool is_fp8(NVTEDType t) { return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2; }

// Collects the first problem met while describing buffers, so a handler reports it as an error
// instead of passing a bad descriptor to the core.
struct Describer {
  std::string op;
  std::string problem;

  explicit Describer(const char* name) : op(name) {}

  NVTETensor operator()(const Buffer& b, const char* what, float* amax = nullptr,
                        float* scale = nullptr, float* scale_inv = nullptr) {
    NVTETensor d{};
    d.data = b.untyped_data();
    const auto dims = b.dimensions();
    if (dims.size() > NVTE_MAX_DIMS && problem.empty())
      problem = op + ": " + what + " has " + std::to_string(dims.size()) + " dims; at most " +
                std::to_string(NVTE_MAX_DIMS) + " are supported";
    d.ndim = static_cast<int32_t>(dims.size() > NVTE_MAX_DIMS ? NVTE_MAX_DIMS : dims.size());
    for (int i = 0; i < d.ndim; ++i) d.shape[i] = dims[i];
    if (!nvte_dtype_of(b.element_type(), &d.dtype) && problem.empty())
      problem = op + ": " + what + " has an element type the native core does not take";
    d.amax = amax;
    d.scale = scale;
    d.scale_inv = scale_inv;
    return d;
  }

  NVTETensor operator()(Out& b, const char* what, float* amax = nullptr, float* scale = nullptr,
                        float* scale_inv = nullptr) {
    return (*this)(*b, what, amax, scale, scale_inv);
  }
};

inline float* f32_ptr(const Buffer& b) {
  return b.element_count() ? static_cast<float*>(b.untyped_data()) : nullptr;
}
inline float* f32_ptr(Out& b) { return f32_ptr(*b); }

// Optional tensors are passed as empty buffers; those become NULL descriptors.
inline bool present(const Buffer& b) { return b.element_count() != 0; }

inline ffi::Error to_error(NVTEStatus status) {
  switch (status) {
    case kNVTESuccess: return ffi::Error::Success();
    case kNVTEInvalidArgument:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, nvte_last_error_message());
    case kNVTEUnsupported:
      return ffi::Error(ffi::ErrorCode::kUnimplemented, nvte_last_error_message());
    default: return ffi::Error(ffi::ErrorCode::kInternal, nvte_last_error_message());
  }
}

inline ffi::Error describe_error(const Describer& d) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, d.problem);
}

}  // namespace te_jax

// Handlers defined in the ffi_*.cpp files, exported as capsules by module_jax.cpp.
#define TE_JAX_HANDLERS(X)                                                                     \
  X(te_quantize_ffi) X(te_cast_transpose_ffi) X(te_norm_fwd_ffi) X(te_norm_bwd_ffi)            \
  X(te_activation_ffi) X(te_dactivation_ffi) X(te_dbias_dactivation_ffi) X(te_softmax_fwd_ffi) \
  X(te_softmax_bwd_ffi) X(te_gemm_ffi) X(te_delayed_scaling_update_ffi) X(te_attention_fwd_ffi) \
  X(te_attention_bwd_ffi)

#define TE_JAX_DECLARE_(name) extern "C" XLA_FFI_Error* name(XLA_FFI_CallFrame* call_frame);
TE_JAX_HANDLERS(TE_JAX_DECLARE_)
#undef TE_JAX_DECLARE_
