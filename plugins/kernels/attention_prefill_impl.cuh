// The prefill launcher template, instantiated once per element type (attention_prefill_f16.cu, _bf16.cu).
#pragma once

#include "kernels/attention_launch.h"
#include "kernels/attention_prefill.cuh"

namespace fdpp {
namespace attn {

template <typename T, int D, bool kUnified>
cudaError_t launch_prefill_impl(const AttnArgs& a, cudaStream_t stream) {
  using Tr = PrefillTraits<D>;
  constexpr auto kernel = prefill_kernel<T, D, kUnified>;
  const cudaError_t err = allow_smem<kernel>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(a.batch * a.num_heads, (a.seq + Tr::kBlockM - 1) / Tr::kBlockM);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_prefill(const AttnArgs& a, bool unified, cudaStream_t stream) {
  if (a.head_dim == 128)
    return unified ? launch_prefill_impl<T, 128, true>(a, stream) : launch_prefill_impl<T, 128, false>(a, stream);
  if (a.head_dim == 64)
    return unified ? launch_prefill_impl<T, 64, true>(a, stream) : launch_prefill_impl<T, 64, false>(a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace attn
}  // namespace fdpp
