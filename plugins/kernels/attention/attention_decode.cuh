// Split-KV decode (FlashDecoding with FlashDecoding++'s unified max): the split kernel and the combine kernel.
//
// Split kernel, grid (split, kv head x row block, batch): the CTA streams keys [begin, end) of its split once for
// the 16 query rows it holds (G heads x seq tokens sharing the KV head). Per 16 keys a warp does
//   S = Q K^T   mma m16n8k16 (fp16/bf16 operands, fp32 accumulate)
//   P = 2^(x - phi')  (unified) or the online max (synchronized), in float32
//   O += P V    mma m16n8k8 in tf32: P keeps float32's exponent range (the unified max needs it: e^(s - phi)
//               spans far more than fp16's 65504) and fp16's 10-bit mantissa; fp16/bf16 V is exact in tf32.
// The tf32 fragment trick: the m16n8k16 accumulator gives a thread the scores of keys 2t and 2t+1; ldmatrix.trans
// of V gives it v of keys 2t, 2t+1. Reading the k index of the m16n8k8 product as (t -> key 2t, t+4 -> key 2t+1)
// makes both line up with no shuffle (the sum over k does not care about the order).
// The CTA then adds its 4 warps' partials and writes (sum p v, sum p, guard bits or max) per row to the workspace.
//
// The splits' partials of a row are combined in one of three ways (DecodeCombine, planned in attention_forward):
//  - cluster (sm_90, 2 to 8 splits, at most one CTA per SM, every cluster resident): the splits of a row block form
//    a thread block cluster and the first CTA adds the others' partials from distributed shared memory
//    (cluster_combine_ok in attention_heuristics.h). One kernel per call.
//  - last block (the caller passes combine_counters): each split CTA writes its partials to the workspace and counts
//    itself in its row block's counter; the last to arrive adds them all (in the combine kernel's order: the same
//    bits) and finishes the rows, and its count wraps the counter back to 0. One kernel per call.
//  - combine kernel, one CTA per query row, launched with programmatic dependent launch so that it is resident
//    before the split kernel ends. Two kernels per call.
// Unified rows just add the splits' partials; a row whose guard bits are set is recomputed exactly
// (attention_fallback.cuh) and counted. Synchronized rows rescale by the splits' maxima.
//
// Programmatic dependent launch (sm_90+, both kernels; attention_decode_impl.cuh): a grid may become resident while
// the grid before it in the stream is still running. Each kernel lets its dependents launch only after its own
// griddepcontrol.wait (so at most one grid runs ahead; the split kernel once it has issued its last loads, the
// combine kernel right after the wait), and nothing it does before that wait writes anything or reads anything
// another kernel may write as a value it relies on: the split kernel only issues L2 prefetch hints for its first K/V
// tiles there, reading past_len and a paged cache's block ids at L2 to place them (prefetch_first_tiles; the ids
// also address its first loads after the wait, and are read again and compared then), the combine kernel nothing
// at all. A dependent's wait returns once the whole grid before it has completed, its last-block combines included:
// the next grid sees the output written and the counters zero.
#pragma once

#include <type_traits>

#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_fallback.cuh"
#include "kernels/attention/attention_softmax_state.cuh"
#include "kernels/attention/attention_traits.cuh"

namespace fdpp {
namespace attn {

// --- L2 prefetch hints (sm_90; compiled to nothing on older targets) -------------------------------------------------

// Asks the memory system to bring [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16). A hint: it
// fills no register or shared memory, and L2 is the GPU's point of coherence, so a line prefetched before another
// kernel rewrites it is simply updated there -- no later load can see an old value through it.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(p)), "r"(bytes));
#endif
}

// A line of L2 prefetch hint for the 128-byte line holding p. On every target (sm_80 included).
__device__ __forceinline__ void prefetch_l2_line(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(p)));
}

// Sequence b's kv length as a placement hint for prefetches, clamped to [0, kv_capacity] like kv_len_of. Read
// before griddepcontrol.wait, so it may be stale (the previous kernel may still be writing past_len): it only places
// hints. ld.global.cg reads at L2 and allocates no L1 line, so the real read after the wait cannot hit a line
// cached here.
__device__ __forceinline__ int kv_len_hint(const AttnArgs& a, int b) {
  if (a.mask_mode != MaskMode::kPastLen) return a.kv_capacity;
  long long len = static_cast<long long>(__ldcg(a.past_len + b)) + a.seq;
  if (len > a.kv_capacity) len = a.kv_capacity;
  if (len < 0) len = 0;
  return static_cast<int>(len);
}

// This CTA's split as the hints before griddepcontrol.wait place it (split_range on kv_len_hint).
template <int kTile>
__device__ __forceinline__ SplitRange split_range_hint(const AttnArgs& a, int b, int split) {
  const int len = kv_len_hint(a, b);
  const int first = a.mask_mode == MaskMode::kPastLen
                        ? decode_first_key(clamped_past(__ldcg(a.past_len + b), a.kv_capacity), a.window, len, kTile)
                        : 0;
  return split_range(first, len, a.num_splits, kTile, split);
}

// --- paged caches: the block ids of the split's tiles, read ahead of their loads ------------------------------------
// A key tile is kBlocks = tile / kKvBlockSize KV blocks (one at head_dim >= 80, two at 64), and tiles start on a
// block boundary (split_range). The split kernel reads a tile's ids before the loads that use them: the first
// kStages - 1 tiles' before griddepcontrol.wait (a hint, checked after it: the first loads go out as early as on a
// contiguous cache), the next tile's right after them, and each later tile's one tile ahead, while the tile before
// it computes. No cp.async then waits on a table read, and no table read waits on another.
template <int kBlocks>
struct TileBlocks {
  int32_t id[kBlocks];  // 0 for a block at or past the split's end: never looked up, its rows are zero-filled
};

