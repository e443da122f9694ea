// Launchers of the attention kernels per element type (instantiated in attention_decode_*.cu and
// attention_prefill_*.cu so that the heavy kernels compile in parallel). Internal to plugins/kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace fdpp {
namespace attn {

struct AttnArgs;

// Per-device facts the planners need, read once per device (host calls, no stream work).
struct DeviceInfo {
  int num_sms = 0;
  int major = 0;
};
cudaError_t device_info(DeviceInfo* info);

// CTAs of the decode split kernel resident per SM for this head_dim (the occupancy API; cached per device).
template <typename T>
cudaError_t decode_ctas_per_sm(int head_dim, int* ctas);

// CTAs of the decode split kernel resident at once when launched in clusters of `splits` (2 to 8) with the cluster
// combine's shared memory (the occupancy API; cached per device).
template <typename T>
cudaError_t decode_cluster_capacity(int head_dim, int splits, int* ctas);

// Raises kernel's dynamic shared-memory limit once per device (a host call, no stream work; harmless if repeated,
// so the race of two threads doing it at once is benign).
template <auto kernel>
cudaError_t allow_smem(int bytes) {
  static std::atomic<unsigned long long> done_mask{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = 1ull << (device & 63);
  if (done_mask.load(std::memory_order_relaxed) & bit) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done_mask.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

template <typename T>
cudaError_t launch_decode(const AttnArgs& a, bool unified, bool pdl, cudaStream_t stream);

template <typename T>
cudaError_t launch_prefill(const AttnArgs& a, bool unified, cudaStream_t stream);

// Whether the wgmma prefill (tile shape 4) runs here: the loaded binary holds its sm_90a code (host query, cached
// per device).
template <typename T>
cudaError_t prefill_sm90_available(int head_dim, bool* available);

}  // namespace attn
}  // namespace fdpp
