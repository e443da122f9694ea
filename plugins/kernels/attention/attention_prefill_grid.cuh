// The prefill kernels' grid launch, shared by every tile shape: (batch x heads, query blocks), with the resident
// CTA count each kernel's work order reads. Host code, CUDA-graph safe after the first call (cached queries).
#pragma once

#include <atomic>

#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_launch.h"

namespace fdpp {
namespace attn {

// Launches a prefill kernel (traits Tr: threads, shared memory, query rows per block) over (batch x heads, query
// blocks), with the number of CTAs resident on the whole GPU that its work order needs (host queries, cached per
// instantiation and device). `lead`: kernel parameters before the AttnArgs (shape 5's tensor maps).
template <auto kernel, typename Tr, typename... Lead>
cudaError_t launch_prefill_grid(const AttnArgs& args, cudaStream_t stream, const Lead&... lead) {
  static std::atomic<int> cached[64] = {};
  cudaError_t err = allow_smem<kernel>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  int device = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  AttnArgs a = args;
  a.prefill_slots = cached[device & 63].load(std::memory_order_relaxed);
  if (a.prefill_slots == 0) {
    int per_sm = 0, sms = 0;
    if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, Tr::kSmemBytes)) !=
        cudaSuccess)
      return err;
    if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
    a.prefill_slots = (per_sm > 0 ? per_sm : 1) * sms;
    cached[device & 63].store(a.prefill_slots, std::memory_order_relaxed);
  }
  const dim3 grid(a.batch * a.num_heads, (a.seq + Tr::kBlockM - 1) / Tr::kBlockM);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(lead..., a);
  return cudaGetLastError();
}

}  // namespace attn
}  // namespace fdpp
