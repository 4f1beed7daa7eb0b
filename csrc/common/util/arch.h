// Portability header: the one place where the two vendors differ in what hipify cannot translate.
//
// Everything else in csrc/common is written once in CUDA C++ and hipified at build time. What a
// text substitution cannot get right is named here instead: the physical warp size, warp
// shuffles, the FP8 storage encodings (OCP on NVIDIA and gfx950, FNUZ on gfx942) and capability
// macros. `__HIP_PLATFORM_AMD__` may appear only in this file and in csrc/hip/.
#pragma once

#include <stdint.h>

#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#include <hip/hip_fp8.h>
#define TE_PLATFORM_ROCM 1
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#define TE_PLATFORM_CUDA 1
#endif

// ---------------------------------------------------------------------------------------------
// Capability macros (device-compile time: one value per target arch in the fat binary)
// ---------------------------------------------------------------------------------------------
#if defined(__HIP_PLATFORM_AMD__)
// CDNA wavefronts are 64 lanes wide on every arch we build for (gfx90a, gfx942, gfx950).
#define TE_WARP_SIZE 64
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define TE_FP8_FNUZ 1  // MI300: FP8 with no negative zero, bias shifted by one, E4M3 max 240
#endif
#if defined(__gfx90a__)
#define TE_HAS_FP8 0   // MI200 has no FP8 at all; kernels that need it refuse at run time
#else
#define TE_HAS_FP8 1
#endif
#define TE_MATRIX_CORE_MFMA 1
#else
#define TE_WARP_SIZE 32
#define TE_HAS_FP8 1   // software conversion below sm_89, hardware cvt from sm_89
#define TE_MATRIX_CORE_MMA 1
#endif
#ifndef TE_FP8_FNUZ
#define TE_FP8_FNUZ 0
#endif

// Kernels are written for a 32-lane logical warp; reductions use the physical size so that
// nothing is left out on a 64-lane wavefront.
#define TE_LOGICAL_WARP_SIZE 32

namespace te {

// ---------------------------------------------------------------------------------------------
// Warp shuffles. HIP's *_sync builtins need a 64-bit mask and an opt-in macro; the plain HIP
// shuffle is already convergent across the wavefront, so it is used there.
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T warp_shfl_xor(T value, int lane_mask) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl_xor(value, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
#endif
}

template <typename T>
__device__ __forceinline__ T warp_shfl(T value, int src_lane) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl(value, src_lane);
#else
  return __shfl_sync(0xffffffffu, value, src_lane);
#endif
}

// ---------------------------------------------------------------------------------------------
// FP8 storage. One byte-sized type per *format*; its encoding (OCP or FNUZ) is the device's.
// Host code only ever moves these bytes; conversion happens in device code, where the target
// arch is known.
// ---------------------------------------------------------------------------------------------
struct fp8e4m3 { uint8_t bits; };
struct fp8e5m2 { uint8_t bits; };

// Largest finite magnitudes, per flavour. Python's capability query returns the same numbers.
constexpr float kFp8E4M3MaxOcp = 448.0f;
constexpr float kFp8E4M3MaxFnuz = 240.0f;
constexpr float kFp8E5M2MaxOcp = 57344.0f;
constexpr float kFp8E5M2MaxFnuz = 57344.0f;

// Round-to-nearest-even with saturation to the largest finite value (NaN stays NaN).
__device__ __forceinline__ uint8_t float_to_fp8_bits(float x, fp8e4m3) {
#if defined(__HIP_PLATFORM_AMD__)
#if TE_FP8_FNUZ
  return __hip_cvt_float_to_fp8(x, __HIP_SATFINITE, __HIP_E4M3_FNUZ);
#else
  return __hip_cvt_float_to_fp8(x, __HIP_SATFINITE, __HIP_E4M3);
#endif
#else
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
#endif
}

__device__ __forceinline__ uint8_t float_to_fp8_bits(float x, fp8e5m2) {
#if defined(__HIP_PLATFORM_AMD__)
#if TE_FP8_FNUZ
  return __hip_cvt_float_to_fp8(x, __HIP_SATFINITE, __HIP_E5M2_FNUZ);
#else
  return __hip_cvt_float_to_fp8(x, __HIP_SATFINITE, __HIP_E5M2);
#endif
#else
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
#endif
}

