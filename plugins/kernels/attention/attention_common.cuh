// What every attention kernel reads: the launch arguments in kernel form (log2 units, workspace pointers) and the
// per-sequence key range rules. Built on the host by make_args() (attention_launch.cu) from AttentionParams.
#pragma once

#include <stdint.h>

#include "kernels/attention/attention_mma.cuh"
#include "kernels/attention/attention_params.h"

namespace fdpp {
namespace attn {

struct AttnArgs {
  int batch, num_heads, num_kv_heads, group, seq, head_dim, kv_capacity;
  MaskMode mask_mode;
  // Scores are handled as x = s * log2(e) so that e^(s - phi) = 2^(x - phi * log2(e)).
  float scale_log2;  // scale * log2(e)
  float phi_log2;    // phi * log2(e)
  float lo_log2;     // effective guard window for s - phi, log2 units (the kernel's numeric window applied)
  float hi_log2;
  float max_floor_log2;  // a row whose largest s - phi is below this falls back (-inf: no such rule)
  float softcap_log2;    // softcap * log2(e): x = C tanh(x / C) in log2 units (softcap_x); 0: no soft-capping
  float softcap_k;       // 2 / softcap: e^(2 x / C) = 2^(x softcap_k) for x in log2 units
  int window;            // sliding window in keys (mask_mode kPastLen; visible_begin); 0: none

  const void* q;
  int64_t q_sb, q_sh, q_ss;
  const void* k;
  int64_t k_sb, k_sh, k_ss;
  const void* v;
  int64_t v_sb, v_sh, v_ss;
  void* out;
  int64_t o_sb, o_sh, o_ss;
  const int64_t* past_len;
  const void* bias;
  int64_t bias_sb, bias_ss, bias_sl;
  const int32_t* block_table;  // paged K/V (kv_locate); null: contiguous
  int64_t block_table_stride;

  // decode split-KV
  int num_splits, row_blocks;
  int cluster_combine;  // 1: the splits of a row block form a thread block cluster whose first CTA combines them
  int decode_stages;    // pipeline stages of the split kernel (host-chosen: decode_stages() in attention_heuristics.h)
  int prefill_slots;    // prefill: CTAs resident on the GPU at once (orders the work, see prefill_kernel)
  int prefill_config;   // prefill tile shape (host-chosen in attention_forward): 1, 2, 4 or 5
  float* ws_acc;        // [rows][splits][head_dim] partial sums of p * v
  float* ws_l;          // [rows][splits] partial sums of p
  uint32_t* ws_stat;    // [rows][splits] guard flag bits (unified) or the running max as float bits (synchronized)
  // [batch][kv heads][row blocks] arrival counts of the last-block combine, zero between calls; null: the splits
  // combine in a cluster or in the combine kernel
  uint32_t* combine_counters;

