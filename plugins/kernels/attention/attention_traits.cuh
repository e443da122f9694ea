// Tile shapes of the tensor-core attention kernels, with the invariants the kernels rely on.
#pragma once

#include "fdpp_contract_constants.h"

namespace fdpp {
namespace attn {

// Split-KV decode: a CTA = 4 warps holds 16 query rows (the G query heads x seq tokens of one KV head, padded) and
// streams its split's keys in tiles through a 2- to 4-stage cp.async pipeline (decode_stages() in
// attention_heuristics.h picks per grid); each warp takes a quarter of every tile. One stage (K and V tile) is
// 32 KB at head_dim 64 and 128: 2 stages for two CTAs per SM or 4 for one keep about 128 KB of loads in flight per
// SM, enough to cover HBM latency at full bandwidth (Little's law) without a deeper ring (docs/notes-attention.md).
// Head dim 256 keeps 64-key tiles (16 keys per warp, the least an ldmatrix.x4 of K takes), so a stage is 64 KB:
// one CTA per SM at 2 or 3 stages (136 or 200 KB, the same bytes in flight), never 4 (264 KB does not fit).
template <int D, int Stages = 3>
struct DecodeTraits {
  static constexpr int kHeadDim = D;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16;                   // query rows per CTA (one m16 fragment)
  static constexpr int kTile = D >= 128 ? 64 : 128;  // keys per pipeline stage
  static constexpr int kKeysPerWarp = kTile / kWarps;
  static constexpr int kNTiles = kKeysPerWarp / 8;  // n8 score fragments per warp per tile
  static constexpr int kStages = Stages;            // 3 unless decode_stages() says otherwise
  static constexpr int kRowBytes = D * 2;
  static constexpr int kChunks = D / 8;                    // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;  // 4 at head_dim 256: see swizzled_pass
  static constexpr int kPasses = kTile / kRowsPerPass;     // cp.async per thread per tile, for K and for V
  static constexpr int kTileBytes = kTile * kRowBytes;
  static constexpr int kQBytes = kRows * kRowBytes;
  static constexpr int kRedStride = D + 4;  // floats per row of the cross-warp reduction buffer (padded)
  static constexpr int kRedBytes = kWarps * kRows * kRedStride * 4;
  static constexpr int kSmemBytes = kStages * 2 * kTileBytes + kQBytes;
  // The cluster combine (decode_split_kernel): after the key loop the leader CTA receives the other splits' row
  // partials in its pipeline buffers, behind the reduction area: per split kRows x (D sums, l, stat) floats.
  static constexpr int kRedAllBytes = kRedBytes + 2 * kWarps * kRows * 4;
  static constexpr int kRecvSlotFloats = kRows * (D + 2);
  static constexpr int kClusterSplitsFit = 1 + (kStages * 2 * kTileBytes - kRedAllBytes) / (kRecvSlotFloats * 4);

  // The query fragments stay in registers for the whole key loop up to head_dim 128; at 256 they would take 64
  // registers beside the 128 of the output, so they are read from shared memory per tile instead.
  static constexpr bool kQInRegisters = D <= 128;

  static_assert(D == 64 || D == 128 || D == 256, "decode is built for head_dim 64, 128 and 256");
  static_assert(kKeysPerWarp % 16 == 0, "a warp's keys come in pairs of n8 fragments (one ldmatrix.x4)");
  static_assert(kRowsPerPass % 4 == 0, "whole passes of rows (swizzled_pass)");
  static_assert(kTile % kRowsPerPass == 0, "whole passes per tile");
  static_assert(kRedBytes <= kStages * 2 * kTileBytes, "the reduction reuses the pipeline buffers");
  static_assert(Stages >= 2 && Stages <= 4, "decode runs 2 to 4 stages");
  static_assert(kStages * 2 * kTileBytes + kQBytes <= 227 * 1024, "the ring fits one SM's shared memory");
  // Only the 3-stage kernel combines in clusters (the launcher's rule): its receive area must hold 7 partials.
  static_assert(Stages != 3 || kClusterSplitsFit >= 8,
                "a cluster of 8 splits (the portable maximum) fits the receive area");
  static_assert(kRedAllBytes % 16 == 0, "the receive area is float4-aligned");
};

// Prefill: a CTA = 4 warps x 32 query rows (two m16 fragments each) of one query head; key tiles of 64 through a
// 2-stage pipeline, computed 32 keys at a time (to stay within 255 registers). Each K/V fragment loaded from shared
// memory feeds both m16 fragments, which halves the shared-memory traffic per mma against 16 rows per warp (the kernel
// would otherwise wait on ldmatrix).
template <int D, int StepN = 32, int RowsPerWarp = 32>
struct PrefillTraits {
  static constexpr int kHeadDim = D;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = RowsPerWarp;  // 32 (two m16 fragments) or 16 (one: 64-row blocks)
  static constexpr int kMTiles = kRowsPerWarp / 16;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;              // 128 (or 64) query rows per CTA
  static constexpr int kBlockN = contract::kAttentionPrefillBlockN;  // keys per tile (one cp.async stage)
  static constexpr int kStepN = StepN;  // keys per compute step: 32 keeps the scores in 32 registers (64 spills)
  static constexpr int kNTiles = kStepN / 8;
  static constexpr int kStages = 2;
  static constexpr int kAnchorTiles = contract::kAttentionPrefillAnchorTiles;  // diagonal tiles + tile 0
  static constexpr int kRowBytes = D * 2;
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;
  static constexpr int kSmemBytes = kQBytes + kStages * 2 * kTileBytes;

  static_assert(D == 64 || D == 128 || (D == 256 && RowsPerWarp == 16),
                "prefill is built for head_dim 64 and 128, and 256 in 64-row blocks (128 rows would hold 256 output "
                "registers per thread)");
  static_assert(kRowsPerWarp != 32 || kBlockM == contract::kAttentionPrefillAnchorBlockM,
                "the anchored 128-row kernel's tile is the contract's (calibrate simulates it from there)");
  static_assert(kRowsPerWarp == 16 || kRowsPerWarp == 32, "one or two m16 fragments per warp");
  static_assert(kRowsPerPass % 4 == 0, "whole passes of rows (swizzled_pass)");
  static_assert(kBlockN % kRowsPerPass == 0 && kBlockM % kRowsPerPass == 0, "whole passes per tile");
  static_assert(kSmemBytes <= 227 * 1024, "Q and the ring fit one SM's shared memory");
  static_assert(kBlockN % kStepN == 0 && kStepN % 16 == 0, "whole k16 steps per compute step");
  static_assert(kBlockN == contract::kAttentionKvBlockSize,
                "a key tile is one KV block: one table lookup per tile (paged caches)");
};

}  // namespace attn
}  // namespace fdpp
