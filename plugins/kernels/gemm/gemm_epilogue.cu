// The elementwise epilogue pass after ImplC (cuBLASLt / CUTLASS), for what those libraries do not fuse:
// silu_mul (d [m, n] -> y [m, n/2]) with bias and residual, or a bias added in place.
// ImplA and ImplB apply their epilogues from registers and never use this.
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

template <typename T>
__global__ void gemm_epilogue_kernel(const T* d,  // may alias y (in-place bias)
                                     const T* __restrict__ bias, const T* __restrict__ residual, T* y, int64_t m,
                                     int64_t n, int silu) {
  const int64_t n_out = silu ? n / 2 : n;
  const int64_t total = m * n_out;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / n_out;
    const int64_t col = idx - row * n_out;
    float out;
    if (silu) {
      float gate = detail::Elem<T>::to_float(d[row * n + col]);
      float up = detail::Elem<T>::to_float(d[row * n + n_out + col]);
      if (bias) {
        gate += detail::Elem<T>::to_float(bias[col]);
        up += detail::Elem<T>::to_float(bias[n_out + col]);
      }
      out = detail::silu(gate) * up;
    } else {
      out = detail::Elem<T>::to_float(d[row * n + col]);
      if (bias) out += detail::Elem<T>::to_float(bias[col]);
    }
    if (residual) out += detail::Elem<T>::to_float(residual[idx]);
    y[idx] = detail::Elem<T>::from_float(out);
  }
}

template <typename T>
cudaError_t launch_typed(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n, int silu,
                         cudaStream_t stream) {
  const int64_t total = m * (silu ? n / 2 : n);
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 65535) blocks = 65535;
  gemm_epilogue_kernel<T>
      <<<unsigned(blocks), kThreads, 0, stream>>>(static_cast<const T*>(d), static_cast<const T*>(bias),
                                                  static_cast<const T*>(residual), static_cast<T*>(y), m, n, silu);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gemm_epilogue(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n,
                                 Epilogue epilogue, Dtype dtype, cudaStream_t stream) {
  const int silu = epilogue == Epilogue::kSiluMul ? 1 : 0;
  if (dtype == Dtype::kBFloat16) return launch_typed<__nv_bfloat16>(d, bias, residual, y, m, n, silu, stream);
  return launch_typed<__half>(d, bias, residual, y, m, n, silu, stream);
}

}  // namespace gemm
}  // namespace fdpp
