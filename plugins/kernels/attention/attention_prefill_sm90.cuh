// Prefill on Hopper: the prefill kernel's algorithm (attention_prefill.cuh: work order, anchored unified max or
// synchronized softmax, masks, guard and in-launch fallback) with warpgroup MMAs (wgmma) instead of mma.sync.
//
// A CTA = two consumer warpgroups of 64 query rows each (128 rows of one query head) + one producer warp. The
// producer streams Q once and then the 64-key K/V tiles through a 4-stage ring in shared memory (cp.async into the
// 128-byte swizzled layout wgmma reads; each stage has a "full" mbarrier the copies arrive on and an "empty" one
// the 8 consumer warps arrive on when they are done with it). The warpgroups are not tied to each other by block
// barriers, so one warpgroup's softmax overlaps the other's matrix products. Per tile and warpgroup:
//   S = Q K^T   wgmma m64n64k16 x (D / 16), both operands from shared memory
//   P = 2^(x - phi_row) (unified, after the anchor tiles) or the online max (synchronized), in registers
//   O += P V    wgmma m64nDk16 x 4, P from registers (its accumulator layout is the A-fragment layout), V MN-major
// Every warp holds 16 rows in the m16n8 fragment layout, so the softmax code is the mma.sync kernel's with one
// fragment per warp.
#pragma once

#include <atomic>
#include <type_traits>

#include "fdpp_contract_constants.h"
#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_fallback.cuh"
#include "kernels/attention/attention_softmax_state.cuh"
#include "kernels/attention/attention_wgmma.cuh"

namespace fdpp {
namespace attn {

template <int D>
struct PrefillSm90Traits {
  static constexpr int kConsumerWarps = 8;  // two warpgroups
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;
  static constexpr int kBlockM = contract::kAttentionPrefillAnchorBlockM;  // query rows per CTA (64 per warpgroup)
  static constexpr int kBlockN = contract::kAttentionPrefillBlockN;        // keys per tile
  static constexpr int kNT = kBlockN / 8;
  static constexpr int kStages = 4;
  static constexpr int kAnchorTiles = contract::kAttentionPrefillAnchorTiles;  // as the mma.sync kernel
  static constexpr int kChunks = D / 8;                                        // 16-byte chunks per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;
  static constexpr int kScratchBytes = kConsumerWarps * D * 4;  // fallback: one scaled query row per warp
  static constexpr int kBarrierBytes = (2 * kStages + 1) * 8;
  // + 1024: the dynamic shared memory base is rounded up to the swizzle's 1024-byte alignment.
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * 2 * kTileBytes + kScratchBytes + kBarrierBytes;

