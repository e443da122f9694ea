// Device helpers shared by the GEMM implementations: element types, 16-byte loads, cp.async, the m16n8k16 MMA
// and the epilogue math. Included only by gemm_*.cu.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/common/pdl.cuh"
#include "kernels/gemm/gemm.h"

namespace fdpp {
namespace gemm {
namespace detail {

// ---- element types ----------------------------------------------------------------------------------------
template <typename T>
struct Elem;

template <>
struct Elem<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ float2 to_float2(uint32_t bits) {
    __half2 h = *reinterpret_cast<__half2*>(&bits);
    return __half22float2(h);
  }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

template <>
struct Elem<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_float2(uint32_t bits) {
    __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&bits);
    return __bfloat1622float2(h);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

// ---- loads -------------------------------------------------------------------------------------------------
// The weight is read exactly once: keep it out of L1 and ask L2 to fetch 256 B around each access so DRAM sees
// long bursts.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Activations are small and re-read by every CTA: the ordinary read-only path, cached in L1.
__device__ __forceinline__ uint4 ld_cached16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; writes zeros (and reads nothing) when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// The same through L1 (.ca): for data every warp of the SM reads (the activations).
__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// From L2 without an L1 allocation and without a prefetch hint (the rows and pair kernels: their weight bytes are
// read once, so a prefetch of the next 256 bytes only adds traffic).
__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// An L2 policy for data read once per launch (the weights): evicted first, so that it does not push out what other
// CTAs or the next kernel read again (the activations, the KV cache).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp_async16_l2 under an L2 cache policy.
__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// wait_group takes an immediate: dispatch a run-time pipeline depth (uniform across the warp) to it.
__device__ __forceinline__ void cp_async_wait_dynamic(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

__device__ __forceinline__ uint4 lds16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// ---- programmatic dependent launch (sm_90) ------------------------------------------------------------------
// The weight is a constant, so a GEMM may start streaming it while the kernel before it (which produces X)
// is still finishing: let the next grid launch early, and wait for the previous grid only before touching X,
// the residual or Y. Both are no-ops when the launch did not ask for programmatic serialization.
__device__ __forceinline__ void pdl_launch_dependents() { pdl::launch_dependents(); }
__device__ __forceinline__ void pdl_wait_for_previous_grid() { pdl::wait_for_primary(); }

// ---- tensor cores ----------------------------------------------------------------------------------------------
// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulators. Fragment ownership (lane = 4 * g + t):
//   a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]
//   b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   c0, c1 = D[g][2t], D[g][2t+1];  c2, c3 = D[g+8][2t], D[g+8][2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- epilogue math -----------------------------------------------------------------------------------------
__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

template <typename T>
__device__ __forceinline__ float load_float(const void* base, int64_t index) {
  return Elem<T>::to_float(reinterpret_cast<const T*>(base)[index]);
}

template <typename T>
__device__ __forceinline__ void store_float(void* base, int64_t index, float v) {
  reinterpret_cast<T*>(base)[index] = Elem<T>::from_float(v);
}

// ---- ImplB tiles ---------------------------------------------------------------------------------------------
// The two weight rows lane (g = lane / 4) holds for one 16-row block: rows g and g + 8 of the block; with
// silu_mul, gate row block * 8 + g and its up row n/2 + block * 8 + g, so both halves of the activation end up
// in the same lane's accumulators.
struct LaneRows {
  int row0, row1;
  bool ok0, ok1;
  __device__ __forceinline__ LaneRows(int n, int silu, int block, int g) {
    if (silu) {
      row0 = block * 8 + g;
      row1 = (n >> 1) + row0;
      ok0 = ok1 = row0 < (n >> 1);
    } else {
      row0 = block * 16 + g;
      row1 = row0 + 8;
      ok0 = row0 < n;
      ok1 = row1 < n;
    }
  }
};

// Bias, SiLU(gate) * up and residual on one lane's accumulators of a 16-row block, then the store.
// acc[nb][q] is (row0, batch nb*8 + 2t + q); acc[nb][2 + q] is (row1, the same batch row).
template <typename T, int NB>
__device__ __forceinline__ void store_block(const float (&acc)[NB][4], const LaneRows& r, int t, int m, int n, int silu,
                                            const void* bias, const void* residual, void* y) {
  const int half_n = n >> 1;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int mrow = nb * 8 + 2 * t + q;
      if (mrow >= m || !r.ok0) continue;
      float v0 = acc[nb][q];
      float v1 = acc[nb][2 + q];
      if (silu) {
        if (bias) {
          v0 += load_float<T>(bias, r.row0);
          v1 += load_float<T>(bias, r.row1);
        }
        float out = detail::silu(v0) * v1;
        const int64_t idx = int64_t(mrow) * half_n + r.row0;
        if (residual) out += load_float<T>(residual, idx);
        store_float<T>(y, idx, out);
      } else {
        const int64_t idx0 = int64_t(mrow) * n + r.row0;
        if (bias) v0 += load_float<T>(bias, r.row0);
        if (residual) v0 += load_float<T>(residual, idx0);
        store_float<T>(y, idx0, v0);
        if (r.ok1) {
          const int64_t idx1 = int64_t(mrow) * n + r.row1;
          if (bias) v1 += load_float<T>(bias, r.row1);
          if (residual) v1 += load_float<T>(residual, idx1);
          store_float<T>(y, idx1, v1);
        }
      }
    }
  }
}

// The end of a 16-row block whose K range `Warps` warps shared (the 1024-column ImplB kernels): each warp's sums
// into part[warp], a barrier of those warps (named barrier 1, so a producer warp outside them is not waited for),
// warp 0 adds the others' sums, applies the epilogue and stores; every warp's sums are zeroed for the next block.
// A warp may reach the next block's end before warp 0 has read this one: the caller double-buffers part by block
// parity, or holds every warp at a barrier after this call.
template <typename T, int NB, int Warps, typename Params>
__device__ __forceinline__ void finish_block(float (&acc)[NB][4], float (&part)[Warps][NB * 4][32], int warp, int lane,
                                             int block, const Params& p) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int q = 0; q < 4; ++q) part[warp][nb * 4 + q][lane] = acc[nb][q];
  asm volatile("bar.sync 1, %0;\n" ::"n"(Warps * 32) : "memory");
  if (warp == 0) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int other = 1; other < Warps; ++other) acc[nb][q] += part[other][nb * 4 + q][lane];
    store_block<T, NB>(acc, LaneRows(p.n, p.silu, block, lane >> 2), lane & 3, p.m, p.n, p.silu, p.bias, p.residual,
                       p.y);
  }
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
}

