// Prefill on Hopper, tile shape 5: shape 4's algorithm (attention_prefill_sm90.cuh: 128 query rows, two consumer
// warpgroups of 64 rows on wgmma, the same work order, masks, softmax variants, guard and in-launch fallback) with
// the three things shape 4 lacks (docs/notes-attention.md, "Open"):
//
// - TMA loads. One thread of the producer warpgroup copies a whole 64-key tile of K and V with 2 (d64) or 4 (d128)
//   bulk tensor copies (cp.async.bulk.tensor.4d) instead of 64 cp.async per lane. The tensor maps are 4-D over
//   (head dims, row, KV head, outer) with outer = the sequence (contiguous caches) or the block (paged pools; a
//   tile is one KV block, so kv_locate gives the box's coordinates in both modes). They are encoded per call on
//   the host (no allocation, no synchronization) and passed as __grid_constant__ parameters. Head dims past the
//   real ones (80, 96 in the 128 kernel; refused for now, notes "Open") and rows past the cache are out of the
//   map: the TMA zero-fills them. A tile that ends past its block's last visible key (at most one per CTA) is
//   copied with zero-filling cp.async as in shape 4, since cache rows past a sequence's end may hold NaN, and
//   0 * NaN in P.V would poison a row.
// - setmaxnreg. The producer is a whole warpgroup (setmaxnreg acts per warpgroup) that keeps kProducerRegs
//   registers and hands the rest to the two consumer warpgroups (kConsumerRegs each).
// - Ping-pong between the consumer warpgroups, with the next tile's S issued beside this tile's P.V. Each
//   warpgroup issues its GEMMs (S of tile t, then P.V of tile t - 1) only in its turn, passed by named barriers,
//   so the tensor cores run one warpgroup's GEMMs while the other does its softmax. Why this and not a third
//   consumer warpgroup: 3 x 64 rows is a 192-row block, which changes the work order, the anchor tiles and the
//   grid of every causal shape, and leaves each consumer 160 registers (spill risk at d128 with 64 output and 32
//   score registers plus the P fragment). Why not the intra-warpgroup overlap alone: shape 4 tried it and lost
//   (notes, "Tried"), as without an enforced turn the two warpgroups' GEMMs interleave and both softmaxes can
//   meet in the same idle window; the turn is what keeps the tensor cores fed.
//
// Per round r of a warpgroup (tile t = r; round num_tiles only drains):
//   wait for tile t's stage; turn (bar.sync); issue S_t = Q K_t^T; issue O += P_{t-1} V_{t-1}; pass the turn
//   wait S_t; mask, max, exponentials of S_t (P.V of t - 1 still running); wait P.V; release t - 1's stage;
//   rescale O (synchronized / anchoring); P_t -> registers for the next round.
// Both warpgroups run the same number of rounds (num_tiles + 1, skipped tiles included), so the turns pair up.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <type_traits>

#include "kernels/attention/attention_launch.h"
#include "kernels/attention/attention_prefill_grid.cuh"
#include "kernels/attention/attention_prefill_sm90.cuh"
#include "kernels/attention/attention_prefill_sm90_tma.h"
#include "kernels/common/tensor_map.h"