  static_assert(D == 64 || D == 128, "the Hopper prefill supports head_dim 64 and 128");
  static_assert(kBlockN == contract::kAttentionKvBlockSize,
                "a key tile is one KV block: one table lookup per tile (paged caches)");
  static_assert(kQBytes % 1024 == 0 && kTileBytes % 1024 == 0, "every swizzle panel 1024-byte aligned");
};

// The producer's cp.async copies of kRows rows into the 128-byte swizzled panels at dst0 (and, for a K/V tile,
// the same rows of src1 to dst1), 16 bytes per lane and step: rows past valid_rows and head dims past the real ones
// (80, 96 in the 128 kernel) are zero-filled and read nothing, so cache garbage past a sequence's end never reaches
// a product. kUnroll: shape 4's producer warp has registers to spare, shape 5's producer warpgroup kProducerRegs.
template <typename T, int D, int kRows, int kUnroll, bool kPair>
__device__ __forceinline__ void sm90_copy_rows(const AttnArgs& a, int valid_rows, int lane, const T* src0,
                                               int64_t stride0, uint32_t dst0, const T* src1 = nullptr,
                                               int64_t stride1 = 0, uint32_t dst1 = 0) {
  constexpr int kChunks = D / 8;
  const int dim_chunks = real_dim<D>(a) / 8;
#pragma unroll kUnroll
  for (int i = lane; i < kRows * kChunks; i += 32) {
    const int r = i / kChunks, c = i - r * kChunks;
    const bool valid = r < valid_rows && c < dim_chunks;
    const int64_t rr = valid ? r : 0, cc = valid ? c * 8 : 0;
    const uint32_t off = sw128_offset(kRows, r, c);
    cp_async_16(dst0 + off, src0 + rr * stride0 + cc, valid);
    if constexpr (kPair) cp_async_16(dst1 + off, src1 + rr * stride1 + cc, valid);
  }
}

// The shared memory of the wgmma kernels (shapes 4 and 5), from the dynamic base rounded up to the swizzle's
// 1024-byte alignment: Q, the ring (stage s: K at kv + 2 s tiles, V right after it), the fallback's scratch, and
// the barriers q_full, full[s], empty[s].
template <int D>
struct Sm90Smem {
  using Tr = PrefillSm90Traits<D>;
  uint32_t q, kv, scratch, q_full;
  __device__ __forceinline__ explicit Sm90Smem(const unsigned char* smem) {
    q = (smem_addr(smem) + 1023u) & ~1023u;
    kv = q + Tr::kQBytes;
    scratch = kv + Tr::kStages * 2 * Tr::kTileBytes;
    q_full = scratch + Tr::kScratchBytes;
  }
  __device__ __forceinline__ uint32_t full(int s) const { return q_full + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return q_full + 8 * (1 + Tr::kStages + s); }
};

using Anchoring = std::integral_constant<bool, false>;
using Frozen = std::integral_constant<bool, true>;

// Calls step(it, phase) for the tiles 0 .. num_tiles - 1 in order: the phase is Frozen once the anchored unified
// max has frozen (after the anchor tiles; never in the synchronized softmax), else Anchoring (a type, so that the
// step's code tests it at compile time, never per score).
template <bool kUnified, int kAnchorTiles, typename State, typename Step>
__device__ __forceinline__ void sm90_walk_tiles(int num_tiles, State& state, Step& step) {
  const int anchor_end = kUnified && num_tiles > kAnchorTiles ? kAnchorTiles : num_tiles;
  int it = 0;
  for (; it < anchor_end; ++it) step(it, Anchoring{});
  if constexpr (kUnified) {
    if (it < num_tiles) state.freeze();
    for (; it < num_tiles; ++it) step(it, Frozen{});
  }
}

// p for one score in the given phase: the anchored unified max frozen, anchoring, or the synchronized softmax.
template <bool kFrozen, bool kUnified, typename State>
__device__ __forceinline__ float phase_exp(State& state, int r, float x) {
  if constexpr (kFrozen) return state.exp_frozen(r, x);
  else if constexpr (kUnified) return state.exp_anchoring(r, x);
  else return state.template exp<false>(r, x);
}

// A consumer warp's rows in a 128-row block of the wgmma kernels (shapes 4 and 5) and the key bounds its mask
// reads. cw: the consumer warp (0-7); it holds rows 16 cw .. 16 cw + 15, its warpgroup wg rows 64 wg .. 64 wg + 63.
struct Sm90WarpRows {
  int g, t4, wg, wrow0, wg_row0;
  int wg_end;        // keys past it: no row of the warpgroup sees them (0 when it has no rows)
  int unmasked_end;  // every row of the warp sees every key below it (-1 under a bias mask)
  int masked_below;  // a sliding window: from here on every row of the warp sees the keys
  int past;          // past_len clamped like kv_len_of(): never an int overflow
  bool causal;

