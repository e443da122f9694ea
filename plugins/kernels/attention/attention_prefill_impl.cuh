// The prefill launcher templates: per element type and head_dim (launch_prefill_dim, instantiated for 64 and 128 in
// attention_prefill_f16.cu / _bf16.cu and for 256 in attention_prefill_d256.cu), and the dispatch over head_dim
// (launch_prefill, per element type).
#pragma once

#include <atomic>

#include "kernels/attention/attention_launch.h"
#include "kernels/attention/attention_prefill.cuh"
#include "kernels/attention/attention_prefill_grid.cuh"
#include "kernels/attention/attention_prefill_sm90.cuh"

namespace fdpp {
namespace attn {

template <typename T, int D, bool kUnified, int kStepN, int kRowsPerWarp>
cudaError_t launch_prefill_impl(const AttnArgs& a, cudaStream_t stream) {
  return launch_prefill_grid<prefill_kernel<T, D, kUnified, kStepN, kRowsPerWarp>,
                             PrefillTraits<D, kStepN, kRowsPerWarp>>(a, stream);
}

// Tile shape 4, the wgmma kernel: only where the loaded binary holds its sm_90a code (on other GPUs, or a library
// built without 90a, the kernel body is empty and the launch is refused instead).
template <typename T, int D, bool kUnified>
cudaError_t launch_prefill_sm90_impl(const AttnArgs& a, cudaStream_t stream) {
  bool present = false;
  cudaError_t err = sm90_binary_present<prefill_sm90_kernel<T, D, false>>(&present);
  if (err != cudaSuccess) return err;
  if (!present) return cudaErrorNotSupported;
  // The plan's synchronized prefill without soft cap or window: the kernel without them (at head_dim 64 two CTAs
  // per SM, not one; at 128 the code the H200 measured before the extras).
  if constexpr (!kUnified) {
    if (a.softcap_log2 == 0.f && a.window == 0)
      return launch_prefill_grid<prefill_sm90_kernel<T, D, false, false>, PrefillSm90Traits<D>>(a, stream);
  }
  return launch_prefill_grid<prefill_sm90_kernel<T, D, kUnified>, PrefillSm90Traits<D>>(a, stream);
}

// Tile shapes (a.prefill_config; the plan's choice in attention_forward, attention_launch.cu):
//   1: 128 query rows (32 per warp) in 32-key steps. (Not 64-key steps: they read Q from shared memory half as
//      often but spill at head_dim 128, which costs what they save: docs/notes-attention.md.)
//   2: 64 query rows (16 per warp) in 64-key steps: half the work per CTA, for grids too small to balance.
//   4: Hopper only: 128 query rows per CTA on warpgroup MMAs with a producer warp (attention_prefill_sm90.cuh).
template <typename T, int D, int kStepN, int kRowsPerWarp>
cudaError_t launch_prefill_cfg(const AttnArgs& a, bool unified, cudaStream_t stream) {
  return unified ? launch_prefill_impl<T, D, true, kStepN, kRowsPerWarp>(a, stream)
                 : launch_prefill_impl<T, D, false, kStepN, kRowsPerWarp>(a, stream);
}

template <typename T, int D>
cudaError_t launch_prefill_dim(const AttnArgs& a, bool unified, cudaStream_t stream) {
  if constexpr (D == 256) {  // 64-row blocks on mma.sync only (PrefillTraits; the wgmma kernel is built for 64, 128)
    return a.prefill_config == 2 ? launch_prefill_cfg<T, D, 64, 16>(a, unified, stream) : cudaErrorNotSupported;
  } else {
    switch (a.prefill_config) {
      case 1: return launch_prefill_cfg<T, D, 32, 32>(a, unified, stream);
      case 2: return launch_prefill_cfg<T, D, 64, 16>(a, unified, stream);
      case 4:
        return unified ? launch_prefill_sm90_impl<T, D, true>(a, stream)
                       : launch_prefill_sm90_impl<T, D, false>(a, stream);
      default: return cudaErrorInvalidValue;
    }
  }
}

template <typename T>
cudaError_t launch_prefill(const AttnArgs& a, bool unified, cudaStream_t stream) {
  switch (kernel_head_dim(a.head_dim)) {  // 80 and 96 run in the 128 kernels
    case 64: return launch_prefill_dim<T, 64>(a, unified, stream);
    case 128: return launch_prefill_dim<T, 128>(a, unified, stream);
    case 256: return launch_prefill_dim<T, 256>(a, unified, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t prefill_sm90_available(int head_dim, bool* available) {
  const int d = kernel_head_dim(head_dim);  // 256: the mma.sync kernel only
  if (d == 128) return sm90_binary_present<prefill_sm90_kernel<T, 128, false>>(available);
  if (d == 64) return sm90_binary_present<prefill_sm90_kernel<T, 64, false>>(available);
  *available = false;
  return cudaSuccess;
}

}  // namespace attn
}  // namespace fdpp
