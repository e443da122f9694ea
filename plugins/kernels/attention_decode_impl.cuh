// The decode launcher template, instantiated once per element type (attention_decode_f16.cu, _bf16.cu).
#pragma once

#include <atomic>

#include "kernels/attention_decode.cuh"
#include "kernels/attention_launch.h"

namespace fdpp {
namespace attn {

template <typename T, int D, bool kUnified>
cudaError_t launch_decode_impl(const AttnArgs& a, bool use_pdl, cudaStream_t stream) {
  using Tr = DecodeTraits<D>;
  constexpr auto split = decode_split_kernel<T, D, kUnified>;
  cudaError_t err = allow_smem<split>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(a.num_splits, a.num_kv_heads * a.row_blocks, a.batch);
  split<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.num_splits == 1) return err;  // one split: the split kernel wrote the output

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(a.batch * a.num_heads * a.seq);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = use_pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, decode_combine_kernel<T, D, kUnified>, a);
}

template <typename T>
cudaError_t launch_decode(const AttnArgs& a, bool unified, bool use_pdl, cudaStream_t stream) {
  if (a.head_dim == 128)
    return unified ? launch_decode_impl<T, 128, true>(a, use_pdl, stream)
                   : launch_decode_impl<T, 128, false>(a, use_pdl, stream);
  if (a.head_dim == 64)
    return unified ? launch_decode_impl<T, 64, true>(a, use_pdl, stream)
                   : launch_decode_impl<T, 64, false>(a, use_pdl, stream);
  return cudaErrorInvalidValue;
}

template <typename T, int D>
cudaError_t ctas_per_sm_impl(int* ctas) {
  using Tr = DecodeTraits<D>;
  constexpr auto split = decode_split_kernel<T, D, true>;
  cudaError_t err = allow_smem<split>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, split, Tr::kThreads, Tr::kSmemBytes);
}

template <typename T>
cudaError_t decode_ctas_per_sm(int head_dim, int* ctas) {
  static std::atomic<int> cached[2][64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::atomic<int>& slot = cached[head_dim == 128][device & 63];
  if (int v = slot.load(std::memory_order_relaxed)) {
    *ctas = v;
    return cudaSuccess;
  }
  err = head_dim == 128 ? ctas_per_sm_impl<T, 128>(ctas) : ctas_per_sm_impl<T, 64>(ctas);
  if (err != cudaSuccess) return err;
  if (*ctas < 1) *ctas = 1;
  slot.store(*ctas, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace attn
}  // namespace fdpp
