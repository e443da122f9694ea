// RMSNorm, one CTA per row: each thread loads its 16-byte vectors of x once into registers, the CTA adds the
// squares in float32 (warp shuffles, then one value per warp through shared memory), and each thread writes its
// vectors scaled. Rounding as the exported graph: normed = to_dtype(x / sqrt(mean + eps)) with an IEEE division
// and square root, then y = to_dtype(float(normed) * float(weight)). E.g. H = 4096 float16: 512 vectors, 512
// threads of one vector each; H = 576: 72 vectors, 96 threads (the last 24 idle).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/pdl.cuh"
#include "kernels/norm/rms_norm.h"

namespace fdpp {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kWarp = 32;

template <typename T>
struct Convert;
template <>
struct Convert<float> {
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
};
template <>
struct Convert<__half> {
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

// Sum of v over the CTA, returned to every thread (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
  __shared__ float partial[kMaxThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  float total = lane < warps ? partial[lane] : 0.f;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(const RmsNormParams p) {
  using C = Convert<T>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kMaxVecs = kRmsNormMaxHidden / kVec / kMaxThreads;  // vectors a thread may hold
  const int vecs = p.hidden / kVec;
  const int64_t row = blockIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + row * p.x_row_stride);
  const uint4* w = reinterpret_cast<const uint4*>(p.weight);
  uint4* y = reinterpret_cast<uint4*>(static_cast<T*>(p.y) + row * p.y_row_stride);

  // Launched with PDL (on sm_90a) this CTA may start before the kernel writing x ends. The weight is a constant
  // (the GEMMs' rule, gemm.h Problem::pdl): its loads go out first, so that their latency is behind the wait and
  // not after the reduction. Then wait for x's writer, and let the next kernel (a GEMM, which streams its constant
  // weight before it waits for y) start.
  uint4 weight[kMaxVecs];
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    if (v < vecs) weight[j] = w[v];
  }
  pdl::wait_for_primary();
  pdl::launch_dependents();
  uint4 held[kMaxVecs];
  float squares = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    if (v < vecs) {
      held[j] = x[v];
      const T* e = reinterpret_cast<const T*>(&held[j]);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float f = C::to_float(e[k]);
        squares += f * f;
      }
    }
  }
  const float rms = sqrtf(block_sum(squares) / static_cast<float>(p.hidden) + p.epsilon);
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    if (v < vecs) {
      const T* e = reinterpret_cast<const T*>(&held[j]);
      const T* we = reinterpret_cast<const T*>(&weight[j]);
      uint4 out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float normed = C::to_float(C::from_float(C::to_float(e[k]) / rms));
        o[k] = C::from_float(normed * C::to_float(we[k]));
      }
      y[v] = out;
    }
  }
}

template <typename T>
cudaError_t launch(const RmsNormParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int vecs = p.hidden / kVec;
  const int rounded = (vecs + kWarp - 1) / kWarp * kWarp;
  const int threads = rounded < kMaxThreads ? rounded : kMaxThreads;
  bool pdl = false;
  const cudaError_t err = pdl::runs_sm90a_code(&pdl);
  if (err != cudaSuccess) return err;
  return pdl::launch(rms_norm_kernel<T>, dim3(static_cast<unsigned>(p.rows)), dim3(threads), stream, pdl, p);
}

}  // namespace

cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  switch (p.dtype) {
    case NormDtype::kFloat16: return launch<__half>(p, stream);
    case NormDtype::kBFloat16: return launch<__nv_bfloat16>(p, stream);
    case NormDtype::kFloat32: return launch<float>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fdpp