// The ids of the tile starting at key0 in a split ending at `end`. An entry past `end` is not read (it may lie past
// the table); 0 names a block of the pool (any table entry is an id of it). kHint: read at L2 (ld.global.cg), as
// kv_len_hint, before griddepcontrol.wait.
template <int kBlocks, bool kHint = false>
__device__ __forceinline__ TileBlocks<kBlocks> tile_blocks(const AttnArgs& a, int b, int key0, int end) {
  TileBlocks<kBlocks> t;
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    const int first = key0 + i * kKvBlockSize;
    const int32_t* entry = kv_block_entry(a.block_table, a.block_table_stride, b, first);
    t.id[i] = 0;
    if (first < end) t.id[i] = kHint ? __ldcg(entry) : *entry;
  }
  return t;
}

// What the paged split kernel read before griddepcontrol.wait: its split and the block ids of its first kTiles tiles
// as they were then. The kernel issues its first loads from these ids and issues them again from the ids it reads
// after the wait where the two differ (the previous kernel moved past_len or rewrote the table meanwhile).
template <int kBlocks, int kTiles>
struct FirstBlocks {
  int begin, end;
  TileBlocks<kBlocks> tile[kTiles];
};
template <int D, int Stages>
using DecodeFirstBlocks = FirstBlocks<DecodeTraits<D, Stages>::kTile / kKvBlockSize, Stages - 1>;

// L2 hints for the 128-byte lines of table row b (kv_capacity / kKvBlockSize entries), each hint on an entry of the
// row, issued before past_len's read returns: which entries the split reads depends on past_len, so without them
// the table read would be a second DRAM round trip after it.
template <int kThreads>
__device__ __forceinline__ void prefetch_table_row(const AttnArgs& a, int b) {
  constexpr int kEntriesPerLine = 128 / sizeof(int32_t);
  const int width = a.kv_capacity / kKvBlockSize;
  if (width <= 0) return;
  const int32_t* row = a.block_table + b * a.block_table_stride;
  // Entries 0, 32, 64, ... and the last: one in every line the row touches, whatever its alignment.
  for (int j = threadIdx.x * kEntriesPerLine; j < width + kEntriesPerLine - 1; j += kThreads * kEntriesPerLine)
    prefetch_l2_line(row + (j < width ? j : width - 1));
}

// L2 prefetch of the K and V rows of the first kStages - 1 tiles of this CTA's split (what the pipeline prologue
// loads right after the wait). Every address lies in keys [0, kv_capacity) of (b, hkv): the hint length is clamped,
// and the rows are whole rows the cp.async loads could read. Contiguous rows (seq stride == head_dim): one bulk
// prefetch per tile per tensor, spread over the warps' lane 0; strided rows: one bulk prefetch per row.
// Paged caches: the same keys block by block (a block's rows are contiguous when ss == D), from the ids every thread
// reads for the prologue (tile_blocks with kHint, returned). The table too may be stale before the wait; its entries
// are block ids of the pool at every moment (the caller writes only ids of its pool, 0 for unused entries), so
// every hint, and every load the prologue issues from these ids, lies in the pool.
template <typename T, int D, int Stages>
__device__ __forceinline__ DecodeFirstBlocks<D, Stages> prefetch_first_blocks(const AttnArgs& a, int b, int hkv,
                                                                              int split) {
  using Tr = DecodeTraits<D, Stages>;
  constexpr int kBlocks = Tr::kTile / kKvBlockSize;
  prefetch_table_row<Tr::kThreads>(a, b);
  const SplitRange r = split_range_hint<Tr::kTile>(a, b, split);
  DecodeFirstBlocks<D, Stages> first;
  first.begin = r.begin, first.end = r.end;
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) first.tile[s] = tile_blocks<kBlocks, true>(a, b, r.begin + s * Tr::kTile, r.end);
  const int dim = real_dim<D>(a);  // the rows' real length: a hint never reaches past a row
  const uint32_t kRowBytes = dim * sizeof(T);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int span = r.end - r.begin;
  const int keys = span < (Stages - 1) * Tr::kTile ? span : (Stages - 1) * Tr::kTile;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int64_t sb = t == 0 ? a.k_sb : a.v_sb, sh = t == 0 ? a.k_sh : a.v_sh, ss = t == 0 ? a.k_ss : a.v_ss;
    const T* base = static_cast<const T*>(t == 0 ? a.k : a.v);
#pragma unroll
    for (int j = 0; j < (Stages - 1) * kBlocks; ++j) {
      const int n = keys - j * kKvBlockSize < kKvBlockSize ? keys - j * kKvBlockSize : kKvBlockSize;  // its rows
      const KvRow at = {first.tile[j / kBlocks].id[j % kBlocks], 0};
      if (ss == dim) {
        if (n > 0 && lane == 0 && warp == (2 * j + t) % Tr::kWarps)
          prefetch_l2_bulk(base + kv_row_offset(at, sb, sh, ss, hkv), static_cast<uint32_t>(n) * kRowBytes);
      } else {
        static_assert(Tr::kThreads == 2 * kKvBlockSize, "strided rows: each half of the CTA takes every other block");
        const int row = threadIdx.x % kKvBlockSize;
        if (row < n && threadIdx.x / kKvBlockSize == j % 2)
          prefetch_l2_bulk(base + kv_row_offset({at.outer, row}, sb, sh, ss, hkv), kRowBytes);
      }
    }
  }
  return first;
}

// Before griddepcontrol.wait: L2 hints for the first tiles of this CTA's split; paged caches: also the prologue's
// block ids as read then (prefetch_first_blocks). Contiguous caches return nothing to use.
template <typename T, int D, int Stages>
__device__ __forceinline__ DecodeFirstBlocks<D, Stages> prefetch_first_tiles(const AttnArgs& a, int b, int hkv,
                                                                             int split) {
  using Tr = DecodeTraits<D, Stages>;
  if (a.block_table != nullptr) return prefetch_first_blocks<T, D, Stages>(a, b, hkv, split);
  DecodeFirstBlocks<D, Stages> none = {};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int dim = real_dim<D>(a);
  const uint32_t kRowBytes = dim * sizeof(T);
  const SplitRange r = split_range_hint<Tr::kTile>(a, b, split);
  const int span = r.end - r.begin;
  const int keys = span < (Tr::kStages - 1) * Tr::kTile ? span : (Tr::kStages - 1) * Tr::kTile;
  if (keys <= 0) return none;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int64_t ss = t == 0 ? a.k_ss : a.v_ss;
    const T* row0 = t == 0 ? static_cast<const T*>(a.k) + b * a.k_sb + hkv * a.k_sh + r.begin * a.k_ss
                           : static_cast<const T*>(a.v) + b * a.v_sb + hkv * a.v_sh + r.begin * a.v_ss;
    if (ss == dim) {
#pragma unroll
      for (int j = 0; j < Tr::kStages - 1; ++j) {
        const int n = keys - j * Tr::kTile < Tr::kTile ? keys - j * Tr::kTile : Tr::kTile;
        if (n > 0 && lane == 0 && warp == (2 * j + t) % Tr::kWarps)
          prefetch_l2_bulk(row0 + static_cast<int64_t>(j) * Tr::kTile * dim, static_cast<uint32_t>(n) * kRowBytes);
      }
    } else {
      for (int i = threadIdx.x; i < keys; i += Tr::kThreads) prefetch_l2_bulk(row0 + i * ss, kRowBytes);
    }
  }
