// RoPE on the new tokens' q and k, and the in-place append of k and v to the cache: the companion kernel of the
// decode step (one launch; a step writes O(new tokens) of cache, never copies it). With a block table the cache is
// paged: position pos goes to row pos % 64 of block table[b][pos / 64] (kv_locate, attention_common.cuh), and
// positions at or past kv_capacity = W * 64 are dropped and counted as positions past a contiguous cache are.
//
// The head slots are Hq query heads then Hkv key heads then Hkv value heads. One CTA per (batch, token, group of
// slots): its 128 threads cover the channel pairs of 128 / (D/2) heads at once (its lanes) and walk the group, so
// each thread computes its pair's angle once per token. rope_group_slots() sizes the group.
// Angles in float32 like the Hugging Face reference: inv_freq_i = p.inv_freq[i] (the model's table) or
// theta^(-2i/R), angle = position * inv_freq_i, with accurate sincosf (positions reach 10^5 radians). Only the
// first R = rope_dim channels of a q or k head rotate; the pairs past them, and every pair of a value head, are
// copies of adjacent channels. E.g. D = 128, R = 64 interleaved (chatglm2): pairs 0-31 rotate (2i, 2i+1), pairs
// 32-63 copy channels (64 + 2(i - 32), +1); R = 0 (OPT) copies every pair.
#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_launch.h"
#include "kernels/attention/attention_mma.cuh"
#include "kernels/attention/attention_params.h"
#include "kernels/common/pdl.cuh"