namespace fdpp {
namespace attn {

template <int D>
struct PrefillTmaTraits : PrefillSm90Traits<D> {  // shape 4's tiles, ring and shared-memory layout
  static constexpr int kProducerThreads = 128;    // one warpgroup: setmaxnreg needs whole warpgroups
  static constexpr int kThreads = kProducerThreads + PrefillSm90Traits<D>::kConsumerWarps * 32;
  // Registers per thread after setmaxnreg: the producer only computes addresses, the consumers hold O (D / 2),
  // S (32) and P (16) per thread. 128 x 40 + 256 x 232 <= 64K, the SM's register file.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kBoxCols = 64;  // head dims per TMA box: 128 bytes, the swizzle's span (one panel)
  static constexpr int kBoxes = D / kBoxCols;
  static constexpr uint32_t kStageTxBytes = 2 * PrefillSm90Traits<D>::kTileBytes;  // K and V; OOB zeros count
  static constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: the consumer warpgroups' turns (0 is syncthreads)
  static_assert(kProducerThreads * kProducerRegs + PrefillSm90Traits<D>::kConsumerWarps * 32 * kConsumerRegs <= 65536,
                "the register file holds every warpgroup's allocation");
  static_assert(PrefillSm90Traits<D>::kBlockN == 64, "a TMA box is 64 rows: one key tile, one KV block");
};

// --- sm_90a primitives of this kernel ---------------------------------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if FDPP_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if FDPP_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
// Named barrier of the two consumer warpgroups (256 threads): one syncs, the other arrives.
__device__ __forceinline__ void turn_wait(int id) {
#if FDPP_WGMMA
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
#endif
}
__device__ __forceinline__ void turn_pass(int id) {
#if FDPP_WGMMA
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
#endif
}
// One arrival that also expects `bytes` from bulk copies on this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FDPP_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Box (col, row, head, outer) of a 4-D tensor map into shared memory (1024-byte aligned); its bytes complete on bar.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int col, int row, int head, int outer,
                                            uint32_t bar) {
#if FDPP_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(map), "r"(col), "r"(row), "r"(head), "r"(outer), "r"(bar)
      : "memory");
#endif
}