#endif
  return none;
}

// --- the workspace combine: the combine kernel and the last-block combine ----------------------------------------
// The other CTAs' partials are read with ld.global.cg (at L2, the point of coherence): the last-block combine reads
// them in the kernel that wrote them, where an L1 line could be stale.

// First workspace slot of query row (b, hq, s): its splits' partials are slots slot .. slot + num_splits - 1.
__device__ __forceinline__ size_t ws_row_slot(const AttnArgs& a, int b, int hq, int s) {
  return (static_cast<size_t>(b * a.num_heads + hq) * a.seq + s) * a.num_splits;
}

// The OR of the guard bits (unified) and the largest max (synchronized) of splits first, first + step, ... < n.
__device__ __forceinline__ uint32_t ws_guard_bits(const AttnArgs& a, size_t slot, int n, int first, int step) {
  uint32_t bits = 0;
  for (int i = first; i < n; i += step) bits |= __ldcg(a.ws_stat + slot + i);
  return bits;
}
__device__ __forceinline__ float ws_max(const AttnArgs& a, size_t slot, int n, int first, int step) {
  float m = -kInf;
  for (int i = first; i < n; i += step) m = fmaxf(m, __uint_as_float(__ldcg(a.ws_stat + slot + i)));
  return m;
}

// A row's partials add in kStrands strands (split i into strand i % kStrands), then the strands in order: the
// combine kernel runs one strand per warp, the last-block combine all of them in one thread, with the same bits.
constexpr int kStrands = 4;
struct RowSum {
  float4 acc;  // dims [4 d4, 4 d4 + 4) of sum p v
  float l;     // sum p
};

// Strand `strand` of row `slot` at dims [4 d4, 4 d4 + 4), each split weighted against the largest max m_top
// (synchronized; 1 in the unified softmax).
template <int D, bool kUnified>
__device__ __forceinline__ RowSum add_strand(const AttnArgs& a, size_t slot, int n, int strand, int d4, float m_top) {
  constexpr int kLanes = D / 4;  // float4s per row
  const float4* acc4 = reinterpret_cast<const float4*>(a.ws_acc) + slot * kLanes + d4;
  RowSum sum = {make_float4(0.f, 0.f, 0.f, 0.f), 0.f};
#pragma unroll 4
  for (int i = strand; i < n; i += kStrands) {
    const float wt =
        kUnified ? 1.f : SynchronizedSoftmax<1>::merge_weight(__uint_as_float(__ldcg(a.ws_stat + slot + i)), m_top);
    const float4 p = __ldcg(acc4 + static_cast<size_t>(i) * kLanes);
    sum.acc.x = fmaf(wt, p.x, sum.acc.x), sum.acc.y = fmaf(wt, p.y, sum.acc.y);
    sum.acc.z = fmaf(wt, p.z, sum.acc.z), sum.acc.w = fmaf(wt, p.w, sum.acc.w);
    sum.l = fmaf(wt, __ldcg(a.ws_l + slot + i), sum.l);
  }
  return sum;
}

// Dims [4 d4, 4 d4 + 4) of output row (b, hq, s): acc * inv.
// Dims past the real head_dim (80 and 96 in the 128 kernels) are not written.
template <typename T>
__device__ __forceinline__ void store_out4(const AttnArgs& a, int b, int hq, int s, int d4, float4 acc, float inv) {
  if (d4 * 4 >= a.head_dim) return;
  T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(s) * a.o_ss + d4 * 4;
  *reinterpret_cast<uint2*>(out) =
      make_uint2(Elem<T>::pack(acc.x * inv, acc.y * inv), Elem<T>::pack(acc.z * inv, acc.w * inv));
}

// The last-block combine's arrival, by every thread of a split CTA whose partials are in the workspace: the CTA
// counts itself in its row block's counter, and the one that brings the count to n_active (the last to finish)
// gets true and sees every split's partials. atomicInc wraps the count to 0 on that arrival, so every call leaves
// the counters zero for the next (which reads them only after its griddepcontrol.wait).
__device__ __forceinline__ bool arrive_last(uint32_t* counter, int n_active) {
  __threadfence();  // release: this thread's partials are visible device-wide before the count is
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    const uint32_t final_count = static_cast<uint32_t>(n_active - 1);
    last = atomicInc(counter, final_count) == final_count;
    if (last) __threadfence();  // acquire: the other CTAs' partials are visible to the loads after the barrier
  }
  return __syncthreads_or(last) != 0;
}

// The rows of this row block that the guard flagged (bit r: row row0 + r, at most 16), recomputed exactly one after
// another by the whole CTA, as the combine kernel does: the recompute of a long row is a memory-bound pass over its
// keys, and one warp alone cannot stream them at full bandwidth (docs/notes-attention.md, "Last-block combine").
// Called by every thread with the same mask; scratch: kRecomputeCtaFloats<D> floats of shared memory.
template <typename T, int D>
__device__ __forceinline__ void recompute_flagged_rows(const AttnArgs& a, int b, int hkv, int row0, uint32_t flagged,
                                                       int kv_len, float* scratch) {
  static_assert(kRecomputeCtaFloats<D> * sizeof(float) <= DecodeTraits<D>::kQBytes, "the scratch is the Q area");
  for (; flagged != 0; flagged &= flagged - 1) {
    const int gr = row0 + __ffs(flagged) - 1;
    recompute_row_cta<T, D>(a, b, hkv * a.group + gr / a.seq, gr % a.seq, kv_len, scratch);
  }
}