  __device__ __forceinline__ Sm90WarpRows(const AttnArgs& a, int b, int m0, int rows_here, int kv_len, int cw,
                                          int lane) {
    g = lane >> 2, t4 = lane & 3, wg = cw >> 2;
    wrow0 = cw * 16, wg_row0 = wg * 64;
    const int wg_last = wg_row0 + 63 < rows_here - 1 ? wg_row0 + 63 : rows_here - 1;
    wg_end = wg_row0 < rows_here ? visible_end(a, b, m0 + wg_last, kv_len) : 0;
    unmasked_end = a.mask_mode == MaskMode::kBias ? -1 : visible_end(a, b, m0 + wrow0, kv_len);
    causal = a.mask_mode == MaskMode::kPastLen;
    const long long past_raw = causal ? a.past_len[b] : 0;
    past = past_raw < 0 ? -1 : (past_raw > a.kv_capacity ? a.kv_capacity : static_cast<int>(past_raw));
    masked_below = visible_begin(a, b, m0 + (wrow0 + 15 < rows_here - 1 ? wrow0 + 15 : rows_here - 1), kv_len);
  }
};

// Scores of the 64-key tile at key0 -> x = s * log2(e) (soft-capped; minus phi_row once the unified max is frozen:
// one FFMA per score), masked keys -inf. The mask is written out per score as in attention_prefill.cuh.
// kExtras = false compiles the soft cap and the sliding window out (the caller has neither): at head_dim 64 that
// keeps shape 4 at 109 registers, two CTAs per SM, where the extras make it 127 and one.
template <typename T, int kNT, int kBlockN, bool kFrozen, typename State, bool kExtras = true>
__device__ __forceinline__ void sm90_scale_and_mask(const AttnArgs& a, const State& state, const Sm90WarpRows& w, int b,
                                                    int m0, int rows_here, int kv_len, int key0, float (&sc)[kNT][4]) {
  if (kExtras && a.softcap_log2 > 0.f) {  // soft-capping (uniform over the grid): x = C tanh(x / C) before the mask
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        sc[n][e] = softcap_x(a, sc[n][e] * a.scale_log2) - (kFrozen ? state.m_sub[e >> 1] : 0.f);
  } else {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = fmaf(sc[n][e], a.scale_log2, kFrozen ? -state.m_sub[e >> 1] : 0.f);
  }
  if (key0 + kBlockN > w.unmasked_end || (kExtras && key0 < w.masked_below)) {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lr = w.wrow0 + w.g + 8 * (e >> 1);
        const int s_row = m0 + (lr < rows_here ? lr : 0);
        const int key = key0 + n * 8 + 2 * w.t4 + (e & 1);
        const int end = w.causal ? (w.past + s_row + 1 < kv_len ? w.past + s_row + 1 : kv_len) : kv_len;
        bool visible = key < end && (!kExtras || a.window == 0 || w.past + s_row - key < a.window);
        if (a.mask_mode == MaskMode::kBias && visible) {
          bool unmasked;
          sc[n][e] += bias_log2<T>(a, b, s_row, key, unmasked);
          visible = unmasked;
        }
        if (!visible) sc[n][e] = -kInf;
      }
  }
}

// P in the input type as the A fragments of O += P V: k-step ks takes score fragments 2 ks and 2 ks + 1, exactly
// as in the mma.sync kernel.
template <typename T, int kNT>
__device__ __forceinline__ void sm90_pack_p(const float (&sc)[kNT][4], uint32_t (&pa)[kNT / 2][4]) {
#pragma unroll
  for (int ks = 0; ks < kNT / 2; ++ks) {
    pa[ks][0] = Elem<T>::pack(sc[2 * ks][0], sc[2 * ks][1]);
    pa[ks][1] = Elem<T>::pack(sc[2 * ks][2], sc[2 * ks][3]);
    pa[ks][2] = Elem<T>::pack(sc[2 * ks + 1][0], sc[2 * ks + 1][1]);
    pa[ks][3] = Elem<T>::pack(sc[2 * ks + 1][2], sc[2 * ks + 1][3]);
  }
}

// After the last tile: normalize and store the warp's rows; under the unified max, recompute the rows the guard
// flagged exactly (q_scratch: this warp's D floats of shared memory) and count them.
template <typename T, int D, bool kUnified, typename State>
__device__ __forceinline__ void sm90_epilogue(const AttnArgs& a, State& state, const float (&o)[D / 8][4],
                                              const Sm90WarpRows& w, int b, int hq, int m0, int rows_here, int kv_len,
                                              float* q_scratch, int lane) {
  state.finish();
  uint32_t flagged = 0;  // bit r: row g + 8 r of this warp
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int lr = w.wrow0 + w.g + 8 * r;
    if (lr >= rows_here) continue;
    if (state.guard_bits(r, a.lo_log2, a.hi_log2, a.max_floor_log2)) flagged |= 1u << r;
    const float inv = state.l[r] > 0.f ? 1.f / state.l[r] : 0.f;
    T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(m0 + lr) * a.o_ss + 2 * w.t4;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      if (i * 8 >= real_dim<D>(a)) break;  // past the real head dims: not written
      *reinterpret_cast<uint32_t*>(out + i * 8) = Elem<T>::pack(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
    }
  }
  if constexpr (kUnified) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t lanes = __ballot_sync(0xffffffffu, (flagged >> r) & 1u) & 0x11111111u;  // one lane per quad
      while (lanes) {
        const int qg = (__ffs(lanes) - 1) >> 2;
        lanes &= lanes - 1;
        __syncwarp();  // this warp's stores of the row are done before the recompute overwrites them
        if (lane == 0) atomicAdd(a.counters, 1ull);
        recompute_row_warp<T, D>(a, b, hq, m0 + w.wrow0 + qg + 8 * r, kv_len, q_scratch);
      }
    }
  }
}