template <typename T, int D, bool kUnified>
__global__ void __launch_bounds__(PrefillTmaTraits<D>::kThreads, 1)
    prefill_tma_kernel(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                       const AttnArgs a) {
#if FDPP_WGMMA
  using Tr = PrefillTmaTraits<D>;
  constexpr int kNT = Tr::kNT;  // (lambda parameter types spell Tr::kNT: a local constant there crashes cicc 13.0)
  using State = std::conditional_t<kUnified, AnchoredUnifiedSoftmax<2>, SynchronizedSoftmax<2>>;
  extern __shared__ __align__(128) unsigned char smem[];  // rounded up to 1024 below

  const PrefillBlock<Tr::kBlockM, Tr::kBlockN, Tr::kAnchorTiles> blk(a);  // the mma.sync kernel's work order
  const int b = blk.b, hq = blk.hq, hkv = blk.hkv, m0 = blk.m0;
  const int kv_len = blk.kv_len, rows_here = blk.rows_here, key_end = blk.key_end, num_tiles = blk.num_tiles;
  auto tile_at = [&](int it) { return blk.tile_at(it); };
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  const Sm90Smem<D> sm(smem);  // shape 4's layout
  const uint32_t q_smem = sm.q, kv_smem = sm.kv, scratch_smem = sm.scratch, q_full = sm.q_full;
  auto full = [&](int s) { return sm.full(s); };
  auto empty = [&](int s) { return sm.empty(s); };
  if (tid == 0) {
    mbar_init(q_full, 32);
#pragma unroll
    for (int s = 0; s < Tr::kStages; ++s) mbar_init(full(s), 1), mbar_init(empty(s), Tr::kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine too
  }
  __syncthreads();

  if (warp < Tr::kProducerThreads / 32) {  // the producer warpgroup: warp 0 copies, warps 1-3 only give registers
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) return;
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(&kmap) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(&vmap) : "memory");
    }
    const T* q_base = row_ptr<T>(a.q, a.q_sb, a.q_sh, a.q_ss, b, hq, m0);
    sm90_copy_rows<T, D, Tr::kBlockM, 2, false>(a, rows_here, lane, q_base, a.q_ss, q_smem);
    mbar_arrive_on_copies(q_full);
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % Tr::kStages, use = it / Tr::kStages;
      if (use > 0) mbar_wait(empty(stage), (use - 1) & 1);  // both warpgroups are done with the previous tile
      const uint32_t kdst = kv_smem + stage * 2 * Tr::kTileBytes, vdst = kdst + Tr::kTileBytes;
      const int key0 = tile_at(it) * Tr::kBlockN;
      const KvRow at = kv_locate(a, b, key0);  // the tile's block (paged) or sequence, and its first row
      if (key0 + Tr::kBlockN <= key_end) {     // every row visible to some query: bulk tensor copies
        if (lane == 0) {
          mbar_arrive_expect_tx(full(stage), Tr::kStageTxBytes);
          const int outer = static_cast<int>(at.outer);
#pragma unroll
          for (int p = 0; p < Tr::kBoxes; ++p) {  // panel p: head dims 64 p .. 64 p + 63
            const uint32_t panel = p * Tr::kBlockN * 128;
            tma_load_4d(kdst + panel, &kmap, p * Tr::kBoxCols, at.row, hkv, outer, full(stage));
            tma_load_4d(vdst + panel, &vmap, p * Tr::kBoxCols, at.row, hkv, outer, full(stage));
          }
        }
      } else {  // the block's last visible key inside the tile: zero-fill the rest (shape 4's copies)
        sm90_copy_rows<T, D, Tr::kBlockN, 2, true>(a, key_end - key0, lane, k_row<T>(a, at, hkv), a.k_ss, kdst,
                                                   v_row<T>(a, at, hkv), a.v_ss, vdst);
        // Each lane waits for its own copies, then one arrival: correct without relying on how the hardware orders
        // another lane's cp.async.mbarrier.arrive against lane 0's arrival (a stall once per CTA, at its last tile).
        cp_async_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(full(stage));
      }
    }
    cp_async_wait<0>();
    return;
  } else {
    setmaxnreg_inc<Tr::kConsumerRegs>();
    // Consumer warp cw holds rows 16 cw .. 16 cw + 15 of the block; its warpgroup wg rows 64 wg .. 64 wg + 63.
    const int cw = warp - Tr::kProducerThreads / 32;
    const Sm90WarpRows w(a, b, m0, rows_here, kv_len, cw, lane);
    const int wg = w.wg, wg_end = w.wg_end;

    State state;
    state.init();
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    uint32_t pa[kNT / 2][4];  // P of the tile whose P.V is still to issue (the A fragments, as in shape 4)
#pragma unroll
    for (int ks = 0; ks < kNT / 2; ++ks) pa[ks][0] = pa[ks][1] = pa[ks][2] = pa[ks][3] = 0u;
    int pending = -1;  // the stage of that tile, -1: none
    const uint32_t q_wg = q_smem + w.wg_row0 * 128;
    const int my_turn = Tr::kTurnBarrier + wg, their_turn = Tr::kTurnBarrier + 1 - wg;
    // Turns: warpgroup 1 passes once up front so that warpgroup 0 goes first; after that each warpgroup waits
    // for its turn and passes it once per round (and warpgroup 0 takes one last turn at the end, so that every
    // pass is matched by a wait when the CTA exits).
    if (wg == 1) turn_pass(their_turn);

    // S = Q K^T of the tile in `stage` (issue only).
    auto issue_s = [&](float(&sc)[Tr::kNT][4], int stage) {
      const uint32_t kbuf = kv_smem + stage * 2 * Tr::kTileBytes;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {  // k16 slice ks: panel ks / 4, 32 bytes into the row per slice
        const uint32_t qoff = (ks >> 2) * Tr::kBlockM * 128 + (ks & 3) * 32;
        const uint32_t koff = (ks >> 2) * Tr::kBlockN * 128 + (ks & 3) * 32;
        wgmma_qk<T>(sc, sw128_desc(q_wg + qoff, 16, 1024), sw128_desc(kbuf + koff, 16, 1024));
      }
      wgmma_commit();
    };
    // O += P V of the pending tile (issue only).
    auto issue_pv = [&]() {
      const uint32_t vbuf = kv_smem + pending * 2 * Tr::kTileBytes + Tr::kTileBytes;
#pragma unroll
      for (int ks = 0; ks < kNT / 2; ++ks)  // keys 16 ks ..: 16 rows of 128 bytes further into every panel
        wgmma_pv<T, D>(o, pa[ks], sw128_desc(vbuf + ks * 16 * 128, Tr::kBlockN * 128, 1024));
      wgmma_commit();
    };
    auto release = [&](int stage) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(stage));
    };
    // Scores -> p in place (scale, soft cap, mask, max, exponentials); alpha: the rescale O needs (1: none).
    auto softmax = [&](float(&sc)[Tr::kNT][4], int key0, float(&alpha)[2], auto frozen_phase) {
      constexpr bool kFrozen = decltype(frozen_phase)::value;
      sm90_scale_and_mask<T, kNT, Tr::kBlockN, kFrozen>(a, state, w, b, m0, rows_here, kv_len, key0, sc);
      alpha[0] = alpha[1] = 1.f;
      if constexpr (!kFrozen) {  // synchronized: every tile; anchored unified: only until the anchor freezes
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tmax = -kInf;
#pragma unroll
          for (int n = 0; n < kNT; ++n) tmax = fmaxf(tmax, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));
          alpha[r] = state.begin_tile(r, tmax);
        }
      }
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[n][e] = phase_exp<kFrozen, kUnified>(state, e >> 1, sc[n][e]);
    };
    // After the previous P.V has landed: rescale O to the new max, keep P as the next round's A fragments.
    auto keep_p = [&](const float(&sc)[Tr::kNT][4], const float(&alpha)[2], int stage) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (alpha[r] != 1.f) {
#pragma unroll
          for (int i = 0; i < D / 8; ++i) o[i][2 * r] *= alpha[r], o[i][2 * r + 1] *= alpha[r];
        }
      }
      sm90_pack_p<T>(sc, pa);
      pending = stage;
    };

    // Round `it` (see the header; it == num_tiles: only the last P.V). Each of its four cases runs its wgmma
    // sequence (fence, issue, wait) inside one branch, as shape 4 does: in-flight MMAs that cross a divergent
    // branch make ptxas serialize every wgmma (warning C7520).
    auto round = [&](int it, auto frozen_phase) {
      const bool has_tile = it < num_tiles;
      const int stage = it % Tr::kStages;
      const int key0 = has_tile ? tile_at(it) * Tr::kBlockN : 0;
      const bool compute = has_tile && key0 < wg_end;                // warpgroup-uniform: wgmma needs all four warps
      if (has_tile) mbar_wait(full(stage), (it / Tr::kStages) & 1);  // skipped tiles too: the ring's phases
      turn_wait(my_turn);
      if (compute) {
        float sc[kNT][4], alpha[2];
#pragma unroll
        for (int n = 0; n < kNT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        if (pending >= 0) {  // S of this tile, then P.V of the previous one; the softmax runs beside the P.V
          keep_registers(sc);
          keep_registers(o);
          keep_registers(pa);
          wgmma_fence();
          issue_s(sc, stage);
          issue_pv();
          turn_pass(their_turn);
          wgmma_wait<1>();
          keep_registers(sc);
          softmax(sc, key0, alpha, frozen_phase);
          wgmma_wait<0>();
          keep_registers(o);
          keep_registers(pa);
          release(pending);
        } else {
          keep_registers(sc);
          wgmma_fence();
          issue_s(sc, stage);
          turn_pass(their_turn);
          wgmma_wait<0>();
          keep_registers(sc);
          softmax(sc, key0, alpha, frozen_phase);
        }
        keep_p(sc, alpha, stage);
      } else if (pending >= 0) {  // no tile here for this warpgroup: only the previous P.V
        keep_registers(o);
        keep_registers(pa);
        wgmma_fence();
        issue_pv();
        turn_pass(their_turn);
        wgmma_wait<0>();
        keep_registers(o);
        keep_registers(pa);
        release(pending);
        pending = -1;
      } else {
        turn_pass(their_turn);
      }
      if (has_tile && !compute) release(stage);  // a tile no row of this warpgroup sees
    };

    mbar_wait(q_full, 0);
    sm90_walk_tiles<kUnified, Tr::kAnchorTiles>(num_tiles, state, round);
    round(num_tiles, Anchoring{});    // drains the last P.V (no tile: the phase does not matter)
    if (wg == 0) turn_wait(my_turn);  // warpgroup 1's last pass

    float* q_scratch = reinterpret_cast<float*>(smem + (scratch_smem - smem_addr(smem))) + cw * D;
    sm90_epilogue<T, D, kUnified>(a, state, o, w, b, hq, m0, rows_here, kv_len, q_scratch, lane);
  }