// The last-block combine of this row block's rows [row0, row0 + rows_here), one warp per row: the n_active splits'
// partials from the workspace added in the combine kernel's order (a lane per 4 output dims); the rows a split
// flagged are then recomputed by the whole CTA (scratch: kRecomputeCtaFloats<D> floats). Counts rows as the combine
// kernel does.
template <typename T, int D, bool kUnified>
__device__ __forceinline__ void combine_rows_from_workspace(const AttnArgs& a, int b, int hkv, int row0, int rows_here,
                                                            int n_active, int kv_len, float* scratch) {
  constexpr int kLanes = D / 4;  // float4s per row: a lane takes d4 = lane, lane + 32, ...
  static_assert(DecodeTraits<D>::kRows <= 32, "a row block's flags fit one word");
  __shared__ uint32_t flagged_rows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) flagged_rows = 0;
  __syncthreads();
  bool clamped = false;
  kv_len_of(a, b, &clamped);
  for (int r = warp; r < rows_here; r += DecodeTraits<D>::kWarps) {
    const int gr = row0 + r, hq = hkv * a.group + gr / a.seq, s = gr % a.seq;
    const size_t slot = ws_row_slot(a, b, hq, s);
    if (lane == 0 && clamped) atomicAdd(a.counters + 1, 1ull);
    float m_top = -kInf;
    if constexpr (!kUnified) {
      m_top = ws_max(a, slot, n_active, lane, 32);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m_top = fmaxf(m_top, __shfl_xor_sync(0xffffffffu, m_top, o));
    }
    const bool flagged =
        kUnified && (__reduce_or_sync(0xffffffffu, ws_guard_bits(a, slot, n_active, lane, 32)) & kGuardAny);
    if (flagged) {
      if (lane == 0) atomicAdd(a.counters, 1ull), atomicOr(&flagged_rows, 1u << r);
      continue;
    }
    for (int d4 = lane; d4 < kLanes; d4 += 32) {
      RowSum sum = add_strand<D, kUnified>(a, slot, n_active, 0, d4, m_top);
#pragma unroll
      for (int k = 1; k < kStrands; ++k) {
        const RowSum strand = add_strand<D, kUnified>(a, slot, n_active, k, d4, m_top);
        sum.acc.x += strand.acc.x, sum.acc.y += strand.acc.y, sum.acc.z += strand.acc.z, sum.acc.w += strand.acc.w;
        sum.l += strand.l;
      }
      store_out4<T>(a, b, hq, s, d4, sum.acc, sum.l > 0.f ? 1.f / sum.l : 0.f);
    }
  }
  __syncthreads();
  recompute_flagged_rows<T, D>(a, b, hkv, row0, flagged_rows, kv_len, scratch);
}

// Rows [row0, row0 + rows) of a row block whose every split is empty (kv_len 0, a negative past_len): they see no key
// and output 0, and count as clamped, as in the combine kernel.
template <typename T, int D>
__device__ __forceinline__ void write_empty_rows(const AttnArgs& a, int b, int hkv, int row0, int rows) {
  for (int i = threadIdx.x; i < rows * D; i += DecodeTraits<D>::kThreads) {
    if (i % D >= real_dim<D>(a)) continue;
    const int gr = row0 + i / D, hq = hkv * a.group + gr / a.seq, s = gr % a.seq;
    static_cast<T*>(a.out)[b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(s) * a.o_ss + i % D] =
        Elem<T>::from_float(0.f);
  }
  bool clamped = false;
  kv_len_of(a, b, &clamped);
  if (threadIdx.x == 0 && clamped) atomicAdd(a.counters + 1, static_cast<unsigned long long>(rows));
}

