// Portability header: the one place where the two vendors differ in what hipify cannot translate.
//
// Everything else in csrc/common is written once in CUDA C++ and hipified at build time. What a
// text substitution cannot get right is named here instead: the physical warp size, warp
// shuffles, the FP8 storage encodings (OCP on NVIDIA and gfx950, FNUZ on gfx942) and capability
// macros. `__HIP_PLATFORM_AMD__` may appear only in this file and in csrc/hip/.
#pragma once

#include <stdint.h>

#include <type_traits>

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
// CDNA wavefronts are 64 lanes wide on every arch we build for (gfx90a, gfx942, gfx950). RDNA
// (gfx10/11/12) runs 32-lane wavefronts by default: every reduction here would read lanes that do
// not exist, so those targets are refused rather than compiled into wrong answers.
#if defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__) || \
    (defined(__AMDGCN_WAVEFRONT_SIZE__) && __AMDGCN_WAVEFRONT_SIZE__ != 64)
#error "transformer_engine: wave32 AMD targets (RDNA: gfx10xx, gfx11xx, gfx12xx) are not supported; build for gfx90a, gfx942 or gfx950 (64-lane wavefronts)"
#endif
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
// MI350 (gfx950) converts OCP FP8 in hardware, but HIP 6.4's hip_fp8.h takes its hardware path
// only for gfx940/941/942/gfx12; the compiler's conversion builtins are used directly there.
#if defined(__gfx950__)
#define TE_FP8_CVT_BUILTINS 1
#endif
#else
#define TE_WARP_SIZE 32
#define TE_HAS_FP8 1   // software conversion below sm_89, hardware cvt from sm_89
#define TE_MATRIX_CORE_MMA 1
#endif
#ifndef TE_FP8_FNUZ
#define TE_FP8_FNUZ 0
#endif
#ifndef TE_FP8_CVT_BUILTINS
#define TE_FP8_CVT_BUILTINS 0
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
//
// The rule for special inputs, the same on every vendor, flavour and code path (NVIDIA's
// __NV_SATFINITE conversion defines it): +-Inf becomes +-max of the format (448 / 57344 OCP,
// 240 / 57344 FNUZ), NaN stays NaN (FNUZ has one NaN code, 0x80; OCP gets 0x7F), and finite
// values beyond max saturate to +-max. On AMD the specials are settled here, before the HIP
// conversion or the hardware instruction runs, because the hardware paths clamp with min/max
// operations that turn NaN into a finite value, and FNUZ has no Inf to keep. A negative value
// that rounds to zero gives +0 in FNUZ (0x80 would be NaN).
#if defined(__HIP_PLATFORM_AMD__)
namespace amd_fp8 {
template <typename Format>
__device__ __forceinline__ float max_of() {
  if (std::is_same<Format, fp8e4m3>::value) return TE_FP8_FNUZ ? kFp8E4M3MaxFnuz : kFp8E4M3MaxOcp;
  return TE_FP8_FNUZ ? kFp8E5M2MaxFnuz : kFp8E5M2MaxOcp;
}
__device__ __forceinline__ uint8_t nan_bits() { return TE_FP8_FNUZ ? 0x80 : 0x7F; }
__device__ __forceinline__ bool is_nan(float x) { return !(x == x); }
}  // namespace amd_fp8
#endif

