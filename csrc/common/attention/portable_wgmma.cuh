// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) for the portable attention kernels, as
// the PTX ISA documents it: four warps (a warpgroup) issue one asynchronous product
// D[64 x N] (+)= A[64 x 16] . B[16 x N], A from shared memory or registers, B from shared memory,
// D in registers. Compiled only for NVIDIA (TE_HAS_MMA_SYNC; hipify leaves nothing of it on AMD)
// and, in device code, only for the sm_90a target: any other target's copy traps, and the host
// side (wgmma_usable) never launches it there.
//
// Shared-memory operands use the 128-byte swizzle: a tile of R rows x C 16-bit elements is
// stored as C / 64 column blocks of R rows of 128 bytes, and the 16-byte chunk c of row r sits
// at chunk c ^ (r % 8) of its row. Eight consecutive rows (1024 bytes, 1024-byte aligned) form
// one swizzle atom; the tensor core applies the same XOR to the addresses it generates, which is
// why tiles start on 1024-byte boundaries and a k-step inside a 128-byte row is a plain
// 32-byte advance of the start address. Reads of eight rows at one chunk index then touch eight
// different bank groups, so neither the copies in nor the tensor core's reads conflict.
//
// Accumulator layout (m64nN, f32): warp w of the warpgroup holds rows 16 w .. 16 w + 15; with
// lane = 4 g + q, d[4 n + e] is row g + 8 (e / 2), column 8 n + 2 q + (e % 2): per 8 columns the
// layout of mma.sync's C fragment (util/arch.h), so the packed accumulator of 16 columns is
// the register A operand of the next product, as with mma.sync.
#pragma once

#include "attention/portable_tc.cuh"

#if TE_HAS_MMA_SYNC
#include <string.h>

