// Prefill: causal attention over the prompt on tensor cores, FlashAttention-2's tiling with either softmax.
//
// Grid (batch x query head, query block), the heaviest causal blocks first. A CTA of 4 warps holds 128 query rows
// (32 per warp, two m16 fragments; or 64 rows, 16 per warp: the tile shapes of attention_prefill_impl.cuh) and
// walks the 64-key tiles its rows can see, K and V double-buffered with cp.async. Per tile and warp: S = Q K^T
// (m16n8k16), P = 2^(x - phi') (unified) or the online max (synchronized), O += P V (m16n8k16 with P in the input type,
// as FlashAttention-2 does; the fp16 window for this is in attention_params.h). Rows the guard flags are recomputed
// exactly by their warp after the epilogue, in the same launch (attention_fallback.cuh), and counted.
#pragma once

#include <type_traits>

#include "kernels/attention/attention_common.cuh"
#include "kernels/attention/attention_fallback.cuh"
#include "kernels/attention/attention_softmax_state.cuh"
#include "kernels/attention/attention_traits.cuh"

namespace fdpp {
namespace attn {

template <typename T, int D, bool kUnified, int kStepN, int kRowsPerWarp>
__global__ void __launch_bounds__(128, 2) prefill_kernel(const AttnArgs a) {
  using Tr = PrefillTraits<D, kStepN, kRowsPerWarp>;
  constexpr int kMT = Tr::kMTiles, kNT = Tr::kNTiles;
  using State = std::conditional_t<kUnified, AnchoredUnifiedSoftmax<2 * kMT>, SynchronizedSoftmax<2 * kMT>>;
  // Soft-capping, the sliding window and head dims 80/96 (zero-filled in the 128 kernel) are compiled into the
  // 64-row shape only: the 128-row shape is at 255 registers, and their code made it spill (ptxas -v). The plan sends
  // such calls to another shape, and a forced 128-row shape is refused (prefill_shape_takes, attention_params.h).
  constexpr bool kScoreExtras = kRowsPerWarp == 16;
  const int dim = kScoreExtras ? real_dim<D>(a) : D;
  extern __shared__ __align__(128) unsigned char smem[];

  const PrefillBlock<Tr::kBlockM, Tr::kBlockN, Tr::kAnchorTiles, kScoreExtras> blk(a);
  const int b = blk.b, hq = blk.hq, hkv = blk.hkv, m0 = blk.m0;
  const int kv_len = blk.kv_len, rows_here = blk.rows_here, key_end = blk.key_end, num_tiles = blk.num_tiles;
  auto tile_at = [&](int it) { return blk.tile_at(it); };
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  const uint32_t q_smem = smem_addr(smem);
  const uint32_t kv_smem = q_smem + Tr::kQBytes;
  const int c = tid % Tr::kChunks, lrow0 = tid / Tr::kChunks;
  const uint32_t dst0 = swizzled<Tr::kRowBytes>(lrow0, c);
  // Row r (= lrow0 + a multiple of kRowsPerPass) of this thread's chunk, relative to tile_dst(base): every pass in
  // row lrow0's swizzle phase (the offset folds into the base), or at 4 rows per pass (head_dim 256) the phase
  // alternating.
  constexpr bool kOnePhase = Tr::kRowsPerPass % 8 == 0;
  auto tile_dst = [&](uint32_t base) { return kOnePhase ? base + dst0 : base; };
  auto row_dst = [&](int r) {
    if constexpr (kOnePhase) return static_cast<uint32_t>((r - lrow0) * Tr::kRowBytes);
    return swizzled<Tr::kRowBytes>(r, c);
  };
  // A chunk past the real head dims (80 and 96 in the 128 kernel) zero-fills every row and reads nothing.
  const bool chunk_real = !kScoreExtras || c < dim / 8;
  const int c_src = chunk_real ? c : 0;
  const int load_end = chunk_real ? key_end : 0;

  // Q tile (zero rows past the prompt) with tile 0 in the first cp.async group.
  {
    const T* q_base = row_ptr<T>(a.q, a.q_sb, a.q_sh, a.q_ss, b, hq, 0) + c_src * 8;
#pragma unroll 4
    for (int r = lrow0; r < Tr::kBlockM; r += Tr::kRowsPerPass) {
      const bool valid = r < rows_here && chunk_real;
      cp_async_16(tile_dst(q_smem) + row_dst(r), q_base + (valid ? (m0 + r) * a.q_ss : 0), valid);
    }
  }
  // Contiguous: key at k_base + key * k_ss. Paged: a key tile is one KV block (static_assert in PrefillTraits),
  // located once per tile (kv_locate). A row past key_end reads nothing (zero-fill) from a valid row.
  const bool paged = a.block_table != nullptr;
  const T* k_base = k_row<T>(a, KvRow{b, 0}, hkv) + c_src * 8;
  const T* v_base = v_row<T>(a, KvRow{b, 0}, hkv) + c_src * 8;
  auto load_tile = [&](int it) {  // iteration it's tile into buffer it % kStages
    const int tile = tile_at(it);
    const uint32_t kdst = tile_dst(kv_smem + (it % Tr::kStages) * 2 * Tr::kTileBytes);
    const uint32_t vdst = kdst + Tr::kTileBytes;
    if (paged) {
      const KvRow at = kv_locate(a, b, tile * Tr::kBlockN);
      const T* k_tile = k_row<T>(a, at, hkv) + c_src * 8;
      const T* v_tile = v_row<T>(a, at, hkv) + c_src * 8;
#pragma unroll
      for (int r = lrow0; r < Tr::kBlockN; r += Tr::kRowsPerPass) {
        const bool valid = tile * Tr::kBlockN + r < load_end;
        const int64_t rr = valid ? r : 0;
        cp_async_16(kdst + row_dst(r), k_tile + rr * a.k_ss, valid);
        cp_async_16(vdst + row_dst(r), v_tile + rr * a.v_ss, valid);
      }
      return;
    }
#pragma unroll
    for (int r = lrow0; r < Tr::kBlockN; r += Tr::kRowsPerPass) {
      const int key = tile * Tr::kBlockN + r;
      const bool valid = key < load_end;
      const int64_t kk = valid ? key : 0;
      cp_async_16(kdst + row_dst(r), k_base + kk * a.k_ss, valid);
      cp_async_16(vdst + row_dst(r), v_base + kk * a.v_ss, valid);
    }
  };
  if (num_tiles > 0) load_tile(0);
  cp_async_commit();

  // This thread's 4 rows: r = 2 * mt + h is row warp*32 + mt*16 + g + 8h of the block.
  const int wrow0 = warp * Tr::kRowsPerWarp;
  const bool warp_has_rows = wrow0 < rows_here;
  // Keys below unmasked_end are visible to every row of this warp; keys at or past warp_end to none of them.
  const int unmasked_end = a.mask_mode == MaskMode::kBias ? -1 : visible_end(a, b, m0 + wrow0, kv_len);
  const bool causal = a.mask_mode == MaskMode::kPastLen;
  const long long past_raw = causal ? a.past_len[b] : 0;  // clamped like kv_len_of(): never an int overflow
  const int past = past_raw < 0 ? -1 : (past_raw > a.kv_capacity ? a.kv_capacity : static_cast<int>(past_raw));
  const int last_row = wrow0 + Tr::kRowsPerWarp - 1 < rows_here - 1 ? wrow0 + Tr::kRowsPerWarp - 1 : rows_here - 1;
  const int warp_end = warp_has_rows ? visible_end(a, b, m0 + last_row, kv_len) : 0;

  State state;
  state.init();
  float o[kMT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;

  for (int it = 0; it < num_tiles; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile ready for all; everyone is done with the other buffer
    if (it + 1 < num_tiles) load_tile(it + 1);
    cp_async_commit();
    if constexpr (kUnified) {
      if (it == Tr::kAnchorTiles) state.freeze();
    }
    const int tile = tile_at(it);
    const uint32_t kbuf = kv_smem + (it % Tr::kStages) * 2 * Tr::kTileBytes;
    const uint32_t vbuf = kbuf + Tr::kTileBytes;
#pragma unroll 1
    for (int step = 0; step < Tr::kBlockN / Tr::kStepN; ++step) {
      const int skey = step * Tr::kStepN;  // first key of the step within the tile
      const int key0 = tile * Tr::kBlockN + skey;
      if (key0 >= warp_end) break;  // causal: no row of this warp sees these keys

      float sc[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kNT; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
      const int mi = lane >> 3;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          ldmatrix_x4(qa[mt], q_smem + swizzled<Tr::kRowBytes>(wrow0 + mt * 16 + (mi & 1) * 8 + (lane & 7),
                                                               ks * 2 + (mi >> 1)));
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb,
                      kbuf + swizzled<Tr::kRowBytes>(skey + np * 16 + (mi >> 1) * 8 + (lane & 7), ks * 2 + (mi & 1)));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(sc[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_16816<T>(sc[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      // x = s * log2(e); once the unified max is frozen, x - phi_row directly (one FFMA per score).
      bool frozen = false;
      if constexpr (kUnified) frozen = state.frozen;
      if (kScoreExtras &&
          a.softcap_log2 > 0.f) {  // soft-capping (uniform over the grid): x = C tanh(x / C) before the mask
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sc[mt][n][e] =
                  softcap_x(a, sc[mt][n][e] * a.scale_log2) - (frozen ? state.m_sub[2 * mt + (e >> 1)] : 0.f);
      } else {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sc[mt][n][e] = fmaf(sc[mt][n][e], a.scale_log2, frozen ? -state.m_sub[2 * mt + (e >> 1)] : 0.f);
      }
      // A sliding window masks keys before the window of the warp's last row (past + m0 + wrow0 + kRowsPerWarp
      // - window at most; recomputed here rather than held: the kernel is at 255 registers).
      const bool masked = key0 + Tr::kStepN > unmasked_end ||
                          (kScoreExtras && a.window > 0 && key0 < past + m0 + wrow0 + Tr::kRowsPerWarp - a.window);
      if (masked) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int lr = wrow0 + mt * 16 + g + 8 * (e >> 1);
              const int s_row = m0 + (lr < rows_here ? lr : 0);
              const int key = key0 + n * 8 + 2 * t4 + (e & 1);
              const int end = causal ? (past + s_row + 1 < kv_len ? past + s_row + 1 : kv_len) : kv_len;
              bool visible = key < end && (!kScoreExtras || a.window == 0 || past + s_row - key < a.window);
              if (a.mask_mode == MaskMode::kBias && visible) {
                bool unmasked;
                sc[mt][n][e] += bias_log2<T>(a, b, s_row, key, unmasked);
                visible = unmasked;
              }
              if (!visible) sc[mt][n][e] = -kInf;
            }
      }
      if (!frozen) {  // synchronized: every tile; anchored unified: only until the anchor freezes
#pragma unroll
        for (int r = 0; r < 2 * kMT; ++r) {
          float tmax = -kInf;
#pragma unroll
          for (int n = 0; n < kNT; ++n)
            tmax = fmaxf(tmax, fmaxf(sc[r >> 1][n][2 * (r & 1)], sc[r >> 1][n][2 * (r & 1) + 1]));
          const float alpha = state.begin_tile(r, tmax);
          // Once a row's max has settled alpha is exactly 1: skip the D/4 multiplies unless some row in the warp
          // moved (the vote is warp-uniform: every lane of the warp runs this step).
          if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
            for (int i = 0; i < D / 8; ++i) o[r >> 1][i][2 * (r & 1)] *= alpha, o[r >> 1][i][2 * (r & 1) + 1] *= alpha;
          }
        }
      }
      if (masked) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[mt][n][e] = state.template exp<true>(2 * mt + (e >> 1), sc[mt][n][e]);
      } else {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kNT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[mt][n][e] = state.template exp<false>(2 * mt + (e >> 1), sc[mt][n][e]);
      }

      // O += P V, 16 keys per k-step; P in the input type.
#pragma unroll
      for (int ks = 0; ks < kNT / 2; ++ks) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[mt][0] = Elem<T>::pack(sc[mt][2 * ks][0], sc[mt][2 * ks][1]);
          pa[mt][1] = Elem<T>::pack(sc[mt][2 * ks][2], sc[mt][2 * ks][3]);
          pa[mt][2] = Elem<T>::pack(sc[mt][2 * ks + 1][0], sc[mt][2 * ks + 1][1]);
          pa[mt][3] = Elem<T>::pack(sc[mt][2 * ks + 1][2], sc[mt][2 * ks + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(
              vb, vbuf + swizzled<Tr::kRowBytes>(skey + ks * 16 + (mi & 1) * 8 + (lane & 7), dp * 2 + (mi >> 1)));
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma_16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // shared memory is free from here on: the fallback uses it as scratch

  // Epilogue: normalize and store; remember which rows the guard flagged.
  state.finish();
  uint32_t flagged = 0;  // bit r: row r of this thread
#pragma unroll
  for (int r = 0; r < 2 * kMT; ++r) {
    const int lr = wrow0 + (r >> 1) * 16 + g + 8 * (r & 1);
    if (lr >= rows_here) continue;
    if (state.guard_bits(r, a.lo_log2, a.hi_log2, a.max_floor_log2)) flagged |= 1u << r;
    const float inv = state.l[r] > 0.f ? 1.f / state.l[r] : 0.f;
    T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(m0 + lr) * a.o_ss + 2 * t4;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      if (i * 8 >= dim) break;  // past the real head dims: not written
      const uint32_t packed = Elem<T>::pack(o[r >> 1][i][2 * (r & 1)] * inv, o[r >> 1][i][2 * (r & 1) + 1] * inv);
      *reinterpret_cast<uint32_t*>(out + i * 8) = packed;
    }
  }
  if constexpr (kUnified) {
    float* q_scratch = reinterpret_cast<float*>(smem) + warp * D;
#pragma unroll
    for (int r = 0; r < 2 * kMT; ++r) {
      uint32_t lanes = __ballot_sync(0xffffffffu, (flagged >> r) & 1u) & 0x11111111u;  // one lane per quad
      while (lanes) {
        const int qg = (__ffs(lanes) - 1) >> 2;
        lanes &= lanes - 1;
        const int lr = wrow0 + (r >> 1) * 16 + qg + 8 * (r & 1);
        __syncwarp();  // this warp's stores of the row are done before the recompute overwrites them
        if (lane == 0) atomicAdd(a.counters, 1ull);
        recompute_row_warp<T, D>(a, b, hq, m0 + lr, kv_len, q_scratch);
      }
    }
  }
}

}  // namespace attn
}  // namespace fdpp
