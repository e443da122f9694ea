// Hopper (sm_90a) primitives of the wgmma prefill kernel (attention_prefill_sm90.cuh): shared-memory matrix
// descriptors for the 128-byte swizzle, warpgroup MMAs (wgmma.mma_async) in the shapes that kernel uses, and the
// mbarrier operations of its producer/consumer pipeline. The library also builds for sm_80: there (and on any
// target without sm_90a features) these compile to nothing and the host never launches the kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FDPP_WGMMA 1
#else
#define FDPP_WGMMA 0
#endif

namespace fdpp {
namespace attn {

// --- the 128-byte swizzled operand layout ------------------------------------------------------------------------
// A tile of `rows` rows of 16-bit elements is stored as panels of 64 columns (128 bytes per row); 16-byte chunk c
// of row r goes to panel c / 8, row r, chunk (c % 8) ^ (r % 8). With every panel 1024-byte aligned this is the
// hardware's 128-byte swizzle (byte-address bits 4-6 XOR bits 7-9), which wgmma reads through a descriptor and
// which keeps the cp.async stores free of bank conflicts.
__device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Matrix descriptor (PTX ISA, "matrix descriptor format"): start address, leading and stride byte offsets (each
// >> 4), layout type 1 = 128-byte swizzle. K-major operands (Q, K: the reduction dimension contiguous): the stride
// offset is 1024 (from one 8-row group to the next), the leading one unused. MN-major (V, whose head_dim columns
// are contiguous): leading = the panel stride along head_dim, stride = 1024 between groups of 8 keys.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((leading >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((stride >> 4) & 0x3FFF) << 32 | (1ull << 62);
}

// --- warpgroup MMA ordering --------------------------------------------------------------------------------------
// wgmma reads its accumulator and A registers asynchronously: wgmma_fence() orders earlier register writes before
// the next wgmma; wgmma_wait<0>() returns when every committed wgmma of this warp is done. keep_registers() stops
// the compiler from moving accesses of those registers across the asynchronous window.
__device__ __forceinline__ void wgmma_fence() {
#if FDPP_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FDPP_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if FDPP_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
template <int M>
__device__ __forceinline__ void keep_registers(float (&d)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}
template <int M>
__device__ __forceinline__ void keep_registers(uint32_t (&d)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(d[i][j])::"memory");
}

// --- mbarriers ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if FDPP_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if FDPP_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrives once this thread's earlier cp.async copies have landed (noinc: the count set at init includes it).
__device__ __forceinline__ void mbar_arrive_on_copies(uint32_t bar) {
#if FDPP_WGMMA
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Waits until the phase with this parity has completed (a fresh barrier counts parity 1 as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if FDPP_WGMMA
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// --- wgmma shapes: accumulator register i is d[i / 4][i % 4] (per warp the m16n8 fragment layout, repeated along N);
// scale-d = 1 (accumulate), no negation; the RS forms take A from registers and B (V) MN-major (trans-b = 1).
#if FDPP_WGMMA
// The PTX strings and operand lists below are laid out by hand:
// clang-format off
#define FDPP_WGMMA_ROW(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define FDPP_WGMMA_ACC32(d)                                                                                  \
  FDPP_WGMMA_ROW(d, 0), FDPP_WGMMA_ROW(d, 1), FDPP_WGMMA_ROW(d, 2), FDPP_WGMMA_ROW(d, 3), FDPP_WGMMA_ROW(d, 4), \
      FDPP_WGMMA_ROW(d, 5), FDPP_WGMMA_ROW(d, 6), FDPP_WGMMA_ROW(d, 7)
#define FDPP_WGMMA_ACC64(d)                                                                                    \
  FDPP_WGMMA_ACC32(d), FDPP_WGMMA_ROW(d, 8), FDPP_WGMMA_ROW(d, 9), FDPP_WGMMA_ROW(d, 10), FDPP_WGMMA_ROW(d, 11), \
      FDPP_WGMMA_ROW(d, 12), FDPP_WGMMA_ROW(d, 13), FDPP_WGMMA_ROW(d, 14), FDPP_WGMMA_ROW(d, 15)

#define FDPP_WGMMA_SS_M64N64K16(NAME, TY)                                                                              \
  __device__ __forceinline__ void NAME(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b) {                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {"                                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                      \
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                    \
                 : FDPP_WGMMA_ACC32(d)                                                                                 \
                 : "l"(desc_a), "l"(desc_b));                                                                          \
  }

#define FDPP_WGMMA_RS_M64N64K16(NAME, TY)                                                                              \
  __device__ __forceinline__ void NAME(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {"                                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                      \
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                      \
                 : FDPP_WGMMA_ACC32(d)                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                           \
  }

#define FDPP_WGMMA_RS_M64N128K16(NAME, TY)                                                                             \
  __device__ __forceinline__ void NAME(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TY "." #TY " {"                                       \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                     \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                     \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                      \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                      \
                 : FDPP_WGMMA_ACC64(d)                                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                           \
  }

FDPP_WGMMA_SS_M64N64K16(wgmma_ss_m64n64k16_f16, f16)
FDPP_WGMMA_SS_M64N64K16(wgmma_ss_m64n64k16_bf16, bf16)
FDPP_WGMMA_RS_M64N64K16(wgmma_rs_m64n64k16_f16, f16)
FDPP_WGMMA_RS_M64N64K16(wgmma_rs_m64n64k16_bf16, bf16)
FDPP_WGMMA_RS_M64N128K16(wgmma_rs_m64n128k16_f16, f16)
FDPP_WGMMA_RS_M64N128K16(wgmma_rs_m64n128k16_bf16, bf16)
// clang-format on
#endif  // FDPP_WGMMA

// S += Q K^T for one k16 slice (both operands K-major in shared memory), 64 rows x 64 keys per warpgroup.
template <typename T>
__device__ __forceinline__ void wgmma_qk(float (&s)[8][4], uint64_t desc_q, uint64_t desc_k) {
#if FDPP_WGMMA
  if constexpr (std::is_same_v<T, __half>) wgmma_ss_m64n64k16_f16(s, desc_q, desc_k);
  else wgmma_ss_m64n64k16_bf16(s, desc_q, desc_k);
#endif
}
// O += P V for 16 keys: P from registers (the m16n8k16 A fragment), V MN-major in shared memory.
template <typename T, int D>
__device__ __forceinline__ void wgmma_pv(float (&o)[D / 8][4], const uint32_t (&p)[4], uint64_t desc_v) {
#if FDPP_WGMMA
  if constexpr (D == 128) {
    if constexpr (std::is_same_v<T, __half>) wgmma_rs_m64n128k16_f16(o, p, desc_v);
    else wgmma_rs_m64n128k16_bf16(o, p, desc_v);
  } else {
    if constexpr (std::is_same_v<T, __half>) wgmma_rs_m64n64k16_f16(o, p, desc_v);
    else wgmma_rs_m64n64k16_bf16(o, p, desc_v);
  }
#endif
}

}  // namespace attn
}  // namespace fdpp
