// The decode launcher templates: per element type and head_dim (launch_decode_dim, instantiated for 64 and 128 in
// attention_decode_f16.cu / _bf16.cu and for 256 in attention_decode_d256.cu, so that the heavy kernels compile in
// parallel), and the dispatch over head_dim (launch_decode, instantiated per element type).
#pragma once

#include <atomic>

#include "kernels/attention/attention_decode.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_launch.h"

namespace fdpp {
namespace attn {

// kernel<<<grid, threads, smem, stream>>>(a), with programmatic stream serialization when `pdl`, in thread block
// clusters of `cluster` CTAs along x when cluster > 1.
template <typename Kernel>
cudaError_t launch_decode_kernel(Kernel kernel, dim3 grid, int threads, int smem, bool pdl, cudaStream_t stream,
                                 const AttnArgs& a, int cluster = 1) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

// The split kernel's dynamic shared memory in a cluster launch: padded so that only one CTA fits an SM (two need
// more than the SM's 228 KB), which keeps the CTAs of a cluster on different SMs (see cluster_combine_ok).
template <int D>
constexpr int cluster_smem_bytes() {
  return DecodeTraits<D>::kSmemBytes > 116 * 1024 ? DecodeTraits<D>::kSmemBytes : 116 * 1024;
}

template <typename T, int D, bool kUnified, int Stages>
cudaError_t launch_split(const AttnArgs& a, bool pdl, cudaStream_t stream) {
  using Tr = DecodeTraits<D, Stages>;
  constexpr auto split = decode_split_kernel<T, D, kUnified, Stages>;
  // The cluster combine runs only the 3-stage kernel: its receive area is sized for 7 partials there.
  if (a.cluster_combine && Stages != 3) return cudaErrorInvalidValue;
  const int smem = a.cluster_combine ? cluster_smem_bytes<D>() : Tr::kSmemBytes;
  cudaError_t err = allow_smem<split>(Stages == 3 ? cluster_smem_bytes<D>() : smem);  // the largest it is launched with
  if (err != cudaSuccess) return err;
  const dim3 grid(a.num_splits, a.num_kv_heads * a.row_blocks, a.batch);
  return launch_decode_kernel(split, grid, Tr::kThreads, smem, pdl, stream, a, a.cluster_combine ? a.num_splits : 1);
}

template <typename T, int D, bool kUnified>
cudaError_t launch_decode_impl(const AttnArgs& a, bool pdl, cudaStream_t stream) {
  cudaError_t err;
  if constexpr (D == 256) {
    // Always 3 stages: 4 do not fit an SM, and 2 (136 KB) still leave no room for a second CTA, so the 2-stage rule's
    // occupancy gain never comes and a third of the bytes in flight would be lost.
    err = launch_split<T, D, kUnified, 3>(a, pdl, stream);
  } else {
    err = a.decode_stages == 2   ? launch_split<T, D, kUnified, 2>(a, pdl, stream)
          : a.decode_stages == 4 ? launch_split<T, D, kUnified, 4>(a, pdl, stream)
                                 : launch_split<T, D, kUnified, 3>(a, pdl, stream);
  }
  // One split, a cluster per row block or the last-block combine: the split kernel wrote the output.
  if (err != cudaSuccess || a.num_splits == 1 || a.cluster_combine || a.combine_counters != nullptr) return err;
  return launch_decode_kernel(decode_combine_kernel<T, D, kUnified>, dim3(a.batch * a.num_heads * a.seq), 128, 0, pdl,
                              stream, a);
}

template <typename T, int D>
cudaError_t launch_decode_dim(const AttnArgs& a, bool unified, bool pdl, cudaStream_t stream) {
  return unified ? launch_decode_impl<T, D, true>(a, pdl, stream) : launch_decode_impl<T, D, false>(a, pdl, stream);
}

template <typename T>
cudaError_t launch_decode(const AttnArgs& a, bool unified, bool pdl, cudaStream_t stream) {
  switch (kernel_head_dim(a.head_dim)) {  // 80 and 96 run in the 128 kernel
    case 64: return launch_decode_dim<T, 64>(a, unified, pdl, stream);
    case 128: return launch_decode_dim<T, 128>(a, unified, pdl, stream);
    case 256: return launch_decode_dim<T, 256>(a, unified, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

// Index of an instantiation's head_dim in the per-head_dim caches below (64, 128, 256 -> 0, 1, 2).
inline int dim_slot(int head_dim) {
  const int d = kernel_head_dim(head_dim);
  return d == 64 ? 0 : d == 128 ? 1 : 2;
}

template <typename T, int D>
cudaError_t decode_ctas_per_sm_dim(int* ctas) {
  using Tr = DecodeTraits<D>;
  constexpr auto split = decode_split_kernel<T, D, true, 3>;
  cudaError_t err = allow_smem<split>(cluster_smem_bytes<D>());
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, split, Tr::kThreads, Tr::kSmemBytes);
}

template <typename T>
cudaError_t decode_ctas_per_sm(int head_dim, int* ctas) {
  static std::atomic<int> cached[3][64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int d = kernel_head_dim(head_dim);
  std::atomic<int>& slot = cached[dim_slot(head_dim)][device & 63];
  if (int v = slot.load(std::memory_order_relaxed)) {
    *ctas = v;
    return cudaSuccess;
  }
  err = d == 256   ? decode_ctas_per_sm_dim<T, 256>(ctas)
        : d == 128 ? decode_ctas_per_sm_dim<T, 128>(ctas)
                   : decode_ctas_per_sm_dim<T, 64>(ctas);
  if (err != cudaSuccess) return err;
  if (*ctas < 1) *ctas = 1;
  slot.store(*ctas, std::memory_order_relaxed);
  return cudaSuccess;
}

// CTAs of the split kernel resident at once in clusters of `splits` with the padded shared memory: the occupancy
// API's clusters x splits, cached per device, head_dim and split count.
template <typename T, int D>
cudaError_t decode_cluster_capacity_dim(int splits, int* ctas) {
  constexpr auto split = decode_split_kernel<T, D, true, 3>;
  cudaError_t err = allow_smem<split>(cluster_smem_bytes<D>());
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(splits, 1, 1);
  cfg.blockDim = dim3(DecodeTraits<D>::kThreads);
  cfg.dynamicSmemBytes = cluster_smem_bytes<D>();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {static_cast<unsigned>(splits), 1, 1};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  err = cudaOccupancyMaxActiveClusters(&clusters, split, &cfg);
  *ctas = clusters * splits;
  return err;
}

template <typename T>
cudaError_t decode_cluster_capacity(int head_dim, int splits, int* ctas) {
  static std::atomic<int> cached[3][kMaxClusterSplits + 1][64] = {};
  if (splits < 2 || splits > kMaxClusterSplits) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int d = kernel_head_dim(head_dim);
  std::atomic<int>& slot = cached[dim_slot(head_dim)][splits][device & 63];
  if (int v = slot.load(std::memory_order_relaxed)) {
    *ctas = v - 1;
    return cudaSuccess;
  }
  err = d == 256   ? decode_cluster_capacity_dim<T, 256>(splits, ctas)
        : d == 128 ? decode_cluster_capacity_dim<T, 128>(splits, ctas)
                   : decode_cluster_capacity_dim<T, 64>(splits, ctas);
  if (err != cudaSuccess) return err;
  slot.store(*ctas + 1, std::memory_order_relaxed);  // + 1: 0 means not yet asked
  return cudaSuccess;
}

}  // namespace attn
}  // namespace fdpp