__device__ __forceinline__ uint8_t float_to_fp8_bits(float x, fp8e4m3) {
#if defined(__HIP_PLATFORM_AMD__)
  if (amd_fp8::is_nan(x)) return amd_fp8::nan_bits();
  const float m = amd_fp8::max_of<fp8e4m3>();
  x = x > m ? m : (x < -m ? -m : x);  // +-Inf and out-of-range values saturate
#if TE_FP8_CVT_BUILTINS
  return static_cast<uint8_t>(__builtin_amdgcn_cvt_pk_fp8_f32(x, x, 0, false) & 0xff);
#elif TE_FP8_FNUZ
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
  if (amd_fp8::is_nan(x)) return amd_fp8::nan_bits();
  const float m = amd_fp8::max_of<fp8e5m2>();
  x = x > m ? m : (x < -m ? -m : x);
#if TE_FP8_CVT_BUILTINS
  return static_cast<uint8_t>(__builtin_amdgcn_cvt_pk_bf8_f32(x, x, 0, false) & 0xff);
#elif TE_FP8_FNUZ
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
#if TE_FP8_CVT_BUILTINS
  return __builtin_amdgcn_cvt_f32_fp8(static_cast<int>(bits), 0);
#elif TE_FP8_FNUZ
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
#if TE_FP8_CVT_BUILTINS
  return __builtin_amdgcn_cvt_f32_bf8(static_cast<int>(bits), 0);
#elif TE_FP8_FNUZ
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
// Register-level matrix multiply on NVIDIA tensor cores (sm_80 and newer): mma.sync m16n8k16,
// ldmatrix and cp.async, with the fragment layouts the PTX ISA documents, so that a kernel can
// keep accumulators in registers and reuse them as the next product's operand. With
// lane = 4 * g + q (g = lane / 4, q = lane % 4), one warp holds
//   A [16 x 16], 4 words of two 16-bit elements: a0 = A(g, 2q..2q+1), a1 = A(g+8, 2q..2q+1),
//                a2 = A(g, 2q+8..2q+9), a3 = A(g+8, 2q+8..2q+9)
//   B [16 x 8],  2 words: b0 = B(2q..2q+1, g), b1 = B(2q+8..2q+9, g)
//   C [16 x 8],  4 floats: c0, c1 = C(g, 2q..2q+1), c2, c3 = C(g+8, 2q..2q+1)
// (the lower column / row index in the lower half of a word). The accumulator of two adjacent
// 8-column tiles, packed to 16 bits, is therefore the A operand of a product over those 16
// columns. HIP has none of it: TE_HAS_MMA_SYNC is 0 there and users are compiled out.
// ---------------------------------------------------------------------------------------------
#if defined(__HIP_PLATFORM_AMD__)
#define TE_HAS_MMA_SYNC 0
#elif !defined(__CUDACC__)
// A host C++ file (no nvcc) that includes this header for its host-side facts: these device
// intrinsics are nvcc's only, and such a file has no kernels to use them.
#define TE_HAS_MMA_SYNC 0
#else
#define TE_HAS_MMA_SYNC 1

namespace te {
namespace mma_sync {

// Device code compiled for an arch below sm_80 (fat binaries) traps; the host side refuses to
// launch there (device_supported).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TE_MMA_SYNC_UNAVAILABLE 1
#endif

// Two floats into one word of two 16-bit elements of T (lo in the lower half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<__half2*>(&w));
}

// c += a . b on one 16x8x16 tile, fp32 accumulation; T is __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifdef TE_MMA_SYNC_UNAVAILABLE
  __trap();
#else
  if constexpr (sizeof(T) == 2 && std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements from shared memory; lanes 8m .. 8m+7 give the addresses
// of matrix m's rows (16 bytes each, 16-byte aligned). Word m of lane l holds row l / 4,
// elements 2 (l % 4) .. +1 of matrix m; with _trans, matrix m is transposed first (column l / 4,
// rows 2 (l % 4) .. +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
#ifdef TE_MMA_SYNC_UNAVAILABLE
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
#ifdef TE_MMA_SYNC_UNAVAILABLE
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
#endif
}

// 16 bytes global -> shared without passing through registers; bytes past src_bytes (0 or 16)
// are zero-filled. Completes at cp_async_wait.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
#ifdef TE_MMA_SYNC_UNAVAILABLE
  __trap();
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef TE_MMA_SYNC_UNAVAILABLE
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#ifndef TE_MMA_SYNC_UNAVAILABLE
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

// Whether `device` runs these instructions (compute capability 8.0 or newer).
inline bool device_supported(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
             cudaSuccess &&
         major >= 8;
}

}  // namespace mma_sync
}  // namespace te
#endif

