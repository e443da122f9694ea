// Planning and dispatch of fdpp::AsyncSoftmaxAttention: which kernel, how many splits, the workspace layout, the
// numeric window, and the launch. Also the library's own diagnostic counters and the rowwise kernel's launcher.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_decode.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_launch.h"
#include "kernels/attention/attention_params.h"
#include "kernels/attention/attention_prefill_sm90_tma.h"

namespace fdpp {
namespace {

__device__ unsigned long long g_attention_counters[2];

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Keys per decode tile of the instantiation head_dim runs in (DecodeTraits::kTile).
int decode_tile(int head_dim) { return kernel_head_dim(head_dim) == 64 ? 128 : 64; }

// Prefill CTAs resident per SM in either tile shape (__launch_bounds__(128, 2); 96 or 80 KB of shared memory).
constexpr int kPrefillCtasPerSm = 2;

int64_t attention_rows(const AttentionParams& p) { return static_cast<int64_t>(p.batch) * p.num_heads * p.seq; }

int row_blocks(const AttentionParams& p) {
  const int rows = (p.num_heads / p.num_kv_heads) * p.seq;
  return (rows + 15) / 16;
}

// Whether the decode's `splits` splits combine inside thread block clusters (cluster_combine_ok, and every cluster
// resident at once), unless decode_combine asks for another combine.
cudaError_t cluster_plan(const AttentionParams& p, int splits, const attn::DeviceInfo& info, bool* cluster) {
  *cluster = false;
  const long long ctas = static_cast<long long>(p.batch) * p.num_kv_heads * row_blocks(p) * splits;
  const bool may_cluster = p.decode_combine == DecodeCombine::kAuto || p.decode_combine == DecodeCombine::kCluster;
  if (!may_cluster || !cluster_combine_ok(splits, info.major, ctas, info.num_sms)) return cudaSuccess;
  int capacity = 0;
  const cudaError_t err = p.dtype == AttnDtype::kBFloat16
                              ? attn::decode_cluster_capacity<__nv_bfloat16>(p.head_dim, splits, &capacity)
                              : attn::decode_cluster_capacity<__half>(p.head_dim, splits, &capacity);
  *cluster = err == cudaSuccess && capacity >= ctas;
  return err;
}

// Whether the decode's splits (not in clusters) combine in the last split CTA of each row block to finish, which
// needs the caller's counters; otherwise the combine kernel runs. One split needs no combine.
bool last_block_plan(const AttentionParams& p, int splits, bool cluster) {
  const bool asked = p.decode_combine == DecodeCombine::kAuto || p.decode_combine == DecodeCombine::kLastBlock;
  return asked && splits > 1 && !cluster && p.combine_counters != nullptr;
}

// Key tiles of the longest sequence the call may see.
int decode_tiles(const AttentionParams& p) {
  const int max_len = p.max_kv_len > 0 ? p.max_kv_len : p.kv_capacity;
  const int tile = decode_tile(p.head_dim);
  return (max_len + tile - 1) / tile;
}

cudaError_t decode_plan(const AttentionParams& p, int* splits) {
  if (p.num_splits > 0) {
    *splits = p.num_splits;
    return cudaSuccess;
  }
  attn::DeviceInfo info;
  cudaError_t err = attn::device_info(&info);
  if (err != cudaSuccess) return err;
  int per_sm = 1;
  err = p.dtype == AttnDtype::kBFloat16 ? attn::decode_ctas_per_sm<__nv_bfloat16>(p.head_dim, &per_sm)
                                        : attn::decode_ctas_per_sm<__half>(p.head_dim, &per_sm);
  if (err != cudaSuccess) return err;
  const int tiles = decode_tiles(p);
  *splits = decode_num_splits(p.batch * p.num_kv_heads * row_blocks(p), tiles, info.num_sms, per_sm);
  // Short rows: one split fewer where that count combines in clusters and the rule's count cannot
  // (cluster_prefers_one_split_fewer in attention_heuristics.h).
  bool cluster = false, fewer = false;
  if (cluster_prefers_one_split_fewer(*splits, tiles)) {
    if ((err = cluster_plan(p, *splits, info, &cluster)) != cudaSuccess) return err;
    if (!cluster && (err = cluster_plan(p, *splits - 1, info, &fewer)) != cudaSuccess) return err;
    if (fewer) --*splits;
  }
  return cudaSuccess;
}

struct WorkspaceLayout {
  size_t acc = 0, l = 0, stat = 0, total = 0;
};
WorkspaceLayout decode_layout(const AttentionParams& p, int splits) {
  const size_t slots = static_cast<size_t>(attention_rows(p)) * splits;
  WorkspaceLayout w;
  w.acc = 0;
  w.l = align_up(slots * kernel_head_dim(p.head_dim) * sizeof(float));  // the kernel's D per partial
  w.stat = w.l + align_up(slots * sizeof(float));
  w.total = w.stat + align_up(slots * sizeof(uint32_t));
  return w;
}

attn::AttnArgs make_args(const AttentionParams& p, AttnKernel kernel, unsigned long long* counters) {
  attn::AttnArgs a = {};
  a.batch = p.batch, a.num_heads = p.num_heads, a.num_kv_heads = p.num_kv_heads;
  a.group = p.num_heads / p.num_kv_heads, a.seq = p.seq, a.head_dim = p.head_dim, a.kv_capacity = p.kv_capacity;
  a.mask_mode = p.mask_mode;
  const float log2e = attn::kLog2e;
  a.scale_log2 = p.scale * log2e;
  a.phi_log2 = p.phi * log2e;
  // The caller's guard window, intersected with what the kernel's arithmetic can hold (attention_params.h).
  float lo = std::max(p.guard_lo, kWindowLo), hi = std::min(p.guard_hi, kWindowHi);
  float max_floor = -INFINITY;
  if (kernel == AttnKernel::kPrefill && p.dtype == AttnDtype::kFloat16) {
    hi = std::min(hi, kFp16PrefillHi);
    max_floor = kFp16PrefillMaxFloor;
  }
  a.lo_log2 = lo * log2e, a.hi_log2 = hi * log2e;
  a.max_floor_log2 = std::isinf(max_floor) ? max_floor : max_floor * log2e;
  a.softcap_log2 = p.softcap > 0.f ? p.softcap * log2e : 0.f;
  a.softcap_k = p.softcap > 0.f ? 2.f / p.softcap : 0.f;
  a.window = p.mask_mode == MaskMode::kPastLen ? p.window : 0;
  a.q = p.q, a.q_sb = p.q_sb, a.q_sh = p.q_sh, a.q_ss = p.q_ss;
  a.k = p.k, a.k_sb = p.k_sb, a.k_sh = p.k_sh, a.k_ss = p.k_ss;
  a.v = p.v, a.v_sb = p.v_sb, a.v_sh = p.v_sh, a.v_ss = p.v_ss;
  a.out = p.out, a.o_sb = p.o_sb, a.o_sh = p.o_sh, a.o_ss = p.o_ss;
  a.past_len = p.past_len;
  a.bias = p.bias, a.bias_sb = p.bias_sb, a.bias_ss = p.bias_ss, a.bias_sl = p.bias_sl;
  a.block_table = p.block_table, a.block_table_stride = p.block_table_stride;
  a.counters = counters;
  return a;
}

template <typename T>
cudaError_t launch_rowwise(const attn::AttnArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.batch * a.num_heads * a.seq));
  switch (kernel_head_dim(a.head_dim)) {  // 80 and 96 in the 128 kernel
    case 64: attn::rowwise_kernel<T, 64><<<grid, 128, 0, stream>>>(a); break;
    case 128: attn::rowwise_kernel<T, 128><<<grid, 128, 0, stream>>>(a); break;
    case 256: attn::rowwise_kernel<T, 256><<<grid, 128, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_prefill_typed(AttnDtype dtype, const attn::AttnArgs& a, bool unified, cudaStream_t stream) {
  if (dtype == AttnDtype::kBFloat16) return attn::launch_prefill<__nv_bfloat16>(a, unified, stream);
  if (dtype == AttnDtype::kFloat16) return attn::launch_prefill<__half>(a, unified, stream);
  return cudaErrorInvalidValue;
}

// Tile shape 5, the TMA wgmma kernel: where the library holds its sm_90a code, else cudaErrorNotSupported.
cudaError_t launch_prefill_tma_typed(const AttentionParams& p, const attn::AttnArgs& a, bool unified,
                                     cudaStream_t stream) {
  if (p.dtype == AttnDtype::kFloat32) return cudaErrorNotSupported;
  bool available = false;
  const bool bf16 = p.dtype == AttnDtype::kBFloat16;
  cudaError_t err = bf16 ? attn::prefill_tma_available<__nv_bfloat16>(p.head_dim, &available)
                         : attn::prefill_tma_available<__half>(p.head_dim, &available);
  if (err != cudaSuccess) return err;
  if (!available) return cudaErrorNotSupported;
  return bf16 ? attn::launch_prefill_tma<__nv_bfloat16>(a, unified, stream)
              : attn::launch_prefill_tma<__half>(a, unified, stream);
}

// Whether this GPU runs the wgmma prefill (tile shape 4): sm_90, and the library holds its sm_90a code.
cudaError_t wgmma_prefill_available(const AttentionParams& p, bool* available) {
  if (p.dtype == AttnDtype::kBFloat16) return attn::prefill_sm90_available<__nv_bfloat16>(p.head_dim, available);
  if (p.dtype == AttnDtype::kFloat16) return attn::prefill_sm90_available<__half>(p.head_dim, available);
  *available = false;
  return cudaSuccess;
}

}  // namespace

namespace attn {

cudaError_t device_info(DeviceInfo* info) {
  static std::atomic<int> sms[64] = {}, majors[64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int slot = device & 63;
  if (sms[slot].load(std::memory_order_relaxed) == 0) {
    int n = 0, major = 0;
    err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return err;
    majors[slot].store(major, std::memory_order_relaxed);
    sms[slot].store(n, std::memory_order_relaxed);
  }
  info->num_sms = sms[slot].load(std::memory_order_relaxed);
  info->major = majors[slot].load(std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace attn

AttnKernel choose_kernel(const AttentionParams& p) {
  if (p.kernel != AttnKernel::kAuto) return p.kernel;
  if (p.dtype == AttnDtype::kFloat32) return AttnKernel::kRowwise;
  if (p.seq <= kDecodeMaxSeq) return AttnKernel::kDecode;
  attn::DeviceInfo info;
  if (attn::device_info(&info) != cudaSuccess) return AttnKernel::kPrefill;  // no GPU: the shape rule alone
  return chunk_takes_decode(p.batch, p.num_heads, p.seq, info.num_sms) ? AttnKernel::kDecode : AttnKernel::kPrefill;
}

int decode_splits_for(const AttentionParams& p) {
  int splits = 1;
  return decode_plan(p, &splits) == cudaSuccess ? splits : -1;
}

int decode_uses_cluster(const AttentionParams& p) {
  int splits = 1;
  attn::DeviceInfo info;
  bool cluster = false;
  if (decode_plan(p, &splits) != cudaSuccess || attn::device_info(&info) != cudaSuccess ||
      cluster_plan(p, splits, info, &cluster) != cudaSuccess)
    return -1;
  return cluster ? 1 : 0;
}

size_t attention_workspace_bytes(const AttentionParams& p) {
  if (choose_kernel(p) != AttnKernel::kDecode) return 0;
  int splits = 1;
  if (decode_plan(p, &splits) != cudaSuccess) return 0;
  unsigned long long* counters = nullptr;
  attention_default_counters(&counters);  // resolve the symbol now, before any graph capture
  return decode_layout(p, splits).total;
}

size_t attention_combine_counters(const AttentionParams& p) {
  if (choose_kernel(p) != AttnKernel::kDecode) return 0;
  return static_cast<size_t>(p.batch) * p.num_kv_heads * row_blocks(p);
}

size_t attention_workspace_bound(const AttentionParams& p) {
  size_t bound = 0;
  AttentionParams q = p;
  const int max_seq = p.seq < kChunkDecodeMaxSeq || p.kernel == AttnKernel::kDecode ? p.seq : kChunkDecodeMaxSeq;
  for (int b = 1; b <= p.batch; ++b) {
    for (int s = 1; s <= max_seq; ++s) {
      q.batch = b, q.seq = s;
      bound = std::max(bound, attention_workspace_bytes(q));
    }
  }
  return bound;
}

cudaError_t attention_default_counters(unsigned long long** device_ptr) {
  static std::atomic<unsigned long long*> cached[64] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (unsigned long long* ptr = cached[device & 63].load(std::memory_order_relaxed)) {
    *device_ptr = ptr;
    return cudaSuccess;
  }
  void* addr = nullptr;
  err = cudaGetSymbolAddress(&addr, g_attention_counters);
  if (err != cudaSuccess) return err;
  *device_ptr = static_cast<unsigned long long*>(addr);
  cached[device & 63].store(*device_ptr, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t attention_forward(const AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (attention_rows(p) == 0) return cudaSuccess;
  unsigned long long* counters = p.counters;
  if (counters == nullptr) {
    const cudaError_t err = attention_default_counters(&counters);
    if (err != cudaSuccess) return err;
  }
  const AttnKernel kernel = choose_kernel(p);
  attn::AttnArgs a = make_args(p, kernel, counters);
  const bool unified = p.softmax == SoftmaxMode::kUnified;
  switch (kernel) {
    case AttnKernel::kDecode: {
      int splits = 1;
      cudaError_t err = decode_plan(p, &splits);
      if (err != cudaSuccess) return err;
      const WorkspaceLayout w = decode_layout(p, splits);
      if (workspace == nullptr || workspace_bytes < w.total) return cudaErrorInvalidValue;
      char* ws = static_cast<char*>(workspace);
      a.num_splits = splits;
      a.row_blocks = row_blocks(p);
      a.ws_acc = reinterpret_cast<float*>(ws + w.acc);
      a.ws_l = reinterpret_cast<float*>(ws + w.l);
      a.ws_stat = reinterpret_cast<uint32_t*>(ws + w.stat);
      attn::DeviceInfo info;
      err = attn::device_info(&info);
      if (err != cudaSuccess) return err;
      // Programmatic dependent launch only where the sm_90a code runs: on other GPUs the compute_80 PTX has no
      // griddepcontrol.wait, and an early start could read the previous kernel's output too soon.
      const bool pdl = p.pdl && info.major == 9;
      // The splits combine in a cluster where they can (one kernel per call instead of two; cluster_combine_ok in
      // attention_heuristics.h has the measurements), else in their last CTA where the caller gave the counters
      // (one kernel too), else in the combine kernel. A forced cluster the plan cannot take is refused.
      bool cluster = false;
      err = cluster_plan(p, splits, info, &cluster);
      if (err != cudaSuccess) return err;
      if (p.decode_combine == DecodeCombine::kCluster && !cluster) return cudaErrorNotSupported;
      a.cluster_combine = cluster ? 1 : 0;
      a.combine_counters = last_block_plan(p, splits, cluster) ? p.combine_counters : nullptr;
      a.decode_stages = decode_stages(static_cast<long long>(p.batch) * p.num_kv_heads * a.row_blocks * splits,
                                      info.num_sms, cluster, (decode_tiles(p) + splits - 1) / splits);
      if (p.dtype == AttnDtype::kBFloat16) return attn::launch_decode<__nv_bfloat16>(a, unified, pdl, stream);
      if (p.dtype == AttnDtype::kFloat16) return attn::launch_decode<__half>(a, unified, pdl, stream);
      return cudaErrorInvalidValue;
    }
    case AttnKernel::kPrefill: {
      bool run_unified = unified;
      bool wgmma = false;
      cudaError_t err = wgmma_prefill_available(p, &wgmma);
      if (err != cudaSuccess) return err;
      if (p.prefill_config == 4 && !wgmma) return cudaErrorNotSupported;
      if (p.prefill_config > 0 && !prefill_shape_takes(p, p.prefill_config)) return cudaErrorNotSupported;
      if (p.prefill_config == 5) {  // forced only: the plan keeps shape 4 until the H200 measures 5 faster
        a.prefill_config = 5;
        return launch_prefill_tma_typed(p, a, run_unified, stream);
      }
      if (p.prefill_config > 0) {  // forced (tests, benchmarks): exactly the kernel asked for
        a.prefill_config = p.prefill_config;
      } else if (wgmma) {
        // The wgmma kernel in the synchronized softmax: its two warpgroups already hide the softmax behind the
        // MMAs, so the anchored unified max saves nothing there (docs/notes-attention.md, "Prefill kernels").
        a.prefill_config = 4;
        run_unified = false;
      } else {
        attn::DeviceInfo info;
        if ((err = attn::device_info(&info)) != cudaSuccess) return err;
        const int heads = p.batch * p.num_heads, slots = info.num_sms * kPrefillCtasPerSm;
        a.prefill_config = prefill_tile_config(heads, p.seq, slots);
        if (prefill_prefers_synchronized(heads, p.seq, slots)) run_unified = false;
        // What shape 1 lacks (prefill_shape_takes) runs in the 64-row blocks, synchronized as the rule above has them.
        if (!prefill_shape_takes(p, a.prefill_config)) a.prefill_config = 2, run_unified = false;
      }
      return launch_prefill_typed(p.dtype, a, run_unified, stream);
    }
    case AttnKernel::kRowwise:
      if (p.dtype == AttnDtype::kBFloat16) return launch_rowwise<__nv_bfloat16>(a, stream);
      if (p.dtype == AttnDtype::kFloat16) return launch_rowwise<__half>(a, stream);
      return launch_rowwise<float>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace fdpp
