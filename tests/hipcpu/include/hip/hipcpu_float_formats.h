// The small floating-point formats, written from their definitions, for the HIP-on-CPU runtime.
//
// A format is (exponent bits, mantissa bits, bias, what the all-ones exponent means). Encoding
// rounds to nearest even on the exact value (a double holds every float exactly), so one routine
// serves binary16, and both FP8 flavours:
//   OCP E4M3  bias 7, no infinity, S.1111.111 is NaN, max 448
//   OCP E5M2  bias 15, S.11111.00 is infinity, S.11111.xx (xx != 0) NaN, max 57344
//   FNUZ E4M3 bias 8, FNUZ E5M2 bias 16: no infinity, no negative zero, 0x80 is the only NaN
// The torch dtypes float8_e4m3fn / e5m2 / e4m3fnuz / e5m2fnuz follow the same definitions;
// tests/hipcpu/test_formats.py checks all 256 codes of each against them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hipcpu {

enum class Special { kIeee, kOcpE4M3, kFnuz };  // what the top exponent code / 0x80 mean

struct SmallFloat {
  int exp_bits, man_bits, bias;
  Special special;
};

constexpr SmallFloat kBinary16{5, 10, 15, Special::kIeee};
constexpr SmallFloat kOcpE4M3{4, 3, 7, Special::kOcpE4M3};
constexpr SmallFloat kOcpE5M2{5, 2, 15, Special::kIeee};
constexpr SmallFloat kFnuzE4M3{4, 3, 8, Special::kFnuz};
constexpr SmallFloat kFnuzE5M2{5, 2, 16, Special::kFnuz};

inline uint32_t nan_code(const SmallFloat& f, bool negative) {
  const uint32_t all = (1u << (f.exp_bits + f.man_bits)) - 1;  // every bit but the sign
  if (f.special == Special::kFnuz) return 1u << (f.exp_bits + f.man_bits);
  if (f.special == Special::kOcpE4M3) return (negative ? 1u << (f.exp_bits + f.man_bits) : 0) | all;
  // IEEE-like: quiet NaN = all exponent bits and the top mantissa bit (sign kept)
  return (negative ? 1u << (f.exp_bits + f.man_bits) : 0) | ((1u << f.exp_bits) - 1) << f.man_bits |
         (1u << (f.man_bits - 1));
}

// Largest finite code's magnitude bits (no sign).
inline uint32_t max_code(const SmallFloat& f) {
  const uint32_t emax = (1u << f.exp_bits) - 1;
  const uint32_t mmax = (1u << f.man_bits) - 1;
  switch (f.special) {
    case Special::kIeee: return ((emax - 1) << f.man_bits) | mmax;
    case Special::kOcpE4M3: return (emax << f.man_bits) | (mmax - 1);
    case Special::kFnuz: return (emax << f.man_bits) | mmax;
  }
  return 0;
}

inline double decode(const SmallFloat& f, uint32_t code) {
  const uint32_t sign_bit = 1u << (f.exp_bits + f.man_bits);
  const bool neg = (code & sign_bit) != 0;
  const uint32_t mag = code & (sign_bit - 1);
  const uint32_t e = mag >> f.man_bits, m = mag & ((1u << f.man_bits) - 1);
  const uint32_t emax = (1u << f.exp_bits) - 1;
  if (f.special == Special::kFnuz && code == sign_bit) return std::nan("");
  if (f.special == Special::kOcpE4M3 && e == emax && m == (1u << f.man_bits) - 1)
    return std::nan("");
  if (f.special == Special::kIeee && e == emax)
    return m ? std::nan("") : (neg ? -INFINITY : INFINITY);
  double v = e == 0 ? std::ldexp(double(m), 1 - f.bias - f.man_bits)
                    : std::ldexp(double(m | (1u << f.man_bits)), int(e) - f.bias - f.man_bits);
  return neg ? -v : v;
}

// saturate: out-of-range finite values and infinities become the largest finite value (what
// the SATFINITE conversions do); otherwise they become infinity (IEEE formats) or NaN.
inline uint32_t encode(const SmallFloat& f, double x, bool saturate) {
  const uint32_t sign_bit = 1u << (f.exp_bits + f.man_bits);
  const bool neg = std::signbit(x);
  if (std::isnan(x)) return nan_code(f, neg);
  const uint32_t sign = neg ? sign_bit : 0;
  const double max = decode(f, max_code(f));
  const uint32_t overflow =
      saturate ? (sign | max_code(f))
               : (f.special == Special::kIeee ? sign | (((1u << f.exp_bits) - 1) << f.man_bits)
                                              : nan_code(f, neg));
  const double a = std::fabs(x);
  if (std::isinf(a)) return overflow;
  // Spacing of representable values around a: 2^(exponent - man_bits), at least the subnormal one.
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = frac * 2^exp2, frac in [0.5, 1)
  int e = exp2 - 1;      // a in [2^e, 2^(e+1))
  const int emin = 1 - f.bias;
  if (a == 0.0 || e < emin) e = emin;
  const double quantum = std::ldexp(1.0, e - f.man_bits);
  const double q = std::nearbyint(a / quantum);  // round half to even (default mode)
  const double r = q * quantum;
  if (r > max) {
    // Past the largest finite value: rounding up from the largest value counts as overflow only
    // once the exact value reaches the midpoint to the next (nonexistent) code.
    return overflow;
  }
  if (r == 0.0) return f.special == Special::kFnuz ? 0u : sign;  // FNUZ: no negative zero
  int re = 0;
  std::frexp(r, &re);
  re -= 1;
  uint32_t code;
  if (re < emin) {
    code = uint32_t(std::ldexp(r, f.bias - 1 + f.man_bits));  // subnormal: m * 2^(emin - man)
  } else {
    const uint32_t m = uint32_t(std::ldexp(r, f.man_bits - re)) - (1u << f.man_bits);
    code = (uint32_t(re + f.bias) << f.man_bits) | m;
  }
  return sign | code;
}

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline unsigned short float_to_binary16(float x) {
  return static_cast<unsigned short>(encode(kBinary16, x, false));
}
inline float binary16_to_float(unsigned short h) { return float(decode(kBinary16, h)); }

inline unsigned short float_to_bfloat16(float x) {
  uint32_t u = float_to_bits(x);
  if (std::isnan(x)) return static_cast<unsigned short>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even on the dropped 16 bits
  return static_cast<unsigned short>(u >> 16);
}
inline float bfloat16_to_float(unsigned short b) { return bits_to_float(uint32_t(b) << 16); }

}  // namespace hipcpu