#endif  // FDPP_WGMMA
}

// --- host side ---------------------------------------------------------------------------------------------------

// The tensor map of a K or V cache: dims (head_dim, rows, KV heads, outer), boxes of 64 dims x 64 rows, the
// 128-byte swizzle the kernel's descriptors read. Contiguous caches: rows = kv_capacity, outer = batch. Paged
// pools: rows = the block size, outer = blocks, whose count the call does not know (the table's entries are block
// ids of the pool by contract), so it is the largest a coordinate can name. Host work only: no allocation, no sync.
template <typename T>
cudaError_t encode_kv_map(const AttnArgs& a, const void* cache, int64_t sb, int64_t sh, int64_t ss, CUtensorMap* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const bool paged = a.block_table != nullptr;
  const cuuint64_t dims[4] = {
      static_cast<cuuint64_t>(a.head_dim), static_cast<cuuint64_t>(paged ? kKvBlockSize : a.kv_capacity),
      static_cast<cuuint64_t>(a.num_kv_heads), static_cast<cuuint64_t>(paged ? 0x7fffffff : a.batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(ss) * sizeof(T), static_cast<cuuint64_t>(sh) * sizeof(T),
                                 static_cast<cuuint64_t>(sb) * sizeof(T)};
  const cuuint32_t box[4] = {64, 64, 1, 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult res =
      encode(map, type, 4, const_cast<void*>(cache), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  // Refused (e.g. a zero stride of a broadcast cache): the TMA cannot read this layout; shape 4 can.
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorNotSupported;
}

template <typename T, int D, bool kUnified>
cudaError_t launch_prefill_tma_impl(const AttnArgs& args, cudaStream_t stream) {
  using Tr = PrefillTmaTraits<D>;
  constexpr auto kernel = prefill_tma_kernel<T, D, kUnified>;
  bool present = false;
  cudaError_t err = sm90_binary_present<prefill_tma_kernel<T, D, false>>(&present);
  if (err != cudaSuccess) return err;
  if (!present) return cudaErrorNotSupported;
  CUtensorMap kmap, vmap;
  if ((err = encode_kv_map<T>(args, args.k, args.k_sb, args.k_sh, args.k_ss, &kmap)) != cudaSuccess) return err;
  if ((err = encode_kv_map<T>(args, args.v, args.v_sb, args.v_sh, args.v_ss, &vmap)) != cudaSuccess) return err;
  return launch_prefill_grid<kernel, Tr>(args, stream, kmap, vmap);
}

template <typename T>
cudaError_t launch_prefill_tma(const AttnArgs& a, bool unified, cudaStream_t stream) {
  switch (kernel_head_dim(a.head_dim)) {  // 80 and 96 run in the 128 kernel; 256 has no wgmma kernel
    case 64:
      return unified ? launch_prefill_tma_impl<T, 64, true>(a, stream)
                     : launch_prefill_tma_impl<T, 64, false>(a, stream);
    case 128:
      return unified ? launch_prefill_tma_impl<T, 128, true>(a, stream)
                     : launch_prefill_tma_impl<T, 128, false>(a, stream);
    default: return cudaErrorNotSupported;
  }
}

template <typename T>
cudaError_t prefill_tma_available(int head_dim, bool* available) {
  const int d = kernel_head_dim(head_dim);
  if (d == 128) return sm90_binary_present<prefill_tma_kernel<T, 128, false>>(available);
  if (d == 64) return sm90_binary_present<prefill_tma_kernel<T, 64, false>>(available);
  *available = false;
  return cudaSuccess;
}

}  // namespace attn
}  // namespace fdpp
