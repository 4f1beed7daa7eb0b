// FP8 conversions of the HIP-on-CPU runtime, both flavours, from the format definitions in
// hipcpu_float_formats.h. Names and argument order follow HIP's hip_fp8.h.
#pragma once
#include "hip_fp16.h"
#include "hipcpu_float_formats.h"

typedef unsigned char __hip_fp8_storage_t;
enum __hip_saturation_t { __HIP_NOSAT = 0, __HIP_SATFINITE = 1 };
enum __hip_fp8_interpretation_t {
  __HIP_E4M3_FNUZ = 0,
  __HIP_E5M2_FNUZ = 1,
  __HIP_E4M3 = 2,
  __HIP_E5M2 = 3,
};

namespace hipcpu {
inline const SmallFloat& fp8_format(__hip_fp8_interpretation_t t) {
  switch (t) {
    case __HIP_E4M3_FNUZ: return kFnuzE4M3;
    case __HIP_E5M2_FNUZ: return kFnuzE5M2;
    case __HIP_E4M3: return kOcpE4M3;
    default: return kOcpE5M2;
  }
}
}  // namespace hipcpu

inline __hip_fp8_storage_t __hip_cvt_float_to_fp8(float x, __hip_saturation_t sat,
                                                  __hip_fp8_interpretation_t t) {
  return static_cast<__hip_fp8_storage_t>(
      hipcpu::encode(hipcpu::fp8_format(t), x, sat == __HIP_SATFINITE));
}

inline __half_raw __hip_cvt_fp8_to_halfraw(__hip_fp8_storage_t x, __hip_fp8_interpretation_t t) {
  // Every FP8 value is exact in binary16.
  return __half_raw{hipcpu::float_to_binary16(float(hipcpu::decode(hipcpu::fp8_format(t), x)))};
}

#if defined(HIPCPU_GFX950)
// gfx950's FP8 conversion instructions as the compiler's builtins expose them (OCP encodings;
// v_cvt_pk_fp8_f32 / v_cvt_pk_bf8_f32 pack two results into the low or high 16 bits of `old`,
// v_cvt_f32_fp8 / _bf8 read byte `byte_sel`). Modelled from the format definition: round to
// nearest even, no saturation (callers saturate first). Only what arch.h uses is modelled; any
// other __builtin_amdgcn_* stays undeclared and fails the compile.
namespace hipcpu {
inline int pack_two_fp8(const SmallFloat& f, float a, float b, int old, bool high_word) {
  const uint32_t packed = encode(f, a, false) | (encode(f, b, false) << 8);
  const uint32_t o = static_cast<uint32_t>(old);
  return static_cast<int>(high_word ? (o & 0xffffu) | (packed << 16) : (o & 0xffff0000u) | packed);
}
}  // namespace hipcpu
inline int __builtin_amdgcn_cvt_pk_fp8_f32(float a, float b, int old, bool high_word) {
  return hipcpu::pack_two_fp8(hipcpu::kOcpE4M3, a, b, old, high_word);
}
inline int __builtin_amdgcn_cvt_pk_bf8_f32(float a, float b, int old, bool high_word) {
  return hipcpu::pack_two_fp8(hipcpu::kOcpE5M2, a, b, old, high_word);
}
inline float __builtin_amdgcn_cvt_f32_fp8(int src, int byte_sel) {
  return float(hipcpu::decode(hipcpu::kOcpE4M3, (uint32_t(src) >> (8 * byte_sel)) & 0xffu));
}
inline float __builtin_amdgcn_cvt_f32_bf8(int src, int byte_sel) {
  return float(hipcpu::decode(hipcpu::kOcpE5M2, (uint32_t(src) >> (8 * byte_sel)) & 0xffu));
}
#endif