// kExtras: soft cap and sliding window compiled in (false: the caller has neither; see sm90_scale_and_mask).
template <typename T, int D, bool kUnified, bool kExtras = true>
__global__ void __launch_bounds__(PrefillSm90Traits<D>::kThreads, 1) prefill_sm90_kernel(const AttnArgs a) {
#if FDPP_WGMMA
  using Tr = PrefillSm90Traits<D>;
  constexpr int kNT = Tr::kNT;
  using State = std::conditional_t<kUnified, AnchoredUnifiedSoftmax<2>, SynchronizedSoftmax<2>>;
  extern __shared__ __align__(128) unsigned char smem[];  // rounded up to 1024 below

  const PrefillBlock<Tr::kBlockM, Tr::kBlockN, Tr::kAnchorTiles, kExtras> blk(a);  // the mma.sync kernel's order
  const int b = blk.b, hq = blk.hq, hkv = blk.hkv, m0 = blk.m0;
  const int kv_len = blk.kv_len, rows_here = blk.rows_here, key_end = blk.key_end, num_tiles = blk.num_tiles;
  auto tile_at = [&](int it) { return blk.tile_at(it); };
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  const Sm90Smem<D> sm(smem);
  const uint32_t q_smem = sm.q, kv_smem = sm.kv, scratch_smem = sm.scratch, q_full = sm.q_full;
  auto full = [&](int s) { return sm.full(s); };
  auto empty = [&](int s) { return sm.empty(s); };
  if (tid == 0) {
    mbar_init(q_full, 32);
#pragma unroll
    for (int s = 0; s < Tr::kStages; ++s) mbar_init(full(s), 32), mbar_init(empty(s), Tr::kConsumerWarps);
  }
  __syncthreads();

  if (warp == Tr::kConsumerWarps) {  // the producer warp
    const T* q_base = row_ptr<T>(a.q, a.q_sb, a.q_sh, a.q_ss, b, hq, m0);
    sm90_copy_rows<T, D, Tr::kBlockM, 8, false>(a, rows_here, lane, q_base, a.q_ss, q_smem);
    mbar_arrive_on_copies(q_full);
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % Tr::kStages, use = it / Tr::kStages;
      if (use > 0) mbar_wait(empty(stage), (use - 1) & 1);  // the consumers are done with the previous tile here
      const uint32_t kdst = kv_smem + stage * 2 * Tr::kTileBytes, vdst = kdst + Tr::kTileBytes;
      const int key0 = tile_at(it) * Tr::kBlockN;
      // A key tile is one KV block: one kv_locate per tile (attention_common.cuh).
      const KvRow at = kv_locate(a, b, key0);
      sm90_copy_rows<T, D, Tr::kBlockN, 8, true>(a, key_end - key0, lane, k_row<T>(a, at, hkv), a.k_ss, kdst,
                                                 v_row<T>(a, at, hkv), a.v_ss, vdst);
      mbar_arrive_on_copies(full(stage));
    }
    cp_async_wait<0>();
    return;
  }

  // Consumers (Sm90WarpRows: the warp's rows and its mask's key bounds).
  const Sm90WarpRows w(a, b, m0, rows_here, kv_len, warp, lane);
  const int wg_end = w.wg_end;

  State state;
  state.init();
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  const uint32_t q_wg = q_smem + w.wg_row0 * 128;  // this warpgroup's rows in every panel

  // One tile. kFrozen: the unified max is frozen (every tile after the anchor tiles), so the tile needs no max and
  // no rescale; the phase is a template parameter so that neither loop tests it per score.
  auto tile = [&](int it, auto frozen_phase) {
    constexpr bool kFrozen = decltype(frozen_phase)::value;
    const int stage = it % Tr::kStages;
    const int key0 = tile_at(it) * Tr::kBlockN;
    if (key0 < wg_end) {  // warpgroup-uniform: wgmma needs all four warps
      mbar_wait(full(stage), (it / Tr::kStages) & 1);
      const uint32_t kbuf = kv_smem + stage * 2 * Tr::kTileBytes, vbuf = kbuf + Tr::kTileBytes;

      float sc[kNT][4];
#pragma unroll
      for (int n = 0; n < kNT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
      keep_registers(sc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {  // k16 slice ks: panel ks / 4, 32 bytes into the row per slice
        const uint32_t qoff = (ks >> 2) * Tr::kBlockM * 128 + (ks & 3) * 32;
        const uint32_t koff = (ks >> 2) * Tr::kBlockN * 128 + (ks & 3) * 32;
        wgmma_qk<T>(sc, sw128_desc(q_wg + qoff, 16, 1024), sw128_desc(kbuf + koff, 16, 1024));
      }
      wgmma_commit();
      wgmma_wait<0>();
      keep_registers(sc);

      sm90_scale_and_mask<T, kNT, Tr::kBlockN, kFrozen, State, kExtras>(a, state, w, b, m0, rows_here, kv_len, key0,
                                                                        sc);
      if constexpr (!kFrozen) {  // synchronized: every tile; anchored unified: only until the anchor freezes
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tmax = -kInf;
#pragma unroll
          for (int n = 0; n < kNT; ++n) tmax = fmaxf(tmax, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));
          const float alpha = state.begin_tile(r, tmax);
          if (alpha != 1.f) {
#pragma unroll
            for (int i = 0; i < D / 8; ++i) o[i][2 * r] *= alpha, o[i][2 * r + 1] *= alpha;
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[n][e] = phase_exp<kFrozen, kUnified>(state, e >> 1, sc[n][e]);
        }

      // O += P V, 16 keys per k-step, P in the input type.
      uint32_t pa[kNT / 2][4];
      sm90_pack_p<T>(sc, pa);
      keep_registers(o);
      keep_registers(pa);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kNT / 2; ++ks)  // keys 16 ks ..: 16 rows of 128 bytes further into every panel
        wgmma_pv<T, D>(o, pa[ks], sw128_desc(vbuf + ks * 16 * 128, Tr::kBlockN * 128, 1024));
      wgmma_commit();
      wgmma_wait<0>();
      keep_registers(o);
      keep_registers(pa);
    } else {
      mbar_wait(full(stage), (it / Tr::kStages) & 1);  // keep the ring's phases in step before releasing it
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(stage));
  };

  mbar_wait(q_full, 0);
  sm90_walk_tiles<kUnified, Tr::kAnchorTiles>(num_tiles, state, tile);

  float* q_scratch = reinterpret_cast<float*>(smem + (scratch_smem - smem_addr(smem))) + warp * D;
  sm90_epilogue<T, D, kUnified>(a, state, o, w, b, hq, m0, rows_here, kv_len, q_scratch, lane);
#endif  // FDPP_WGMMA
}

// --- host side ---------------------------------------------------------------------------------------------------

// Whether the loaded binary holds kKernel's sm_90a code (per device, cached): the wgmma kernels (shapes 4 and 5).
template <auto kKernel>
cudaError_t sm90_binary_present(bool* present) {
  static std::atomic<int> binary[64] = {};  // per device: 0 unknown, 1 sm_90 code, -1 none
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (binary[device & 63].load(std::memory_order_relaxed) == 0) {
    cudaFuncAttributes attr = {};
    if ((err = cudaFuncGetAttributes(&attr, kKernel)) != cudaSuccess) return err;
    binary[device & 63].store(attr.binaryVersion == 90 ? 1 : -1, std::memory_order_relaxed);
  }
  *present = binary[device & 63].load(std::memory_order_relaxed) > 0;
  return cudaSuccess;
}

}  // namespace attn
}  // namespace fdpp