template <typename T, int D, bool kUnified, int Stages>
__global__ void __launch_bounds__(128, 2) decode_split_kernel(const AttnArgs a) {
  using Tr = DecodeTraits<D, Stages>;
  using State = std::conditional_t<kUnified, UnifiedMaxSoftmax<2, true>, SynchronizedSoftmax<2, true>>;
  constexpr int kNT = Tr::kNTiles;
  extern __shared__ __align__(128) unsigned char smem[];

  const int split = blockIdx.x;
  const int hkv = blockIdx.y / a.row_blocks;
  const int rb = blockIdx.y - hkv * a.row_blocks;
  const int b = blockIdx.z;
  // Only the 3-stage kernel combines in clusters (its receive area holds 7 partials; launch_split refuses the
  // others), so the 2- and 4-stage kernels carry no cluster code.
  const bool cluster = Stages == 3 && a.cluster_combine;
  const bool last_block = a.combine_counters != nullptr;  // the host sets them only with several splits, no cluster
  // With programmatic dependent launch this CTA may run while the previous kernel in the stream is still writing
  // (the combine of the previous call, RoPE + cache append, the GEMM producing Q). Before the wait: L2 hints only,
  // which cannot change what any load returns, and (paged) the block ids as they are then, whose loads are issued
  // again after the wait if the ids read then differ. Everything that kernel may write -- Q, the new K/V rows,
  // past_len, the table, the workspace, the output, the counters -- is read or written only after it.
  const DecodeFirstBlocks<D, Stages> hint = prefetch_first_tiles<T, D, Stages>(a, b, hkv, split);
  pdl_wait_primary();  // the previous grid has completed and its memory is visible from here on
  // The next grid may start once this CTA has issued its last tile's loads (kStages tiles before the end of the
  // key loop, below), neither earlier nor later. Before the wait, every later call's grids would become resident one
  // after another while the first still ran, each prefetching for a call far ahead; right after it, the next grid
  // (the combine, or the next call's split grid) would sit resident for the whole key loop and prefetch too early
  // (the timings of both alternatives: docs/notes-attention.md, "What was tried").
  const int kv_len = kv_len_of(a, b);
  const int first_key = decode_first_key(a, b, kv_len, Tr::kTile);  // a sliding window skips the tiles before it
  const SplitRange range = split_range(first_key, kv_len, a.num_splits, Tr::kTile, split);
  const int rows_total = a.group * a.seq;
  const int row0 = rb * Tr::kRows;
  const int rows_here = rows_total - row0 < Tr::kRows ? rows_total - row0 : Tr::kRows;
  if (range.begin >= range.end) {
    // The combines derive the same range and skip this split (the last-block combine does not count it). Where the
    // split kernel writes the output (one split, a cluster, the last-block combine) the first split is empty only
    // when all are (kv_len 0): it writes the rows. In a cluster every CTA still takes part in its two barriers.
    if (split == 0 && (a.num_splits == 1 || cluster || last_block)) write_empty_rows<T, D>(a, b, hkv, row0, rows_here);
    if (cluster) {
      cluster_sync();
      cluster_sync();
    }
    return;
  }

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  const uint32_t q_smem = smem_addr(smem);
  const uint32_t kv_smem = q_smem + Tr::kQBytes;  // stage s: K at s * 2 * tile, V right after it

  // Query rows -> shared memory (zero-filled padding rows and dims past real_dim), in the first cp.async group with
  // tile 0.
  const int dim_chunks = real_dim<D>(a) / 8;
  for (int i = tid; i < Tr::kRows * Tr::kChunks; i += Tr::kThreads) {
    const int r = i / Tr::kChunks, c = i - r * Tr::kChunks;
    const bool valid = r < rows_here && c < dim_chunks;
    const int gr = row0 + (r < rows_here ? r : 0);
    const int hq = hkv * a.group + gr / a.seq, s = gr % a.seq;
    const T* src = row_ptr<T>(a.q, a.q_sb, a.q_sh, a.q_ss, b, hq, s) + (valid ? c * 8 : 0);
    cp_async_16(q_smem + swizzled<Tr::kRowBytes>(r, c), src, valid);
  }

  // Each thread copies chunk `c` of rows `lrow0 + pass * kRowsPerPass` of every K and V tile.
  const int c = tid % Tr::kChunks, lrow0 = tid / Tr::kChunks;
  const uint32_t dst0 = swizzled<Tr::kRowBytes>(lrow0, c);
  // This thread's chunk lies past the real head dims (80 and 96 in the 128 kernel): it zero-fills, reading nothing.
  const bool chunk_real = c < dim_chunks;
  const int c_src = chunk_real ? c : 0;
  const int range_end = chunk_real ? range.end : range.begin;  // no row of a padded chunk is read
  const int num_tiles = (range.end - range.begin + Tr::kTile - 1) / Tr::kTile;
  // Contiguous: key at k_base + key * k_ss. Paged: the tile's kBlocks block ids, read ahead (TileBlocks); a row
  // past the end reads nothing (zero-fill) from a valid row, also in a block past the end (id 0).
  const bool paged = a.block_table != nullptr;
  const T* k_base = k_row<T>(a, KvRow{b, 0}, hkv) + c_src * 8;
  const T* v_base = v_row<T>(a, KvRow{b, 0}, hkv) + c_src * 8;
  constexpr int kBlocks = Tr::kTile / kKvBlockSize;
  constexpr int kPassesPerBlock = kKvBlockSize / Tr::kRowsPerPass;
  static_assert(Tr::kTile % kKvBlockSize == 0 && kKvBlockSize % Tr::kRowsPerPass == 0, "a pass stays in one block");
  using Blocks = TileBlocks<kBlocks>;
  auto pass_dst = [&](int p) { return swizzled_pass<Tr::kRowBytes, Tr::kRowsPerPass>(dst0, lrow0, c, p); };
  auto load_tile = [&](int tile, const Blocks& ids) {
    const int key0 = range.begin + tile * Tr::kTile;
    const uint32_t kdst = kv_smem + (tile % Tr::kStages) * 2 * Tr::kTileBytes;
    const uint32_t vdst = kdst + Tr::kTileBytes;
    if (paged) {
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) {
        const int first = key0 + i * kKvBlockSize;
        const KvRow at = {ids.id[i], 0};
        const T* k_blk = k_row<T>(a, at, hkv) + c_src * 8;
        const T* v_blk = v_row<T>(a, at, hkv) + c_src * 8;
#pragma unroll
        for (int p = i * kPassesPerBlock; p < (i + 1) * kPassesPerBlock; ++p) {
          const int r = lrow0 + (p - i * kPassesPerBlock) * Tr::kRowsPerPass;  // row within the block
          const bool valid = first + r < range_end;
          const int64_t rr = valid ? r : 0;
          cp_async_16(kdst + pass_dst(p), k_blk + rr * a.k_ss, valid);
          cp_async_16(vdst + pass_dst(p), v_blk + rr * a.v_ss, valid);
        }
      }
      return;
    }
#pragma unroll
    for (int p = 0; p < Tr::kPasses; ++p) {
      const int key = key0 + lrow0 + p * Tr::kRowsPerPass;
      const bool valid = key < range_end;
      const int64_t kk = valid ? key : 0;
      cp_async_16(kdst + pass_dst(p), k_base + kk * a.k_ss, valid);
      cp_async_16(vdst + pass_dst(p), v_base + kk * a.v_ss, valid);
    }
  };
  auto blocks_of = [&](int tile) { return tile_blocks<kBlocks>(a, b, range.begin + tile * Tr::kTile, range.end); };
  // Paged: the ids of the prologue's tiles and the next one, read now (all at once); the prologue's loads go out
  // from the ids read before the wait (the hint), which the ones read now confirm below.
  Blocks first_ids[Tr::kStages - 1], next_ids = {};
  if (paged) {
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) first_ids[s] = blocks_of(s);
    next_ids = blocks_of(Tr::kStages - 1);
  }
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, hint.tile[s]);
    cp_async_commit();
  }

  // This thread's two rows (g and g + 8 of the fragment): their token and last visible key.
  int row_begin[2], row_end[2];  // the first visible key (a sliding window), one past the last
  int row_s[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int lr = g + 8 * r;
    const int gr = row0 + (lr < rows_here ? lr : 0);
    row_s[r] = gr % a.seq;
    row_begin[r] = visible_begin(a, b, row_s[r], kv_len);
    row_end[r] = visible_end(a, b, row_s[r], kv_len);
  }
  // Tiles within [masked_below, unmasked_end) need no mask (every row sees every key of them): the window of the
  // call's last token starts at masked_below.
  const int unmasked_end = a.mask_mode == MaskMode::kBias ? -1 : visible_end(a, b, 0, kv_len);
  const int masked_below = visible_begin(a, b, a.seq - 1, kv_len);
  const bool capped = a.softcap_log2 > 0.f;
  const float x_shift = kUnified ? a.phi_log2 : 0.f;

  State state;
  state.init();
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // The query fragments: loaded once (kQInRegisters), or per k-step of every tile (head_dim 256).
  constexpr int kQFrags = Tr::kQInRegisters ? D / 16 : 1;
  uint32_t qa[kQFrags][4];
  auto load_q = [&](uint32_t(&frag)[4], int ks) {
    const int mi = lane >> 3;
    ldmatrix_x4(frag, q_smem + swizzled<Tr::kRowBytes>((mi & 1) * 8 + (lane & 7), ks * 2 + (mi >> 1)));
  };

  if (paged) {
    // The hint was read before the wait: where the split or an id has changed since, this thread waits for its
    // loads and issues them again from the ids read after the wait (its own cp.async groups: no barrier needed).
    bool stale = hint.begin != range.begin || hint.end != range.end;
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s)
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) stale |= hint.tile[s].id[i] != first_ids[s].id[i];
    if (stale) {
      cp_async_wait<0>();
#pragma unroll
      for (int s = 0; s < Tr::kStages - 1; ++s) {
        if (s < num_tiles) load_tile(s, first_ids[s]);
        cp_async_commit();
      }
    }
  }

  // The iteration that issues the last tile's loads (the prologue issued them all when there are fewer tiles).
  const int trigger_tile = num_tiles > Tr::kStages ? num_tiles - Tr::kStages : 0;
  for (int tile = 0; tile < num_tiles; ++tile) {
    if (tile == trigger_tile) pdl_launch_dependents();
    cp_async_wait<Tr::kStages - 2>();
    __syncthreads();
    if constexpr (Tr::kQInRegisters) {
      if (tile == 0) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) load_q(qa[ks], ks);
      }
    }
    if (tile + Tr::kStages - 1 < num_tiles) {
      load_tile(tile + Tr::kStages - 1, next_ids);
      if (paged) next_ids = blocks_of(tile + Tr::kStages);  // used one iteration later: off the critical path
    }
    cp_async_commit();

    const uint32_t kbuf = kv_smem + (tile % Tr::kStages) * 2 * Tr::kTileBytes;
    const uint32_t vbuf = kbuf + Tr::kTileBytes;
    const int wkey0 = warp * Tr::kKeysPerWarp;  // this warp's first key within the tile

    // S = Q K^T for this warp's keys.
    float sc[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      if constexpr (!Tr::kQInRegisters) load_q(qa[0], ks);
      const uint32_t(&q_frag)[4] = qa[Tr::kQInRegisters ? ks : 0];
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        const int mi = lane >> 3;
        uint32_t kb[4];
        ldmatrix_x4(kb,
                    kbuf + swizzled<Tr::kRowBytes>(wkey0 + np * 16 + (mi >> 1) * 8 + (lane & 7), ks * 2 + (mi & 1)));
        mma_16816<T>(sc[2 * np], q_frag, kb[0], kb[1]);
        mma_16816<T>(sc[2 * np + 1], q_frag, kb[2], kb[3]);
      }
    }

    // Scores -> p, in place.
    const int key0 = range.begin + tile * Tr::kTile + wkey0;  // key of sc[0][0] for t4 = 0
    const bool masked = key0 - wkey0 + Tr::kTile > unmasked_end || key0 - wkey0 < masked_below;
    if (capped) {  // soft-capping (uniform over the grid): x = C tanh(x / C) before the mask
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = softcap_x(a, sc[n][e] * a.scale_log2) - x_shift;
    } else {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = fmaf(sc[n][e], a.scale_log2, -x_shift);
    }
    if (masked) {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, key = key0 + n * 8 + 2 * t4 + (e & 1);
          bool visible = key < row_end[r] && key >= row_begin[r];
          if (a.mask_mode == MaskMode::kBias && visible) {
            bool unmasked;
            sc[n][e] += bias_log2<T>(a, b, row_s[r], key, unmasked);
            visible = unmasked;
          }
          if (!visible) sc[n][e] = -kInf;
        }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tmax = -kInf;
      if constexpr (State::kRescales) {
#pragma unroll
        for (int n = 0; n < kNT; ++n) tmax = fmaxf(tmax, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));
      }
      alpha[r] = state.begin_tile(r, tmax);
    }
    if constexpr (State::kRescales) {
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
        o[i][0] *= alpha[0], o[i][1] *= alpha[0], o[i][2] *= alpha[1], o[i][3] *= alpha[1];
    }
    if (masked) {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = state.template exp<true>(e >> 1, sc[n][e]);
    } else {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = state.template exp<false>(e >> 1, sc[n][e]);
    }

    // O += P V in tf32, 8 keys per step.
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      // p is already tf32 (the state rounded it): pass the bits.
      const uint32_t pa[4] = {__float_as_uint(sc[n][0]), __float_as_uint(sc[n][2]), __float_as_uint(sc[n][1]),
                              __float_as_uint(sc[n][3])};