  unsigned long long* counters;  // [0] fallback rows, [1] rows whose kv length was clamped to the cache
};

// Keys of sequence b: past_len[b] + seq in mode past_len (clamped to the cache), the whole cache otherwise.
__device__ __forceinline__ int kv_len_of(const AttnArgs& a, int b, bool* clamped = nullptr) {
  if (a.mask_mode != MaskMode::kPastLen) return a.kv_capacity;
  const long long past = a.past_len[b];
  long long len = past + a.seq;
  bool bad = past < 0 || len > a.kv_capacity;
  if (len > a.kv_capacity) len = a.kv_capacity;
  if (len < 0) len = 0;
  if (clamped) *clamped = bad;
  return static_cast<int>(len);
}

// One past the last key query token s of sequence b may see (keys [0, limit)).
__device__ __forceinline__ int visible_end(const AttnArgs& a, int b, int s, int kv_len) {
  if (a.mask_mode != MaskMode::kPastLen) return kv_len;
  const long long end = a.past_len[b] + s + 1;
  return end < kv_len ? (end < 0 ? 0 : static_cast<int>(end)) : kv_len;
}

// The first key query token s of a sequence with `past` cached tokens may see under a sliding window of `window`
// keys ((past + s) - j < window), clamped to [0, kv_len]; 0 without a window. A host-free rule on plain values so
// that the decode's L2 prefetch (with a past_len read before the PDL wait) places its hints by it too.
__device__ __forceinline__ int window_begin(long long past, int s, int window, int kv_len) {
  if (window <= 0) return 0;
  const long long begin = past + s + 1 - static_cast<long long>(window);
  return begin <= 0 ? 0 : (begin < kv_len ? static_cast<int>(begin) : kv_len);
}
// past_len as the prefill kernels' per-score masks read it: clamped to [-1, kv_capacity] (an int, never an overflow;
// only a clamped, counted row sees the difference), so that every kernel and the fallback agree on the window.
__device__ __forceinline__ long long clamped_past(long long past, int kv_capacity) {
  return past < 0 ? -1 : (past > kv_capacity ? kv_capacity : past);
}
__device__ __forceinline__ int visible_begin(const AttnArgs& a, int b, int s, int kv_len) {
  if (a.mask_mode != MaskMode::kPastLen) return 0;
  return window_begin(clamped_past(a.past_len[b], a.kv_capacity), s, a.window, kv_len);
}

// Soft-capping in log2 units: s' = c tanh(s / c) is x' = C tanh(x / C) for x = s log2(e) and C = c log2(e), and
// tanh(y) = 1 - 2 / (e^(2y) + 1) with e^(2y) = 2^(x 2 / c): one ex2 and one division, a few registers (tanhf's
// branches and temporaries made the 255-register prefill kernels spill; tanh.approx's 2^-11 relative error would be
// 0.02 nats at a cap of 50, this form's about 1e-5). Saturates to +-C for |x| large (2^inf = inf, 2^-inf = 0), and
// x' lies in [-C, C] for every finite x.
__device__ __forceinline__ float softcap_x(const AttnArgs& a, float x) {
  return a.softcap_log2 - __fdividef(2.f * a.softcap_log2, fast_exp2(x * a.softcap_k) + 1.f);
}

// The head dimensions a kernel instantiated for D reads and writes: a.head_dim in the 128 kernels (80 and 96 run
// there, kernel_head_dim() in attention_params.h), D elsewhere. Dimensions past it are zero-filled, never stored.
template <int D>
__device__ __forceinline__ int real_dim(const AttnArgs& a) {
  return D == 128 ? a.head_dim : D;
}

// The decode split of a sequence: keys [first, kv_len) in chunks of whole tiles, so that only the sequence's last
// tile is partial. first: the first key of the first tile any row of the call sees (decode_first_key).
struct SplitRange {
  int begin, end, chunk;
};
__device__ __forceinline__ SplitRange split_range(int first, int kv_len, int num_splits, int tile, int split) {
  const int per_split = (kv_len - first + num_splits - 1) / num_splits;
  const int chunk = (per_split + tile - 1) / tile * tile;
  const int begin = first + split * chunk;
  const int end = begin + chunk < kv_len ? begin + chunk : kv_len;
  return {begin, end, chunk};
}
__device__ __forceinline__ int active_splits(int first, int kv_len, int chunk) {
  return chunk > 0 ? (kv_len - first + chunk - 1) / chunk : 0;
}
// The first key the decode splits of sequence b cover: the window's start for its first query token, rounded down
// to a whole tile (tiles stay KV-block aligned for paged caches); 0 without a window. The splits, the combines and
// the prefetch all derive it the same way.
__device__ __forceinline__ int decode_first_key(long long past, int window, int kv_len, int tile) {
  return window_begin(past, 0, window, kv_len) / tile * tile;
}
__device__ __forceinline__ int decode_first_key(const AttnArgs& a, int b, int kv_len, int tile) {
  if (a.mask_mode != MaskMode::kPastLen) return 0;
  return decode_first_key(clamped_past(a.past_len[b], a.kv_capacity), a.window, kv_len, tile);
}

// A prefill CTA's query block (both prefill kernels): which (batch, query head, first row) it takes, its kv length,
// rows and key tiles, and the order it walks them in.
// Work order: causal query blocks get heavier with their index. Heaviest first (longest-processing-time); but when
// the whole grid (batch x heads, blocks) fits in about two waves of resident CTAs, the second wave takes the lightest
// blocks first so that each SM pairs a heavy CTA with a light one (B=1, L=1K: the busiest SM does 18 tiles, not 24).
// Tile order: the diagonal tiles (the last kAnchorTiles - 1), then tile 0 (the attention sink; with a sliding window
// the block's first visible tile), then the rest; the anchored unified max anchors each row on these first tiles
// (AnchoredUnifiedSoftmax).
// kWindow: the block may start past tile 0 (a sliding window); false where the kernel has no window (first_tile 0).
template <int kBlockM, int kBlockN, int kAnchorTiles, bool kWindow = true>
struct PrefillBlock {
  int b, hq, hkv, m0, kv_len, rows_here, key_end, num_tiles;
  int first_tile;  // the first key tile any row of the block sees (0 without a window); tiles walked: num_tiles