// The problem as a kernel sees it: a kernel parameter struct may derive from it (fill_problem fills it).
struct KernelProblem {
  const void* x;
  const void* w;
  const void* bias;
  const void* residual;
  void* y;
  int m, n, k;
  int silu;  // rows come in (gate, up) pairs and the output is n / 2 wide
};

// The problem's pointers, sizes and epilogue into a kernel parameter struct that has these fields (host code).
template <typename Params>
void fill_problem(Params& params, const Problem& p) {
  params.x = p.x;
  params.w = p.w;
  params.bias = p.bias;
  params.residual = p.residual;
  params.y = p.y;
  params.m = int(p.m);
  params.n = int(p.n);
  params.k = int(p.k);
  params.silu = p.silu_mul() ? 1 : 0;
}

// Where and how a launcher launches: the stream, and whether with programmatic dependent launch (the problem's
// pdl on a GPU that runs the sm_90a code, hopper_paths).
struct Launch {
  cudaStream_t stream;
  bool pdl;
};

// Launches kernel<<<grid, block, smem, stream>>>(params...) as a cluster of cluster_x CTAs along x (when > 1) and,
// when launch.pdl, with programmatic stream serialization (see pdl_* above).
template <typename... Declared, typename... Params>
cudaError_t launch_kernel(void (*kernel)(Declared...), unsigned grid, unsigned block, size_t smem, const Launch& launch,
                          int cluster_x, const Params&... params) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = unsigned(cluster_x);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (launch.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = launch.stream;
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, params...);
}

// A tensor map over 16-bit elements of dtype (rank 2 or 3; dims, strides and box as cuTensorMapEncodeTiled takes
// them) with the 128-byte swizzle, zero fill out of bounds and 256-byte L2 promotion. Host only, no GPU work;
// cudaErrorNotSupported (with a detail message) when the driver lacks the function, cudaErrorInvalidValue when it
// refuses the map (the caller names what it was). Defined in gemm_implb_bulk.cu.
cudaError_t encode_tile_map(CUtensorMap* map, Dtype dtype, int rank, const void* base, const cuuint64_t* dims,
                            const cuuint64_t* strides, const cuuint32_t* box);

}  // namespace detail
}  // namespace gemm
}  // namespace fdpp
