// The portability layer of the portable kernels (plugins/kernels/portable/): one source that nvcc compiles for
// NVIDIA GPUs (into libfdpp_plugins.so) and hipcc for AMD GPUs (into libfdpp_plugins_hip.so, -DFDPP_HIP=ON).
//
// What differs between the two and is named here once:
//   runtime      cudaError_t / hipError_t, cudaStream_t / hipStream_t, the device queries
//   warp         32 lanes on NVIDIA, a 64-lane wavefront on AMD CDNA (gfx90a, gfx908): kWarpSize; shuffles
//                over the whole warp (__shfl_xor_sync with a full mask / __shfl_xor)
//   half types   fp16 through each runtime's __half conversions; bfloat16 as raw bits, converted here
// The kernels use plain CUDA-core arithmetic only: no tensor-core, TMA, cp.async or MFMA code belongs in the
// portable files (the architecture-specific kernels live in plugins/kernels/attention/ and gemm/).
#pragma once

#include <stddef.h>
#include <stdint.h>

// FDPP_DEVICE_CODE: a kernel compiler (nvcc, hipcc -x hip) reads this; host-only files (the C ABI, the MIGraphX
// adapter) see just the runtime types.
#if defined(__CUDACC__) || defined(__HIP__)
#define FDPP_DEVICE_CODE 1
#endif
// FDPP_PORT_HIP: the AMD side. hipcc defines __HIP__ (its hip_common.h adds __HIP_PLATFORM_AMD__ only later).
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#define FDPP_PORT_HIP 1
#endif

#ifdef FDPP_PORT_HIP
#include <hip/hip_runtime_api.h>
#ifdef FDPP_DEVICE_CODE
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#endif
#else
#include <cuda_runtime_api.h>
#ifdef FDPP_DEVICE_CODE
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#endif

namespace fdpp {
namespace port {

#ifdef FDPP_PORT_HIP
using Error = hipError_t;
using Stream = hipStream_t;
constexpr Error kSuccess = hipSuccess;
constexpr Error kInvalidValue = hipErrorInvalidValue;
// The kernels are written for 64-lane wavefronts (CDNA). An RDNA target (wave32) must not build them silently.
constexpr int kWarpSize = 64;
#if defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != 64
#error "the portable kernels are built for 64-lane wavefronts; build for a CDNA target such as gfx90a"
#endif
inline Error last_launch_error() { return hipGetLastError(); }
inline const char* error_string(Error e) { return hipGetErrorString(e); }
inline Error multiprocessor_count(int* count) {
  int device = 0;
  Error err = hipGetDevice(&device);
  if (err != kSuccess) return err;
  return hipDeviceGetAttribute(count, hipDeviceAttributeMultiprocessorCount, device);
}
#ifdef FDPP_DEVICE_CODE
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return __shfl_xor(v, lane_mask); }
#endif
#else
using Error = cudaError_t;
using Stream = cudaStream_t;
constexpr Error kSuccess = cudaSuccess;
constexpr Error kInvalidValue = cudaErrorInvalidValue;
constexpr int kWarpSize = 32;
inline Error last_launch_error() { return cudaGetLastError(); }
inline const char* error_string(Error e) { return cudaGetErrorString(e); }
inline Error multiprocessor_count(int* count) {
  int device = 0;
  Error err = cudaGetDevice(&device);
  if (err != kSuccess) return err;
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}
#ifdef FDPP_DEVICE_CODE
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
#endif
#endif

#ifdef FDPP_DEVICE_CODE

// Element types as tags: the storage the kernels load (16 bytes at a time) and the conversions to float.
struct F16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ uint16_t from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct BF16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
  // Round to nearest even; NaN stays a (quiet) NaN.
  static __device__ __forceinline__ uint16_t from_float(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};
struct F32 {
  using Storage = float;
  static __device__ __forceinline__ float to_float(float f) { return f; }
  static __device__ __forceinline__ float from_float(float f) { return f; }
};

// Loads 8 consecutive elements (16 bytes of a 2-byte type, 32 of float; the address aligned to that) as floats.
template <typename E>
__device__ __forceinline__ void load8(const typename E::Storage* p, float (&f)[8]) {
  if constexpr (sizeof(typename E::Storage) == 2) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = E::to_float(uint16_t(w[i] & 0xffffu));
      f[2 * i + 1] = E::to_float(uint16_t(w[i] >> 16));
    }
  } else {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}

constexpr float kInf = __builtin_huge_valf();
#endif  // FDPP_DEVICE_CODE

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace port
}  // namespace fdpp
