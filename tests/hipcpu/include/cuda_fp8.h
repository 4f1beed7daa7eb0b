// For the C API tests only (tests/cpp decode the library's FP8 output with NVIDIA's names): in
// the emulation, "E4M3"/"E5M2" mean the device's flavour, FNUZ on gfx942 and OCP on gfx950,
// exactly as the library's kernels encode them.
#pragma once
#include <hip/hip_fp8.h>

enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };

inline __hip_fp8_interpretation_t hipcpu_device_fp8(__nv_fp8_interpretation_t t) {
#if defined(HIPCPU_GFX942)
  return t == __NV_E4M3 ? __HIP_E4M3_FNUZ : __HIP_E5M2_FNUZ;
#else
  return t == __NV_E4M3 ? __HIP_E4M3 : __HIP_E5M2;
#endif
}
inline __half_raw __nv_cvt_fp8_to_halfraw(unsigned char x, __nv_fp8_interpretation_t t) {
  return __hip_cvt_fp8_to_halfraw(x, hipcpu_device_fp8(t));
}
inline unsigned char __nv_cvt_float_to_fp8(float x, __nv_saturation_t s, __nv_fp8_interpretation_t t) {
  return __hip_cvt_float_to_fp8(x, s == __NV_SATFINITE ? __HIP_SATFINITE : __HIP_NOSAT,
                                hipcpu_device_fp8(t));
}
