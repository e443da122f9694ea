// Host-side choices of the portable kernels (portable_attention.cu, portable_gemm.cu), as plain functions of the
// shapes and of the GPU's compute-unit count: no CUDA or HIP calls, so the CPU tests exercise them through the C ABI
// (fdpp_portable_decode_splits, fdpp_portable_gemm_plan). The same rules run on an AMD MI210 (104 CUs, 64-lane
// wavefronts) and, for the cross-check, on the H200 (132 SMs, 32-lane warps); the worked examples give both.
#pragma once

#include <cstdint>

namespace fdpp {
namespace portable {

// Every portable kernel runs blocks of this many warps (wavefronts): 128 threads on NVIDIA, 256 on AMD.
constexpr int kBlockWarps = 4;
constexpr int kMi210Cus = 104;

// --- decode attention -------------------------------------------------------------------------------------------
// A block takes one query row and one split of its keys (groups of head_dim / 8 lanes per key, 16-byte loads).
// Rows are independent, so the split only has to give the GPU enough blocks: kBlocksPerCu per compute unit, one
// streaming keys while another reduces. Each split adds a partial the combine reads, so no more splits than that,
// none shorter than kMinKeysPerSplit keys (a split's fixed cost, the block reduction, stays small against its
// stream), and at most kMaxSplits.
//   rows: batch x query heads x query tokens; kv_len: keys of the longest row; cus: compute units (SMs).
// Worked examples, MI210 (104 CUs, target 208 blocks):
//   B=1, 32 heads, L=4K:   rows 32  -> ceil(208 / 32) = 7 splits of 586 keys
//   B=1, 32 heads, L=1K:   rows 32  -> 7, capped at 1024 / 256 = 4
//   B=8, 32 heads, L=4K:   rows 256 -> 1 (256 blocks already fill the GPU)
//   B=1, 1 head,   L=32K:  rows 1   -> 208, capped at 64
//   B=1, 8 heads,  L=300:  rows 8   -> 26, capped at 300 / 256 = 1
// On the H200 (132 SMs, target 264): B=1, 32 heads, L=4K -> 9 splits.
constexpr int kBlocksPerCu = 2;
constexpr int kMinKeysPerSplit = 256;
constexpr int kMaxSplits = 64;
inline int decode_num_splits(int64_t rows, int64_t kv_len, int cus) {
  if (rows <= 0 || cus <= 0 || kv_len <= kMinKeysPerSplit) return 1;
  const int64_t target = int64_t(kBlocksPerCu) * cus;
  int64_t splits = (target + rows - 1) / rows;
  const int64_t by_length = kv_len / kMinKeysPerSplit;
  if (splits > by_length) splits = by_length;
  if (splits > kMaxSplits) splits = kMaxSplits;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

// --- GEMM: GEMV vs flat GEMM, and the flat GEMM's tile ----------------------------------------------------------
// Both kernels give each warp a pair of weight rows (silu_mul: gate row i and up row N/2 + i, so the epilogue needs
// no exchange) and stream them with 16-byte loads along K, fp32 FMAs on CUDA cores / VALUs.
//   GEMV (M <= kGemvMaxM): each warp reads its activation chunks straight from global memory (cache hits: every
//     warp reads the same X); no block barrier, so warps never wait for each other.
//   flat (M <= kFlatMaxM): the block stages X[m_tile][k_chunk] in shared memory (LDS) once per step for all its
//     warps: at M = 16 that is 16 activation loads per weight load, which global loads per warp cannot keep up
//     with.
// Rows of X are padded to m_tile (1, 2, 4, 8, 16: the instantiated kernels), the padding rows being zeros.
// Worked examples: M=1 -> GEMV, tile 1; M=3 -> GEMV, tile 4; M=5 -> flat, tile 8; M=9 -> flat, tile 16;
// M=17 -> none (the portable kernels stop at 16; the vendor GEMM takes larger M).
enum class GemmKernel : int { kNone = 0, kGemv = 1, kFlat = 2 };
constexpr int kGemvMaxM = 4;
constexpr int kFlatMaxM = 16;
inline GemmKernel gemm_kernel(int64_t m) {
  if (m < 1 || m > kFlatMaxM) return GemmKernel::kNone;
  return m <= kGemvMaxM ? GemmKernel::kGemv : GemmKernel::kFlat;
}
inline int gemm_m_tile(int64_t m) {
  if (m < 1 || m > kFlatMaxM) return 0;
  int tile = 1;
  while (tile < m) tile *= 2;
  return tile;
}

// The flat GEMM's weight rows per warp: 2 pairs (4 rows: each activation value read from LDS feeds 4 FMAs) when
// the grid still has kBlocksPerCu blocks per compute unit that way, else 1 pair (more, smaller blocks).
//   pairs: weight row pairs (N / 2); cus: compute units.
// Worked examples: N=4096 (2048 pairs) is 256 blocks of 2 pairs -> 2 on the MI210 (>= 208), 1 on the H200
// (< 264); N=22016 silu_mul (11008 pairs) -> 2 on both; N=1000 (500 pairs, 63 blocks) -> 1.
inline int flat_pairs_per_warp(int64_t pairs, int cus) {
  const int64_t blocks_of_two = (pairs + 2 * kBlockWarps - 1) / (2 * kBlockWarps);
  return blocks_of_two >= int64_t(kBlocksPerCu) * cus ? 2 : 1;
}

// K elements the flat GEMM stages per step: one 16-byte load (8 elements) per lane per row, so a 64-lane wavefront
// takes 512 and a 32-lane warp 256. LDS per block: m_tile x k_chunk x 2 bytes = 16 KB at M = 16 on AMD.
inline int flat_k_chunk(int warp_size) { return 8 * warp_size; }

}  // namespace portable
}  // namespace fdpp
