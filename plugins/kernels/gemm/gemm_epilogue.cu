// The elementwise epilogue pass after ImplC (cuBLASLt / CUTLASS), for what those libraries do not fuse:
// silu_mul (d [m, n] -> y [m, n/2]) with bias and residual, or a bias added in place.
// ImplA and ImplB apply their epilogues from registers and never use this.
// With programmatic dependent launch (the problem's pdl, on sm_90a) the pass waits for the GEMM before it and then
// lets the next kernel start, so that a following GEMM streams its weights while this pass runs; the library GEMM
// before it is launched by cuBLASLt or CUTLASS, which take no launch attributes from us, so that boundary stays.
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

// V consecutive outputs per thread: 8 (16-byte loads and stores) where every row and pointer allows, else 1:
// the scalar form pays a 64-bit division per element, which dominates this memory-bound pass (docs/notes-gemm.md).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__global__ void gemm_epilogue_kernel(const T* d,  // may alias y (in-place bias)
                                     const T* __restrict__ bias, const T* __restrict__ residual, T* y, int64_t m,
                                     int64_t n, int silu) {
  using P = Pack<T, V>;
  using E = detail::Elem<T>;
  const int64_t n_out = silu ? n / 2 : n;
  const int64_t packs_per_row = n_out / V;
  const int64_t total = m * packs_per_row;
  // d, the residual and y belong to kernels before this one (and y to the next): nothing is touched before the wait.
  detail::pdl_wait_for_previous_grid();
  detail::pdl_launch_dependents();
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / packs_per_row;
    const int64_t col = (idx - row * packs_per_row) * V;
    const P first = *reinterpret_cast<const P*>(d + row * n + col);
    P second{}, b0{}, b1{}, res{}, out;
    if (silu) second = *reinterpret_cast<const P*>(d + row * n + n_out + col);
    if (bias) {
      b0 = *reinterpret_cast<const P*>(bias + col);
      if (silu) b1 = *reinterpret_cast<const P*>(bias + n_out + col);
    }
    if (residual) res = *reinterpret_cast<const P*>(residual + row * n_out + col);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float value = E::to_float(first.v[j]) + (bias ? E::to_float(b0.v[j]) : 0.0f);
      if (silu) value = detail::silu(value) * (E::to_float(second.v[j]) + (bias ? E::to_float(b1.v[j]) : 0.0f));
      if (residual) value += E::to_float(res.v[j]);
      out.v[j] = E::from_float(value);
    }
    *reinterpret_cast<P*>(y + row * n_out + col) = out;
  }
}

template <typename T, int V>
cudaError_t launch_typed(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n, int silu,
                         bool pdl, cudaStream_t stream) {
  const int64_t total = m * (silu ? n / 2 : n) / V;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 65535) blocks = 65535;
  return pdl::launch(gemm_epilogue_kernel<T, V>, dim3(unsigned(blocks)), dim3(kThreads), stream, pdl,
                     static_cast<const T*>(d), static_cast<const T*>(bias), static_cast<const T*>(residual),
                     static_cast<T*>(y), m, n, silu);
}

template <typename T>
cudaError_t launch_typed(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n, int silu,
                         bool pdl, cudaStream_t stream) {
  constexpr int kVec = 8;
  const int64_t n_out = silu ? n / 2 : n;
  bool packed = n_out % kVec == 0;
  for (const void* ptr : {d, bias, residual, static_cast<const void*>(y)})
    packed = packed && reinterpret_cast<uintptr_t>(ptr) % (sizeof(T) * kVec) == 0;  // nullptr passes
  return packed ? launch_typed<T, kVec>(d, bias, residual, y, m, n, silu, pdl, stream)
                : launch_typed<T, 1>(d, bias, residual, y, m, n, silu, pdl, stream);
}

}  // namespace

cudaError_t launch_gemm_epilogue(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n,
                                 Epilogue epilogue, Dtype dtype, bool pdl, cudaStream_t stream) {
  const int silu = epilogue == Epilogue::kSiluMul ? 1 : 0;
  bool sm90a = false;
  const cudaError_t err = pdl ? pdl::runs_sm90a_code(&sm90a) : cudaSuccess;
  if (err != cudaSuccess) return err;
  pdl = pdl && sm90a;
  if (dtype == Dtype::kBFloat16) return launch_typed<__nv_bfloat16>(d, bias, residual, y, m, n, silu, pdl, stream);
  return launch_typed<__half>(d, bias, residual, y, m, n, silu, pdl, stream);
}

}  // namespace gemm
}  // namespace fdpp