__device__ __forceinline__ float fp8_bits_to_float(uint8_t bits, fp8e4m3) {
#if defined(__HIP_PLATFORM_AMD__)
#if TE_FP8_FNUZ
  return float(__half(__hip_cvt_fp8_to_halfraw(bits, __HIP_E4M3_FNUZ)));
#else
  return float(__half(__hip_cvt_fp8_to_halfraw(bits, __HIP_E4M3)));
#endif
#else
  return float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
#endif
}

__device__ __forceinline__ float fp8_bits_to_float(uint8_t bits, fp8e5m2) {
#if defined(__HIP_PLATFORM_AMD__)
#if TE_FP8_FNUZ
  return float(__half(__hip_cvt_fp8_to_halfraw(bits, __HIP_E5M2_FNUZ)));
#else
  return float(__half(__hip_cvt_fp8_to_halfraw(bits, __HIP_E5M2)));
#endif
#else
  return float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E5M2)));
#endif
}

// 2^x from the hardware exponential unit alone, results below 2^-126 flushed to zero. Plain
// exp2f / __expf keep denormal results, which costs three extra instructions per call on
// NVIDIA; softmax probabilities that small are zero in every output dtype anyway.
__device__ __forceinline__ float fast_exp2_ftz(float x) {
#if defined(__HIP_PLATFORM_AMD__)
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// An empty statement the optimiser must assume rewrites `v`: values derived from v before it are
// computed again after it instead of being kept live. Lets a kernel hold data packed in
// registers and unpack it in every pass (cheap) rather than keep the unpacked copies (many
// registers, fewer resident threads).
__device__ __forceinline__ void forget_value(uint32_t& v) {
#if defined(__HIP_PLATFORM_AMD__)
  asm volatile("" : "+v"(v));
#else
  asm volatile("" : "+r"(v));
#endif
}

}  // namespace te

// ---------------------------------------------------------------------------------------------
// Warp matrix multiply-accumulate on 16x16x16 tiles, WMMA style: fragments are opaque and move
// through memory with a leading dimension, so a kernel written against te::warp_mma never
// depends on a register layout. NVIDIA maps it to nvcuda::wmma (one 32-lane warp per fragment).
// HIP has no mapping in this toolchain yet (rocWMMA is not installed): TE_HAS_WARP_MMA is 0
// there and code using it is compiled out, leaving the FMA kernels.
// ---------------------------------------------------------------------------------------------
#if defined(__HIP_PLATFORM_AMD__)
#define TE_HAS_WARP_MMA 0
#else
#define TE_HAS_WARP_MMA 1
#include <mma.h>

namespace te {
namespace warp_mma {

constexpr int kLanes = 32;  // threads that hold one fragment together
template <typename T>
using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T,
                                     nvcuda::wmma::row_major>;
template <typename T>  // B(k, n) at p[k * ld + n]
using FragBRow = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T,
                                        nvcuda::wmma::row_major>;
template <typename T>  // B(k, n) at p[n * ld + k]
using FragBCol = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T,
                                        nvcuda::wmma::col_major>;
using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// p: 32-byte aligned; ld: elements, a multiple of 8 (16-bit types) or 4 (float).
template <typename Frag, typename T>
__device__ __forceinline__ void load(Frag& f, const T* p, unsigned ld) {
  nvcuda::wmma::load_matrix_sync(f, p, ld);
}
__device__ __forceinline__ void load_c(FragC& f, const float* p, unsigned ld) {
  nvcuda::wmma::load_matrix_sync(f, p, ld, nvcuda::wmma::mem_row_major);
}
__device__ __forceinline__ void store_c(float* p, const FragC& f, unsigned ld) {
  nvcuda::wmma::store_matrix_sync(p, f, ld, nvcuda::wmma::mem_row_major);
}
__device__ __forceinline__ void zero(FragC& f) { nvcuda::wmma::fill_fragment(f, 0.f); }
template <typename A, typename B>
__device__ __forceinline__ void mma(FragC& c, const A& a, const B& b) {
  nvcuda::wmma::mma_sync(c, a, b, c);
}
// Orders the lanes of one fragment group around shared-memory hand-offs.
__device__ __forceinline__ void sync_lanes() { __syncwarp(); }

}  // namespace warp_mma
}  // namespace te
#endif