namespace te {
namespace attention {
namespace portable {
namespace wgmma {

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TE_WGMMA_UNAVAILABLE 1  // device code for a target without wgmma: traps
#endif

constexpr int kWarpgroup = 128;  // threads
constexpr int kRowBytes = 128;   // one swizzled row of a column block
constexpr int kBlockCols = 64;   // 16-bit elements per column block

// Byte offset of 16-byte chunk `chunk` (of D / 8) of row r in a swizzled [ROWS x D] tile.
template <int ROWS>
__device__ __forceinline__ int swizzled_offset(int r, int chunk) {
  return (chunk / 8) * ROWS * kRowBytes + r * kRowBytes + (((chunk % 8) ^ (r % 8)) * 16);
}

// Rows [row0, row0 + ROWS) of a [positions, D] slice (stride tok_stride) into a swizzled tile,
// asynchronously (cp.async, the caller commits and waits); rows at or past `valid` are zero.
// Thread t copies chunk t % (D / 8) of rows t / (D / 8) + k NT / (D / 8): a multiple of 8 rows
// apart, so its swizzled chunk position is the same in every row it copies.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_swizzled(T* tile, const T* gbase, int64_t tok_stride,
                                                   int row0, int valid) {
  constexpr int kChunks = D / 8, kRowsPerPass = NT / kChunks;
  static_assert(NT % kChunks == 0 && kRowsPerPass % 8 == 0, "rows per pass: a multiple of 8");
  const int c = threadIdx.x % kChunks, r_first = threadIdx.x / kChunks;
  unsigned char* dst = reinterpret_cast<unsigned char*>(tile) +
                       swizzled_offset<ROWS>(r_first, c) - r_first * kRowBytes;
  const T* src_col = gbase + c * 8;
#pragma unroll
  for (int r = r_first; r < ROWS; r += kRowsPerPass) {
    const bool ok = row0 + r < valid;
    // a skipped row reads nothing (size 0) but still needs a valid address
    const T* src = ok ? src_col + int64_t(row0 + r) * tok_stride : gbase;
    mma_sync::cp_async_16(dst + r * kRowBytes, src, ok ? 16 : 0);
  }
}

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte units)
// and the 128-byte swizzle mode (1 in bits 62-63).
__device__ __forceinline__ uint64_t descriptor(const void* start, uint32_t lead_bytes,
                                               uint32_t stride_bytes) {
  const uint32_t addr = mma_sync::smem_addr(start);
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lead_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// An operand whose reduction dim is contiguous (K-major: Q and K rows of D elements). Only the
// stride between 8-row atoms matters (1024 bytes); the reduction never leaves a 128-byte row
// within one instruction, so the leading offset is unused (1 by convention).
__device__ __forceinline__ uint64_t kmajor_desc(const void* start) {
  return descriptor(start, 16, 8 * kRowBytes);
}

// Orders this warpgroup's register writes before the wgmma that reads them (accumulators being
// rescaled, A fragments just packed).
__device__ __forceinline__ void fence() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most `Pending` committed groups of this warpgroup are in flight.
template <int Pending>
__device__ __forceinline__ void wait() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async
// proxy: this fence (then a barrier) makes the copies visible to the tensor core.
__device__ __forceinline__ void fence_async_shared() {
#ifndef TE_WGMMA_UNAVAILABLE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Named barriers (ids 1-15; __syncthreads is 0) between `threads` threads: sync waits for
// the count, arrive adds this warp without waiting. Two warpgroups hand a turn to each other
// with them.
__device__ __forceinline__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Whether `pred` holds for any thread of this warpgroup, the same answer in all its 128 threads
// (bar.red.or over named barrier `id`, counted for one warpgroup). A branch that holds a
// wgmma.fence / mma_async / commit_group / wait_group must be taken by the whole warpgroup
// alike (.aligned); a warp's own vote (__any_sync) does not give that.
__device__ __forceinline__ bool warpgroup_any(int id, bool pred) {
  int any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\n"
      "selp.b32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(int(pred)), "r"(id), "n"(kWarpgroup)
      : "memory");
  return any != 0;
}

// The compiler sees an asynchronous product as done when it is issued; pinning its registers
// here, after wait(), keeps every read of the results after the wait and every write of the
// operands before the issue.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// ---- the products: m64nNk16, f32 accumulation; N = 64 or 128 --------------------------------
#define TE_WG_D32                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TE_WG_D64                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define TE_WG_F8(i)                                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),           \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TE_WG_OUT32 TE_WG_F8(0), TE_WG_F8(8), TE_WG_F8(16), TE_WG_F8(24)
#define TE_WG_OUT64 TE_WG_OUT32, TE_WG_F8(32), TE_WG_F8(40), TE_WG_F8(48), TE_WG_F8(56)

// Both operands in shared memory; d = A . B^T, or d += A . B^T when accumulate. TRANS_A / TRANS_B
// (immediates): 0 for a K-major operand, 1 for an MN-major one (transposed on read).
#define TE_WG_SS(SHAPE, TY, DREGS, DESC_A, DESC_B, ACC, TRANS_A, TRANS_B)                 \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                           \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " DREGS ", " DESC_A ", " DESC_B \
  ", p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"
// A from registers (four words), B MN-major in shared memory (transposed on read).
#define TE_WG_RS(SHAPE, TY, DREGS, A_REGS, DESC_B, ACC)                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                           \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " DREGS ", " A_REGS ", " DESC_B \
  ", p, 1, 1, 1;\n}\n"

// A and B K-major by default (S = Q K^T); TRANS_A / TRANS_B = 1 reads that operand MN-major
// (the backward's dQ = dS K takes dS from its transposed tile dS^T).
template <typename T, int N, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                       int accumulate) {
#ifdef TE_WGMMA_UNAVAILABLE
  __trap();
#else
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(N == 64 || N == 128, "wgmma::mma_ss: N is 64 or 128");
  if constexpr (N == 128 && kBf16) {
    asm volatile(TE_WG_SS("m64n128k16", "bf16", TE_WG_D64, "%64", "%65", "%66", "%67", "%68")
                 : TE_WG_OUT64
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  } else if constexpr (N == 128) {
    asm volatile(TE_WG_SS("m64n128k16", "f16", TE_WG_D64, "%64", "%65", "%66", "%67", "%68")
                 : TE_WG_OUT64
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  } else if constexpr (kBf16) {
    asm volatile(TE_WG_SS("m64n64k16", "bf16", TE_WG_D32, "%32", "%33", "%34", "%35", "%36")
                 : TE_WG_OUT32
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  } else {
    asm volatile(TE_WG_SS("m64n64k16", "f16", TE_WG_D32, "%32", "%33", "%34", "%35", "%36")
                 : TE_WG_OUT32
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
#endif
}

template <typename T, int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                       int accumulate) {
#ifdef TE_WGMMA_UNAVAILABLE
  __trap();
#else
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(N == 64 || N == 128, "wgmma::mma_rs: N is 64 or 128");
  if constexpr (N == 128 && kBf16) {
    asm volatile(TE_WG_RS("m64n128k16", "bf16", TE_WG_D64, "{%64, %65, %66, %67}", "%68", "%69")
                 : TE_WG_OUT64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else if constexpr (N == 128) {
    asm volatile(TE_WG_RS("m64n128k16", "f16", TE_WG_D64, "{%64, %65, %66, %67}", "%68", "%69")
                 : TE_WG_OUT64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else if constexpr (kBf16) {
    asm volatile(TE_WG_RS("m64n64k16", "bf16", TE_WG_D32, "{%32, %33, %34, %35}", "%36", "%37")
                 : TE_WG_OUT32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(TE_WG_RS("m64n64k16", "f16", TE_WG_D32, "{%32, %33, %34, %35}", "%36", "%37")
                 : TE_WG_OUT32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
#endif
}

#undef TE_WG_D32
#undef TE_WG_D64
#undef TE_WG_F8
#undef TE_WG_OUT32
#undef TE_WG_OUT64
#undef TE_WG_SS
#undef TE_WG_RS

// Whether the build holds sm_90a device code (NVTE_BUILD_ARCHS, the CMake arch list, has the
// token "90a") and `device` runs it (compute capability 9.0 exactly: sm_90a code runs nowhere
// else). Elsewhere the kernels' copies trap, so the host must not launch them.
inline bool usable(int device) {
#ifdef NVTE_BUILD_ARCHS
  const char* archs = NVTE_BUILD_ARCHS;
#else
  const char* archs = "";
#endif
  bool built = false;
  for (const char* p = archs; *p != '\0';) {
    const char* end = strchr(p, ';');
    const size_t len = end ? size_t(end - p) : strlen(p);
    if (len == 3 && strncmp(p, "90a", 3) == 0) built = true;
    p += len + (end ? 1 : 0);
  }
  int major = 0, minor = 0;
  return built &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
             cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
             cudaSuccess &&
         major == 9 && minor == 0;
}

}  // namespace wgmma
}  // namespace portable
}  // namespace attention
}  // namespace te
#endif  // TE_HAS_MMA_SYNC
