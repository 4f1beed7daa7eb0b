// fp16 of the HIP-on-CPU runtime: IEEE binary16 written from its definition (1 sign, 5 exponent
// bits biased by 15, 10 mantissa bits), conversions rounding to nearest even.
#pragma once
#include <cstdint>
#include <cstring>

#include "hipcpu_float_formats.h"

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(hipcpu::float_to_binary16(f)) {}
  __half(__half_raw r) : __x(r.x) {}
  operator float() const { return hipcpu::binary16_to_float(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};

struct __half2 {
  __half x, y;
};

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }

#include "hipcpu_vector_types.h"
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