  __device__ __forceinline__ explicit PrefillBlock(const AttnArgs& a) {
    const int bh = static_cast<int>(gridDim.x), blocks = static_cast<int>(gridDim.y);
    const int total = bh * blocks;
    int order = blockIdx.y * bh + blockIdx.x;  // launch order
    if (total <= 2 * a.prefill_slots && order >= a.prefill_slots) order = total - 1 - (order - a.prefill_slots);
    const int bhi = order % bh;
    b = bhi / a.num_heads, hq = bhi - b * a.num_heads, hkv = hq / a.group;
    m0 = (blocks - 1 - order / bh) * kBlockM;
    bool clamped = false;
    kv_len = kv_len_of(a, b, &clamped);
    rows_here = a.seq - m0 < kBlockM ? a.seq - m0 : kBlockM;
    if (threadIdx.x == 0 && clamped) atomicAdd(a.counters + 1, static_cast<unsigned long long>(rows_here));
    key_end = visible_end(a, b, m0 + rows_here - 1, kv_len);
    // A sliding window: the tiles before the block's first row's window are never walked.
    first_tile = kWindow ? visible_begin(a, b, m0, kv_len) / kBlockN : 0;
    const int end_tile = (key_end + kBlockN - 1) / kBlockN;
    num_tiles = end_tile > first_tile ? end_tile - first_tile : 0;
  }
  // The tile processed at step `it` (of num_tiles, from first_tile).
  __device__ __forceinline__ int tile_at(int it) const {
    if (num_tiles <= kAnchorTiles) return first_tile + it;
    return it < kAnchorTiles - 1 ? first_tile + num_tiles - 1 - it : first_tile + it - (kAnchorTiles - 1);
  }
};

// The one K/V address rule (every attention kernel, the fallback and the cache append). Row `key` of sequence b
// lives at outer * sb + h * sh + row * ss in a K or V tensor with strides sb, sh, ss (head h), where (outer, row) =
// kv_locate(): (b, key) without a table (contiguous caches), (table[b][key / kKvBlockSize], key % kKvBlockSize) with
// one (pools of blocks; sb is then the stride between blocks). Within one block rows are ss apart in both modes, so
// a tile inside one block needs one lookup, shared by K and V. key must lie in [0, kv_capacity): the table has
// kv_capacity / kKvBlockSize columns. Callers branch on the table uniformly (the same side in every thread).
struct KvRow {
  int64_t outer;  // multiplies sb: the sequence, or the block
  int row;        // multiplies ss: the key, or the row within the block
};
// The table entry naming the block of row `key` of sequence b: kv_locate's lookup, also for the decode kernel,
// which reads its tiles' block ids ahead of their loads.
__device__ __forceinline__ const int32_t* kv_block_entry(const int32_t* table, int64_t table_stride, int b, int key) {
  return table + b * table_stride + static_cast<unsigned>(key) / kKvBlockSize;  // key >= 0: the division is a shift
}
__device__ __forceinline__ KvRow kv_locate(const int32_t* table, int64_t table_stride, int b, int key) {
  if (table == nullptr) return {b, key};
  return {*kv_block_entry(table, table_stride, b, key), static_cast<int>(static_cast<unsigned>(key) % kKvBlockSize)};
}
__device__ __forceinline__ int64_t kv_row_offset(KvRow r, int64_t sb, int64_t sh, int64_t ss, int h) {
  return r.outer * sb + h * sh + static_cast<int64_t>(r.row) * ss;
}
__device__ __forceinline__ KvRow kv_locate(const AttnArgs& a, int b, int key) {
  return kv_locate(a.block_table, a.block_table_stride, b, key);
}
template <typename T>
__device__ __forceinline__ const T* k_row(const AttnArgs& a, KvRow r, int hkv) {
  return static_cast<const T*>(a.k) + kv_row_offset(r, a.k_sb, a.k_sh, a.k_ss, hkv);
}
template <typename T>
__device__ __forceinline__ const T* v_row(const AttnArgs& a, KvRow r, int hkv) {
  return static_cast<const T*>(a.v) + kv_row_offset(r, a.v_sb, a.v_sh, a.v_ss, hkv);
}

template <typename T>
__device__ __forceinline__ const T* row_ptr(const void* base, int64_t sb, int64_t sh, int64_t ss, int b, int h, int s) {
  return static_cast<const T*>(base) + b * sb + h * sh + static_cast<int64_t>(s) * ss;
}

}  // namespace attn
}  // namespace fdpp
