#include "kernels/axpy.h"

namespace fdpp {
namespace {

__global__ void axpy_f32_kernel(float a, const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a * x[i] + y[i];
}

}  // namespace

cudaError_t launch_axpy_f32(float a, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  axpy_f32_kernel<<<int(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(a, x, y, n);
  return cudaGetLastError();
}

}  // namespace fdpp
