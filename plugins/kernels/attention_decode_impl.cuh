// The decode launcher template, instantiated once per element type (attention_decode_f16.cu, _bf16.cu).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/attention_decode.cuh"
#include "kernels/attention_launch.h"

namespace fdpp {
namespace attn {

// Programmatic dependent launch for the decode kernels, on by default where the launcher allows it (sm_90+): the
// split grid becomes resident and prefetches its first K/V tiles into L2 while the kernel before it finishes, and
// the combine grid is resident before the split grid ends. FDPP_ATTENTION_PDL=0 turns it off for both (an A/B
// switch, as FDPP_GEMM_PDL is for the GEMMs). Read once per process.
inline bool attention_pdl_allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("FDPP_ATTENTION_PDL");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return allowed;
}

// kernel<<<grid, threads, smem, stream>>>(a), with programmatic stream serialization when `pdl`.
template <typename Kernel>
cudaError_t launch_decode_kernel(Kernel kernel, dim3 grid, int threads, int smem, bool pdl, cudaStream_t stream,
                                 const AttnArgs& a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

template <typename T, int D, bool kUnified>
cudaError_t launch_decode_impl(const AttnArgs& a, bool use_pdl, cudaStream_t stream) {
  using Tr = DecodeTraits<D>;
  constexpr auto split = decode_split_kernel<T, D, kUnified>;
  cudaError_t err = allow_smem<split>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const bool pdl = use_pdl && attention_pdl_allowed();
  const dim3 grid(a.num_splits, a.num_kv_heads * a.row_blocks, a.batch);
  err = launch_decode_kernel(split, grid, Tr::kThreads, Tr::kSmemBytes, pdl, stream, a);
  if (err != cudaSuccess || a.num_splits == 1) return err;  // one split: the split kernel wrote the output
  return launch_decode_kernel(decode_combine_kernel<T, D, kUnified>, dim3(a.batch * a.num_heads * a.seq), 128, 0,
                              pdl, stream, a);
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
