// Exposes, for tests/hipcpu/test_formats.py, the conversions the emulated kernels use: arch.h's
// FP8 conversions for the arch this is compiled for (gfx942: HIP's FNUZ conversion; gfx950: the
// conversion builtins), and the runtime's fp16 / bf16 / FP8 formats.
#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_fp8.h>

#include "util/arch.h"

extern "C" {
unsigned char probe_to_e4m3(float x) { return te::float_to_fp8_bits(x, te::fp8e4m3{}); }
unsigned char probe_to_e5m2(float x) { return te::float_to_fp8_bits(x, te::fp8e5m2{}); }
float probe_from_e4m3(unsigned char b) { return te::fp8_bits_to_float(b, te::fp8e4m3{}); }
float probe_from_e5m2(unsigned char b) { return te::fp8_bits_to_float(b, te::fp8e5m2{}); }
unsigned short probe_to_fp16(float x) { return __half_as_ushort(__float2half_rn(x)); }
unsigned short probe_to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
float probe_from_fp16(unsigned short b) { return __half2float(__ushort_as_half(b)); }
}