// ---------------------------------------------------------------------------------------------
// Overlapping launch: on NVIDIA (programmatic dependent launch, sm_90+) the kernel may be
// scheduled while the kernel before it in the stream is still running its last blocks, which
// hides the launch latency and ramp of the new grid (about 0.3% of a 90 us bandwidth-bound
// kernel on an H100). The kernel must call te::wait_for_previous_grid() (util/device_utils.cuh)
// before its first global memory access, so its results are those of plain stream order.
// Older NVIDIA devices and HIP get a plain launch. Errors surface through cudaGetLastError, as
// for <<<>>> launches.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__) || defined(__HIPCC__)  // kernel launch syntax: device compilers only
#include <atomic>

namespace te {

#if defined(__HIP_PLATFORM_AMD__)
template <typename... Params, typename... Args>
inline void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block,
                               hipStream_t stream, Args... args) {
  kernel<<<grid, block, 0, stream>>>(args...);
}
#else
inline bool device_has_overlapping_launch() {
  constexpr int kDevices = 64;
  static std::atomic<signed char> known[kDevices];  // 0 unknown, 1 yes, -1 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return false;
  if (device >= kDevices) return false;
  signed char k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                    cudaSuccess;
    k = ok && major >= 9 ? 1 : -1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k > 0;
}

template <typename... Params, typename... Args>
inline void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block,
                               cudaStream_t stream, Args... args) {
  if (!device_has_overlapping_launch()) {
    kernel<<<grid, block, 0, stream>>>(args...);
    return;
  }
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, args...);
}
#endif

}  // namespace te
#endif  // __CUDACC__ || __HIPCC__

// ---------------------------------------------------------------------------------------------
// Host-side device facts (device/device_info.cpp). The runtime calls that read them are written
// once and hipified; what hipify cannot translate is what the vendors' answers mean.
// ---------------------------------------------------------------------------------------------
#include <stddef.h>
#include <stdio.h>
#include <string.h>

namespace te {

#if defined(__HIP_PLATFORM_AMD__)
constexpr const char* kBuildBackend = "rocm";  // nvte_build_backend
// One AMD binary serves devices with and without FP8: MI200 (gfx90a) and MI100 (gfx908) have
// neither FP8 conversions nor FP8 matrix instructions, so FP8 support is a run-time question.
constexpr bool kSomeDevicesLackFp8 = true;
#else
constexpr const char* kBuildBackend = "cuda";
// Every NVIDIA device this library builds for handles FP8 tensors (hardware conversion from
// sm_89, software below), so nothing is refused and nothing needs asking.
constexpr bool kSomeDevicesLackFp8 = false;
#endif

// The arch name nvte_device_arch reports. NVIDIA names an arch by its compute capability
// ("sm_90"); AMD's gfx numbers do not follow from major/minor, so gcnArchName is taken with its
// target features stripped ("gfx942:sramecc+:xnack-" -> "gfx942").
#if defined(__HIP_PLATFORM_AMD__)
inline void device_arch_name(const hipDeviceProp_t& prop, char* out, size_t len) {
  snprintf(out, len, "%s", prop.gcnArchName);
  if (char* colon = strchr(out, ':')) *colon = '\0';
}
#else
inline void device_arch_name(const cudaDeviceProp& prop, char* out, size_t len) {
  snprintf(out, len, "sm_%d%d", prop.major, prop.minor);
}
#endif

// The arch itself when it is one without FP8 (see kSomeDevicesLackFp8), else null.
inline const char* arch_without_fp8(const char* arch) {
  for (const char* name : {"gfx90a", "gfx908"})
    if (strncmp(arch, name, 6) == 0) return name;
  return nullptr;
}

}  // namespace te