namespace fdpp {
namespace {

constexpr int kRopeThreads = 128;
constexpr int kRopeMaxGroup = 8;      // head slots per CTA at most
constexpr int kRopeMinCtasPerSm = 4;  // a larger group only while the grid keeps this many CTAs per SM

// Head slots per CTA: one round of its lanes, doubled up to kRopeMaxGroup while the grid keeps kRopeMinCtasPerSm
// CTAs per SM: a CTA computes each angle of its token once for all its heads, so larger groups do less work in all,
// while a decode step, with few tokens, needs many small CTAs to fill the GPU (timings: docs/notes-attention.md).
// Worked example (132 SMs): decode B = 16 -> 2 slots (768 CTAs; 4 would leave 384 < 528);
// a 128-token chunk -> 8 slots (1536 CTAs).
inline int rope_group_slots(int slots, int lanes, long long tokens, int sms) {
  int group = lanes;
  while (group * 2 <= kRopeMaxGroup &&
         (slots + group * 2 - 1) / (group * 2) * tokens >= static_cast<long long>(kRopeMinCtasPerSm) * sms)
    group *= 2;
  return group;
}

template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_append_kernel(const RopeAppendParams p, int group, unsigned long long* counters) {
  using E = attn::Elem<T>;
  // Launched with PDL (on sm_90a) this CTA may start before the GEMM writing q/k/v ends: wait for it, then let the
  // attention start (it only prefetches K/V tiles to L2 before its own wait).
  pdl::wait_for_primary();
  pdl::launch_dependents();
  const int s = blockIdx.y, b = blockIdx.z;
  const int half = p.head_dim / 2;  // <= kRopeThreads (head_dim <= 256, checked by the launcher)
  const int lanes = kRopeThreads / half, lane = threadIdx.x / half, i = threadIdx.x % half;
  if (lane >= lanes) return;
  const long long pos = p.past_len[b] + s;
  const bool in_cache = pos >= 0 && pos < p.kv_capacity;
  // Where position pos goes in the caches (the attention kernels' address rule); only read when in_cache.
  const attn::KvRow at =
      in_cache ? attn::kv_locate(p.block_table, p.block_table_stride, b, static_cast<int>(pos)) : attn::KvRow{0, 0};
  const int rotated_pairs = p.rope_dim / 2;
  float sn = 0.0f, cs = 1.0f;
  if (i < rotated_pairs) {
    const float position = static_cast<float>(pos < 0 ? 0 : pos);
    const float inv_freq = p.inv_freq != nullptr
                               ? p.inv_freq[i]
                               : powf(p.rope_theta, -2.0f * static_cast<float>(i) / static_cast<float>(p.rope_dim));
    sincosf(position * inv_freq, &sn, &cs);
  }
  const int slots = p.num_heads + 2 * p.num_kv_heads;
  const int first = blockIdx.x * group, last = min(first + group, slots);
  for (int slot = first + lane; slot < last; slot += lanes) {
    const int kv_slot = slot - p.num_heads;
    if (!in_cache) {
      if (i == 0 && kv_slot >= 0 && kv_slot < p.num_kv_heads) atomicAdd(counters + 1, 1ull);
      if (kv_slot >= 0) continue;  // nowhere to write this token's k and v; q is still rotated (clamped position)
    }
    if (kv_slot >= p.num_kv_heads) {  // a value head: plain copy of the pair
      const int h = kv_slot - p.num_kv_heads;
      const T* src = static_cast<const T*>(p.v_new) + b * p.vn_sb + h * p.vn_sh + s * p.vn_ss;
      T* dst = static_cast<T*>(p.v_cache) + attn::kv_row_offset(at, p.vc_sb, p.vc_sh, p.vc_ss, h);
      dst[2 * i] = src[2 * i];
      dst[2 * i + 1] = src[2 * i + 1];
      continue;
    }
    const bool rotate = i < rotated_pairs;
    const int i0 = !rotate ? p.rope_dim + 2 * (i - rotated_pairs) : p.rope_interleaved ? 2 * i : i;
    const int i1 = !rotate ? i0 + 1 : p.rope_interleaved ? 2 * i + 1 : i + rotated_pairs;
    const T* src;
    T* dst;
    if (kv_slot < 0) {
      src = static_cast<const T*>(p.q_in) + b * p.q_sb + slot * p.q_sh + s * p.q_ss;
      dst = static_cast<T*>(p.q_out) + b * p.q_sb + slot * p.q_sh + s * p.q_ss;
    } else {
      src = static_cast<const T*>(p.k_new) + b * p.kn_sb + kv_slot * p.kn_sh + s * p.kn_ss;
      dst = static_cast<T*>(p.k_cache) + attn::kv_row_offset(at, p.kc_sb, p.kc_sh, p.kc_ss, kv_slot);
    }
    if (!rotate) {
      dst[i0] = src[i0];
      dst[i1] = src[i1];
      continue;
    }
    const float x0 = E::to_float(src[i0]), x1 = E::to_float(src[i1]);
    dst[i0] = E::from_float(x0 * cs - x1 * sn);
    dst[i1] = E::from_float(x1 * cs + x0 * sn);
  }
}

}  // namespace

cudaError_t rope_append(const RopeAppendParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.seq == 0) return cudaSuccess;
  unsigned long long* counters = p.counters;
  if (counters == nullptr) {
    const cudaError_t err = attention_default_counters(&counters);
    if (err != cudaSuccess) return err;
  }
  if (p.head_dim < 2 || p.head_dim / 2 > kRopeThreads) return cudaErrorInvalidValue;
  attn::DeviceInfo info;
  cudaError_t err = attn::device_info(&info);
  if (err != cudaSuccess) return err;
  const int slots = p.num_heads + 2 * p.num_kv_heads;
  const int group =
      rope_group_slots(slots, kRopeThreads / (p.head_dim / 2), static_cast<long long>(p.seq) * p.batch, info.num_sms);
  const dim3 grid((slots + group - 1) / group, p.seq, p.batch);
  const dim3 threads(kRopeThreads);
  bool pdl = false;
  if ((err = pdl::runs_sm90a_code(&pdl)) != cudaSuccess) return err;
  switch (p.dtype) {
    case AttnDtype::kFloat16:
      return pdl::launch(rope_append_kernel<__half>, grid, threads, stream, pdl, p, group, counters);
    case AttnDtype::kBFloat16:
      return pdl::launch(rope_append_kernel<__nv_bfloat16>, grid, threads, stream, pdl, p, group, counters);
    case AttnDtype::kFloat32:
      return pdl::launch(rope_append_kernel<float>, grid, threads, stream, pdl, p, group, counters);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace fdpp
