// bfloat16 of the HIP-on-CPU runtime: the upper half of an IEEE binary32, rounding to nearest
// even; NaN stays a (quiet) NaN.
#pragma once
#include <cstdint>

#include "hipcpu_float_formats.h"

struct __hip_bfloat16 {
  unsigned short data;
  __hip_bfloat16() = default;
  __hip_bfloat16(float f) : data(hipcpu::float_to_bfloat16(f)) {}
  operator float() const { return hipcpu::bfloat16_to_float(data); }
};

struct __hip_bfloat162 {
  __hip_bfloat16 x, y;
};

inline __hip_bfloat16 __float2bfloat16(float f) { return __hip_bfloat16(f); }
inline __hip_bfloat16 __float2bfloat16_rn(float f) { return __hip_bfloat16(f); }
inline float __bfloat162float(__hip_bfloat16 h) { return float(h); }
inline unsigned short __bfloat16_as_ushort(__hip_bfloat16 h) { return h.data; }
inline __hip_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __hip_bfloat162{__hip_bfloat16(a), __hip_bfloat16(b)};
}

#include "hipcpu_vector_types.h"
inline float2 __bfloat1622float2(__hip_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