#pragma unroll
      for (int db = 0; db < D / 32; ++db) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vbuf + swizzled<Tr::kRowBytes>(wkey0 + n * 8 + (lane & 7), db * 4 + (lane >> 3)));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 vf = Elem<T>::to_float2(vb[j]);
          mma_1688_tf32(o[db * 4 + j], pa, __float_as_uint(vf.x), __float_as_uint(vf.y));
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: reuse them for the reduction

  // Cross-warp reduction in shared memory, then one partial per valid row to the workspace.
  state.finish();
  float* red = reinterpret_cast<float*>(smem + Tr::kQBytes);
  float* red_l = red + Tr::kWarps * Tr::kRows * Tr::kRedStride;
  uint32_t* red_stat = reinterpret_cast<uint32_t*>(red_l + Tr::kWarps * Tr::kRows);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* dst = red + (warp * Tr::kRows + g + 8 * r) * Tr::kRedStride + 2 * t4;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) *reinterpret_cast<float2*>(dst + i * 8) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
    if (t4 == 0) {
      red_l[warp * Tr::kRows + g + 8 * r] = state.l[r];
      uint32_t stat;
      if constexpr (kUnified) {
        stat = state.guard_bits(r, a.lo_log2, a.hi_log2, a.max_floor_log2);
      } else {
        stat = __float_as_uint(state.m[r]);
      }
      red_stat[warp * Tr::kRows + g + 8 * r] = stat;
    }
  }
  __syncthreads();

  // This CTA's partial of row r, float4 d4: the warps' sums of p v and p, the OR of their guard bits, and
  // (synchronized) their largest max m_all, which the sums are rescaled to.
  struct RowPartial {
    float4 acc;
    float l;
    uint32_t stat;
    float m_all;
  };
  auto own_partial = [&](int r, int d4) {
    float wt[Tr::kWarps];
    float m_all = -kInf;
    if constexpr (!kUnified) {
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) m_all = fmaxf(m_all, __uint_as_float(red_stat[w * Tr::kRows + r]));
    }
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      wt[w] = kUnified ? 1.f : State::merge_weight(__uint_as_float(red_stat[w * Tr::kRows + r]), m_all);
    }
    RowPartial p = {make_float4(0.f, 0.f, 0.f, 0.f), 0.f, 0u, m_all};
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float4 part = *reinterpret_cast<const float4*>(red + (w * Tr::kRows + r) * Tr::kRedStride + d4 * 4);
      p.acc.x = fmaf(wt[w], part.x, p.acc.x), p.acc.y = fmaf(wt[w], part.y, p.acc.y);
      p.acc.z = fmaf(wt[w], part.z, p.acc.z), p.acc.w = fmaf(wt[w], part.w, p.acc.w);
      p.l = fmaf(wt[w], red_l[w * Tr::kRows + r], p.l);
      p.stat |= red_stat[w * Tr::kRows + r];
    }
    return p;
  };

  // The cluster combine: the splits of this row block are one thread block cluster. Once every CTA is past its key
  // loop (barrier A) the others store their row partials into the first CTA's pipeline buffers (distributed shared
  // memory); after barrier B the first CTA adds them to its own and finishes the rows as with one split. No
  // workspace round trip and no combine kernel. Unified partials just add; synchronized ones rescale by their max.
  float* recv = reinterpret_cast<float*>(smem + Tr::kQBytes + Tr::kRedAllBytes);  // slot i: split i + 1
  const int n_active = active_splits(first_key, kv_len, range.chunk);             // the non-empty splits
  const int n_splits = cluster ? n_active : 1;
  if (cluster) {
    cluster_sync();  // A: the first CTA's receive area is free
    if (split > 0) {
      const uint32_t slot = smem_addr(recv + (split - 1) * Tr::kRecvSlotFloats);
      for (int i = tid; i < rows_here * (D / 4); i += Tr::kThreads) {
        const int r = i / (D / 4), d4 = i - r * (D / 4);
        const RowPartial p = own_partial(r, d4);
        st_cluster(cluster_map(slot + (r * D + d4 * 4) * 4, 0), p.acc);
        if (d4 == 0) {
          st_cluster(cluster_map(slot + (Tr::kRows * D + r) * 4, 0), __float_as_uint(p.l));
          const uint32_t stat = kUnified ? p.stat : __float_as_uint(p.m_all);
          st_cluster(cluster_map(slot + (Tr::kRows * (D + 1) + r) * 4, 0), stat);
        }
      }
    }
    cluster_sync();  // B: every partial is in the first CTA's shared memory
    if (split > 0) return;
  }
  auto recv_l = [&](int i, int r) { return recv[i * Tr::kRecvSlotFloats + Tr::kRows * D + r]; };
  auto recv_stat = [&](int i, int r) {
    return __float_as_uint(recv[i * Tr::kRecvSlotFloats + Tr::kRows * (D + 1) + r]);
  };

  // With one split (or as the first CTA of a cluster) this CTA holds whole rows: it normalizes and writes the output
  // itself and no combine kernel runs (one launch less on the critical path); guard-flagged rows are recomputed
  // below by this CTA's warps. Otherwise it writes its row partials to the workspace.
  const bool direct = a.num_splits == 1 || cluster;
  for (int i = tid; i < rows_here * (D / 4); i += Tr::kThreads) {
    const int r = i / (D / 4), d4 = i - r * (D / 4);
    const RowPartial own = own_partial(r, d4);
    float4 acc = own.acc;
    float l = own.l;
    const float m_all = own.m_all;
    if (n_splits > 1) {  // the cluster's other splits
      float m_top = m_all;
      if constexpr (!kUnified) {
        for (int j = 0; j + 1 < n_splits; ++j) m_top = fmaxf(m_top, __uint_as_float(recv_stat(j, r)));
      }
      const float w_own = kUnified ? 1.f : State::merge_weight(m_all, m_top);
      acc.x *= w_own, acc.y *= w_own, acc.z *= w_own, acc.w *= w_own, l *= w_own;
      for (int j = 0; j + 1 < n_splits; ++j) {
        const float wt = kUnified ? 1.f : State::merge_weight(__uint_as_float(recv_stat(j, r)), m_top);
        const float4 part = *reinterpret_cast<const float4*>(recv + j * Tr::kRecvSlotFloats + r * D + d4 * 4);
        acc.x = fmaf(wt, part.x, acc.x), acc.y = fmaf(wt, part.y, acc.y);
        acc.z = fmaf(wt, part.z, acc.z), acc.w = fmaf(wt, part.w, acc.w);
        l = fmaf(wt, recv_l(j, r), l);
      }
    }
    const int gr = row0 + r;
    const int hq = hkv * a.group + gr / a.seq, s = gr % a.seq;
    if (direct) {  // a flagged row's values here are overwritten by its recompute below
      store_out4<T>(a, b, hq, s, d4, acc, l > 0.f ? 1.f / l : 0.f);
      continue;
    }
    const size_t slot = ws_row_slot(a, b, hq, s) + split;
    *reinterpret_cast<float4*>(a.ws_acc + slot * D + d4 * 4) = acc;
    if (d4 == 0) {
      a.ws_l[slot] = l;
      a.ws_stat[slot] = kUnified ? own.stat : __float_as_uint(m_all);
    }
  }
  if (!direct) {
    // The combine kernel adds the partials, or the last of this row block's split CTAs to finish does (the
    // recompute scratch in the Q area, as below).
    const size_t counter = (static_cast<size_t>(b) * a.num_kv_heads + hkv) * a.row_blocks + rb;
    if (last_block && arrive_last(a.combine_counters + counter, n_active))
      combine_rows_from_workspace<T, D, kUnified>(a, b, hkv, row0, rows_here, n_active, kv_len,
                                                  reinterpret_cast<float*>(smem));
    return;
  }
  // Direct rows: count clamped lengths; recompute guard-flagged rows with the whole CTA (scratch in the Q area).
  __syncthreads();  // every normalized row is stored before a recompute overwrites it
  bool clamped = false;
  kv_len_of(a, b, &clamped);
  uint32_t flagged = 0;  // the same in every thread: each reads every row's bits
  for (int r = 0; r < rows_here; ++r) {
    if (warp == r % Tr::kWarps && lane == 0 && clamped) atomicAdd(a.counters + 1, 1ull);
    if constexpr (kUnified) {
      uint32_t stat = 0;
#pragma unroll
      for (int w = 0; w < Tr::kWarps; ++w) stat |= red_stat[w * Tr::kRows + r];
      for (int j = 0; j + 1 < n_splits; ++j) stat |= recv_stat(j, r);
      if (stat & kGuardAny) {
        flagged |= 1u << r;
        if (threadIdx.x == 0) atomicAdd(a.counters, 1ull);
      }
    }
  }
  recompute_flagged_rows<T, D>(a, b, hkv, row0, flagged, kv_len, reinterpret_cast<float*>(smem));
}

