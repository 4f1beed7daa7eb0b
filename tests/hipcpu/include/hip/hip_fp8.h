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