// One CTA (128 threads) per query row (b, hq, s). Warp w adds splits w, w + 4, ... (lane = 4 output dims), so the
// loads of many splits are in flight at once; then the 4 warps' sums add in shared memory.
template <typename T, int D, bool kUnified>
__global__ void __launch_bounds__(128) decode_combine_kernel(const AttnArgs a) {
  using Tr = DecodeTraits<D>;
  constexpr int kLanes = D / 4;  // float4s of the row: lane takes d4 = lane, lane + 32, ...
  static_assert(kStrands == 4, "one strand per warp");
  __shared__ __align__(16) float part[kStrands][D];
  __shared__ float part_l[kStrands], part_m[kStrands];
  const int row = blockIdx.x;
  const int s = row % a.seq;
  const int hq = (row / a.seq) % a.num_heads;
  const int b = row / (a.seq * a.num_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The split grid is launched programmatically too, so the kernel before it may still be writing past_len when
  // this grid starts: read nothing before the wait (completion of the split grid implies that kernel's).
  pdl_wait_primary();       // the split kernel's partials (and everything before it) are visible from here on
  pdl_launch_dependents();  // after the wait, as in the split kernel: at most one grid ahead
  bool clamped = false;
  const int kv_len = kv_len_of(a, b, &clamped);
  const int first_key = decode_first_key(a, b, kv_len, Tr::kTile);
  const SplitRange first = split_range(first_key, kv_len, a.num_splits, Tr::kTile, 0);
  const int n = active_splits(first_key, kv_len, first.chunk);

  if (threadIdx.x == 0 && clamped) atomicAdd(a.counters + 1, 1ull);
  T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(s) * a.o_ss;
  const size_t base = ws_row_slot(a, b, hq, s);

  float M = -kInf;  // synchronized: the largest of the splits' maxima
  if constexpr (kUnified) {
    if (__syncthreads_or(ws_guard_bits(a, base, n, threadIdx.x, 128) & kGuardAny)) {
      if (threadIdx.x == 0) atomicAdd(a.counters, 1ull);
      recompute_row_cta<T, D>(a, b, hq, s, kv_len);
      return;
    }
  } else {
    M = ws_max(a, base, n, threadIdx.x, 128);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) part_m[warp] = M;
    __syncthreads();
    M = fmaxf(fmaxf(part_m[0], part_m[1]), fmaxf(part_m[2], part_m[3]));
  }
  float l = 0.f;  // the same sum of p for every d4
  for (int d4 = lane; d4 < kLanes; d4 += 32) {
    const RowSum sum = add_strand<D, kUnified>(a, base, n, warp, d4, M);
    *reinterpret_cast<float4*>(&part[warp][d4 * 4]) = sum.acc;
    l = sum.l;
  }
  if (lane == 0) part_l[warp] = l;
  __syncthreads();
  const float l_all = part_l[0] + part_l[1] + part_l[2] + part_l[3];
  const float inv = l_all > 0.f ? 1.f / l_all : 0.f;
  for (int d = threadIdx.x; d < real_dim<D>(a); d += 128)
    out[d] = Elem<T>::from_float((part[0][d] + part[1][d] + part[2][d] + part[3][d]) * inv);
}

// One CTA per query row, float32 online softmax over all its keys: float32 inputs, and a forced exact path.
template <typename T, int D>
__global__ void __launch_bounds__(128) rowwise_kernel(const AttnArgs a) {
  const int row = blockIdx.x;
  const int s = row % a.seq;
  const int hq = (row / a.seq) % a.num_heads;
  const int b = row / (a.seq * a.num_heads);
  bool clamped = false;
  const int kv_len = kv_len_of(a, b, &clamped);
  if (threadIdx.x == 0 && clamped) atomicAdd(a.counters + 1, 1ull);
  recompute_row_cta<T, D>(a, b, hq, s, kv_len);
}

}  // namespace attn
}  // namespace fdpp
