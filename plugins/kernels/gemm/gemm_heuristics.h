// The heuristic dataflow of FlashDecoding++ (paper section 5) as pure host code: which implementation runs a
// GEMM Y[M, N] = X[M, K] W[N, K]^T for a given M, what an ImplB (flat GEMM) tile configuration looks like and
// which ones are valid, and the fallback plan used when a shape was never profiled.
//
// Nothing here measures anything: the profiler (`python -m fdpp_rewrite profile`) measures once per GPU and
// writes engines/profiles/<gpu>.json; the rewriter copies a shape's m1/m2/m3 and ImplB configs into the plugin
// node; at run time dispatch is select_impl(), a comparison of M against three integers.
//
// select_impl (with plan_implb_config) is the owner of the dispatch rule: its limits (kImplAMaxM, kImplBMaxM,
// kImplBWgmmaMaxM) are generated from the
// FlatGemm contract by plugins/common/contract_constants.cmake. fdpp_rewrite/dispatch.py is its one Python mirror
// (reading the same contract); tests/fdpp_rewrite/test_dispatch.py pins the two equal over a grid of M and plans.
//
// Plain C++17, no CUDA headers: the CPU tests exercise it through the C ABI (fdpp_gemm_select etc.).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "fdpp_contract_constants.h"

namespace fdpp {
namespace gemm {

// Implementation ids; the numbers are the C ABI's fdpp_gemm_impl values.
enum class Impl : int32_t {
  kAuto = 0,      // choose by the plan (select_impl)
  kA = 1,         // ImplA: GEMV on CUDA cores (M <= kImplAMaxM)
  kB = 2,         // ImplB: flat GEMM on tensor cores, batch on the MMA's 8-wide side (M <= kImplBMaxM)
  kCublasLt = 3,  // ImplC: cuBLASLt (loaded at run time)
  kCutlass = 4,   // ImplC: CUTLASS 2.x tensor-op GEMM, 64x128 tiles (M padded to 64)
};

// ImplB tile configuration. A CTA has 4 warps; warp w owns 16 weight rows (one m16 MMA block) and a kw-wide
// slice of each k_tile, with warps_n = n_tile / 16 and warps_k = 4 / warps_n, so kw = k_tile / warps_k.
//   n_tile  weight rows per CTA: 16, 32 or 64
//   k_tile  K elements per pipeline stage per CTA; kw = k_tile / warps_k must be 32, 64, 128 or 256
//   stages  cp.async pipeline depth, 1 (no overlap: load, wait, compute) .. 8
//   split_k CTAs (one thread-block cluster) sharing one tile's K range, reduced through distributed shared
//           memory: 1 .. 8; > 1 needs compute capability 9.0 (clusters)
//   loader  for k_tile 1024 configs, how the weight is streamed (ignored below): kLoaderTma, one CTA per SM with
//           a producer warp and the tensor memory accelerator (gemm_implb_bulk.cu); kLoaderRows, two 256-thread
//           CTAs per SM whose warps copy 256-byte row pieces with cp.async (gemm_implb_stream.cu), every stage's
//           weights issued before the PDL wait; kLoaderRows1, the same kernel issuing only its first unit's
//           weights before the wait in the first half of its grid and two units' in the second half (the other
//           stages fill right after it, with their activations); kLoaderPair (M <= 16, sm_90), a cluster of two
//           CTAs per 32-row block, one K half each, so that each CTA reads half the activations per weight byte,
//           every stage's weights issued before the wait (gemm_implb_pair.cu)
//   row_blocks  16-row weight blocks per warp in the warp-tiled kernel (gemm_implb.cu): 0 = the rule
//           (implb_row_blocks_per_warp), 1 = one (what the rule's second block gains can be measured against it)
constexpr int32_t kLoaderTma = 0;
constexpr int32_t kLoaderRows = 1;
constexpr int32_t kLoaderRows1 = 2;
constexpr int32_t kLoaderPair = 3;
// kLoaderWgmma (sm_90a, M <= kImplBWgmmaMaxM): not a 1024-column pipeline but its own kernel
// (gemm_implb_wgmma.cu) for the batches above what mma.sync keeps up with: warpgroup MMAs with 64 weight rows on
// their M side and the batch, padded to 32, 64, 128 or 256, on their N side; n_tile 64 (the weight rows of one
// warpgroup), k_tile 64 (one 128-byte swizzle row per stage), stages 2..8 (fewer where they do not fit), split_k
// 1..8 CTAs of a cluster along K, reduced through distributed shared memory.
constexpr int32_t kLoaderWgmma = 4;
struct ImplBConfig {
  int32_t n_tile;
  int32_t k_tile;
  int32_t stages;
  int32_t split_k;
  int32_t loader = kLoaderTma;
  int32_t row_blocks = 0;
};

// What the profile says about one (N, K, dtype): ImplA for M <= m1, ImplB with config implb for m1 < M <= m2,
// ImplB with config wgmma (loader wgmma) for m2 < M <= m3, ImplC above (ImplA only up to M = 8, ImplB's implb only
// up to M = 64, 256 when it is itself a wgmma config, and the wgmma range only up to 256, whatever the thresholds
// say). m1 = 0 means ImplA is never used; m2 = m1 that the first ImplB range is empty; m3 = m2 (every plan made
// before the third range existed) that there is no wgmma range, and then wgmma is not read.
struct Plan {
  int32_t m1;
  int32_t m2;
  ImplBConfig implb;
  int32_t implc;  // Impl::kCublasLt or Impl::kCutlass
  int32_t m3;
  ImplBConfig wgmma;
};

// The most rows each implementation takes (the FlatGemm contract's limits): ImplA keeps M accumulators per row in
// registers; ImplB puts at most 8 batch blocks of 8 on the MMA's N side; its 1024-column pipelines hold 2.
constexpr int kImplAMaxM = contract::kImplAMaxM;
constexpr int kImplBMaxM = contract::kImplBMaxM;
constexpr int kImplB1024MaxM = contract::kImplB1024MaxM;
static_assert(kImplAMaxM == 8 && kImplBMaxM == 64 && kImplB1024MaxM == 16,
              "the kernels are instantiated for these limits (and the messages below name them)");
// The wgmma loader's rows: the widest wgmma N is 256 (the contract's limit). It is meant for M from 17 (where the
// profiles hand mma.sync's ImplB over to cuBLASLt) up, where the profiler sweeps it; it runs any M from 1, padded to
// at least 32.
constexpr int kImplBWgmmaMinM = 17;
constexpr int kImplBWgmmaMaxM = contract::kImplBWgmmaMaxM;
static_assert(kImplBWgmmaMaxM == 256, "the wgmma kernel's widest N is 256 (and the messages below name it)");
constexpr int kImplBWarps = 4;
constexpr int kMaxSplitK = 8;  // portable thread-block cluster size
constexpr int kMaxStages = 8;

// Whether the Hopper paths (thread-block clusters, programmatic dependent launch, TMA) may run: the library's
// Hopper code is built for sm_90a only, and any other GPU runs the compute_80 PTX, where those paths are
// compiled out. So 9.x only -- not "9 or newer".
inline bool hopper_paths(int cc_major) { return cc_major == 9; }

// ---------------------------------------------------------------------------------------------------------
// Dispatch.
//
// Worked example (Llama2-7B o_proj [4096, 4096] with a plan m1 = 1, m2 = 32, ImplC = cuBLASLt):
//   M = 1   -> ImplA (GEMV; 1 <= m1)
//   M = 2   -> ImplB (1 < 2 <= 32)
//   M = 32  -> ImplB
//   M = 33  -> ImplC (cuBLASLt)
// With m1 = 0 (ImplB already wins at M = 1), M = 1 -> ImplB. M <= 0 is the caller's error (checked in the ABI).
// ---------------------------------------------------------------------------------------------------------
inline bool implb_is_wgmma(const ImplBConfig& c) { return c.loader == kLoaderWgmma; }

// The most rows an ImplB config takes: 256 for the wgmma loader, 64 for every other.
inline int implb_max_m(const ImplBConfig& c) { return implb_is_wgmma(c) ? kImplBWgmmaMaxM : kImplBMaxM; }

// With a wgmma ImplB config (loader 4) ImplB serves up to M = 256: m1 = 0, m2 = 256 -> M = 200 -> ImplB.
// The third range: m1 = 0, m2 = 16, m3 = 128 -> M = 16 ImplB (implb), M = 17 and 128 ImplB (wgmma), M = 129 ImplC.
inline Impl select_impl(int64_t m, const Plan& plan) {
  if (m <= plan.m1 && m <= kImplAMaxM) return Impl::kA;
  if (m <= plan.m2 && m <= implb_max_m(plan.implb)) return Impl::kB;
  if (m > plan.m2 && m <= plan.m3 && m <= kImplBWgmmaMaxM) return Impl::kB;
  return plan.implc == static_cast<int32_t>(Impl::kCutlass) ? Impl::kCutlass : Impl::kCublasLt;
}

// The config ImplB runs for m rows where select_impl(m, plan) is Impl::kB: wgmma above m2, implb up to it.
inline const ImplBConfig& plan_implb_config(int64_t m, const Plan& plan) {
  return m > plan.m2 ? plan.wgmma : plan.implb;
}

// Batch blocks of 8 that ImplB computes for M rows padded to pad_m (8 = the paper's choice; 16 and 64 exist for
// the ablation). Rounded up to an instantiated count: 1, 2, 3, 4, 6 or 8.
//   M = 1, pad 8 -> 1 block; M = 5, pad 8 -> 1; M = 9 -> 2; M = 20 -> 3; M = 33 -> 6; M = 64 -> 8
//   M = 1, pad 16 -> 2 blocks; M = 1, pad 64 -> 8 blocks
inline int implb_batch_blocks(int64_t m, int pad_m) {
  if (pad_m < 8) pad_m = 8;
  const int64_t padded = (m + pad_m - 1) / pad_m * pad_m;
  const int64_t blocks = (padded + 7) / 8;
  if (blocks <= 4) return static_cast<int>(blocks);
  if (blocks <= 6) return 6;
  return 8;
}

// k_tile >= 1024 selects one of ImplB's 16-row x 1024-column pipelines (M <= 16): by c.loader the TMA one
// (gemm_implb_bulk.cu: sm_90, K % 64 == 0, one CTA per SM, the weight streamed by the tensor memory accelerator)
// or the row-streaming cp.async one (gemm_implb_stream.cu: two CTAs per SM); smaller k_tile the warp-tiled
// cp.async kernel (gemm_implb.cu).
constexpr int kBulkMinKTile = 1024;
inline bool implb_is_bulk(const ImplBConfig& c) { return c.k_tile >= kBulkMinKTile; }
inline bool implb_is_pair(const ImplBConfig& c) { return implb_is_bulk(c) && c.loader == kLoaderPair; }
// The cp.async row-streaming family: the rows kernel (loaders rows and rows1) and the cluster-pair kernel.
inline bool implb_is_rows(const ImplBConfig& c) {
  return implb_is_bulk(c) && (c.loader == kLoaderRows || c.loader == kLoaderRows1 || c.loader == kLoaderPair);
}
// Units whose weights the rows kernel issues before the PDL wait (the rest of its ring fills after it), in the
// first or the second half of its grid: rows every stage; rows1 one unit, and two in the second half.
//   rows1, 2 stages: 1 / 2; rows1, 3 stages: 1 / 2; rows, 3 stages: 3 / 3
inline int implb_rows_lead_units(const ImplBConfig& c, bool second_half) {
  if (c.loader != kLoaderRows1) return c.stages;
  return second_half && c.stages >= 2 ? 2 : 1;
}

// Dynamic shared memory of the row-streaming kernel for m activation rows: per stage, 16 weight rows and m
// activation rows of 1024 columns (2 KB each).
//   3 stages, M = 1: 3 * 17 * 2048 = 104448 bytes (two CTAs fit an SM); M = 8: 3 * 24 * 2048 = 147456
inline int64_t implb_rows_smem_bytes(int stages, int64_t m) { return int64_t(stages) * (16 + m) * 2048; }
// The same for the cluster-pair kernel: per stage 32 weight rows and m activation rows of 512 columns (1 KB each).
//   2 stages, M = 8: 2 * 40 * 1024 = 81920 bytes (two CTAs fit an SM); 3 stages, M = 1: 3 * 33 * 1024 = 101376
inline int64_t implb_pair_smem_bytes(int stages, int64_t m) { return int64_t(stages) * (32 + m) * 1024; }

inline int implb_warps_n(const ImplBConfig& c) { return c.n_tile / 16; }
inline int implb_warps_k(const ImplBConfig& c) { return kImplBWarps / implb_warps_n(c); }
inline int implb_kw(const ImplBConfig& c) { return c.k_tile / implb_warps_k(c); }

// Dynamic shared memory of one ImplB CTA: per stage and warp, 16-byte slots for 32 lanes (512 B) for each of
// the kw/32 k-groups of the two weight rows a lane holds (per 16-row block the warp owns) and of each batch
// block; plus the fp32 reduction area.
//   n_tile 16, k_tile 256 (kw 64), 4 stages, 1 batch block: 4 * 4 * (2 + 1) * 2 * 512 + 2048 = 51200 bytes
// row_blocks: 16-row weight blocks per warp (the launcher uses 2 when there are >= 2 batch blocks, so each
// staged batch row feeds twice the MMAs; the config's n_tile is then per half-tile).
//   TMA: 16 rows x k_tile x 2 bytes per stage, plus 1024 bytes to align the ring for the 128-byte swizzle;
//        k_tile 1024, 3 stages: 3 * 32768 + 1024 = 99328 bytes
//   rows loader: implb_rows_smem_bytes at the batch blocks' 8 rows each (the launcher sizes it by M)
inline int64_t implb_smem_bytes(const ImplBConfig& c, int batch_blocks, int row_blocks = 1) {
  if (implb_is_pair(c)) return implb_pair_smem_bytes(c.stages, 8 * batch_blocks);
  if (implb_is_rows(c)) return implb_rows_smem_bytes(c.stages, 8 * batch_blocks);
  if (implb_is_bulk(c)) return int64_t(c.stages) * 16 * int64_t(c.k_tile) * 2 + 1024;
  const int64_t kgroups = implb_kw(c) / 32;
  const int64_t stage = int64_t(kImplBWarps) * (2 * row_blocks + batch_blocks) * kgroups * 512;
  return c.stages * stage + int64_t(kImplBWarps) * row_blocks * batch_blocks * 4 * 32 * 4;
}

// 16-row weight blocks per warp of the warp-tiled kernel: 2 from two batch blocks on, where the config's stages
// still fit, so that every batch fragment a warp stages and reads from shared memory feeds two MMAs (at M > 8 one
// block per warp ran out of shared-memory bandwidth); 1 below that, or when the config asks for 1.
//   n16 k256 s4, M = 9 (2 batch blocks), 227 KB: 4 * 4 * (4 + 2) * 2 * 512 + 8192 = 106496 bytes fit -> 2
inline int implb_row_blocks_per_warp(const ImplBConfig& c, int batch_blocks, int64_t max_smem) {
  if (batch_blocks < 2 || c.row_blocks == 1) return 1;
  return implb_smem_bytes(c, batch_blocks, 2) <= max_smem ? 2 : 1;
}

// Weight-row blocks of 16 (silu_mul: 8 gate rows + the matching 8 up rows) that ImplB tiles over.
//   N = 4096 -> 256; N = 22016 silu_mul (I = 11008) -> 1376; N = 960 -> 60
inline int64_t implb_row_blocks(int64_t n, bool silu_mul) { return silu_mul ? (n / 2 + 7) / 8 : (n + 15) / 16; }

// Row tiles times split_k at one 16-row block per warp: the work the persistent grid walks (when the launcher
// gives each warp two blocks, at M > 8, the tiles halve).
//   N = 4096, n_tile 16, split_k 2 -> 256 tiles * 2 = 512 CTAs
inline int64_t implb_grid(int64_t n, bool silu_mul, const ImplBConfig& c) {
  const int64_t tiles = (implb_row_blocks(n, silu_mul) + implb_warps_n(c) - 1) / implb_warps_n(c);
  return tiles * c.split_k;
}

// ---- the wgmma loader (gemm_implb_wgmma.cu) ---------------------------------------------------------------
constexpr int kWgmmaRows = 64;                  // weight rows per consumer warpgroup: wgmma's M
constexpr int kWgmmaTileRows = 2 * kWgmmaRows;  // two consumer warpgroups per CTA
constexpr int kWgmmaKStep = 64;                 // K per stage: one 128-byte swizzle row
constexpr int kWgmmaMaxStages = 8;
constexpr int kWgmmaStagePad = 4;  // floats after each staged batch row, so the accumulator stores spread over banks

// The batch columns (wgmma's N) the kernel computes for M rows.
//   M = 1..32 -> 32; M = 33 -> 64; M = 100 -> 128; M = 256 -> 256
inline int wgmma_batch_cols(int64_t m) { return m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256; }

// Dynamic shared memory: the ring (per stage 128 weight rows and bn batch rows of 128 bytes) or, where larger,
// the fp32 tile the epilogue stages in its place ([bn][128 + 4]), plus 1024 bytes to align it for the swizzle.
//   bn 256, 4 stages: 4 * (128 + 256) * 128 + 1024 = 197632; bn 32, 8 stages: 8 * 160 * 128 + 1024 = 164864
//   bn 256, 2 stages: the staged tile, 256 * 132 * 4 + 1024 = 136192
inline int64_t wgmma_smem_bytes(int stages, int bn) {
  const int64_t ring = int64_t(stages) * (kWgmmaTileRows + bn) * 128;
  const int64_t staged = int64_t(bn) * (kWgmmaTileRows + kWgmmaStagePad) * 4;
  return (ring > staged ? ring : staged) + 1024;
}

// The config's stages, fewer (never below 2) where they do not fit in max_smem with bn batch columns.
//   8 stages, bn 256, 227 KB -> 4; 8 stages, bn 32 -> 8
inline int wgmma_fit_stages(int stages, int bn, int64_t max_smem) {
  while (stages > 2 && wgmma_smem_bytes(stages, bn) > max_smem) --stages;
  return stages;
}

// CTA tiles of 128 weight rows (silu_mul: 64 gate rows and their 64 up rows, 64 outputs).
//   o [4096, 4096] -> 32; qkv [12288, 4096] -> 96; gate_up [22016, 4096] silu_mul -> 172
inline int64_t wgmma_tiles(int64_t n, bool silu_mul) {
  return silu_mul ? (n / 2 + kWgmmaRows - 1) / kWgmmaRows : (n + kWgmmaTileRows - 1) / kWgmmaTileRows;
}

// Split-K of the wgmma kernel when no profile says: the grid is not persistent and, from M = 65 (and with 8 stages
// below), one CTA fits an SM, so take the smallest cluster size along K (1..8) whose tiles * split fill the last wave
// of one CTA per SM best (within 2 %), keeping at least 8 steps of 64 columns per CTA.
//   132 SMs: o (32 tiles, 64 steps) -> 4 (128 CTAs, one wave 97 % full); qkv (96) -> 4 (384 CTAs, 3 waves, 97 %)
//   gate_up (172) -> 3 (516 CTAs, 4 waves, 98 %); down [4096, 11008] (32 tiles, 172 steps) -> 4
inline int wgmma_split_k(int64_t n, int64_t k, bool silu_mul, int num_sms) {
  const int64_t tiles = wgmma_tiles(n, silu_mul);
  const int64_t steps = (k + kWgmmaKStep - 1) / kWgmmaKStep;
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  int best = 1;
  double best_fill = 0.0;
  for (int split = 1; split <= kMaxSplitK && (split == 1 || steps / split >= 8); ++split) {
    const int64_t ctas = tiles * split;
    const double fill = double(ctas) / double((ctas + sms - 1) / sms * sms);
    if (fill > best_fill + 0.02) {
      best = split;
      best_fill = fill;
    }
  }
  return best;
}

// The wgmma config where no profile says: 8 stages (the launcher keeps what fits) and wgmma_split_k.
inline ImplBConfig default_wgmma_config(int64_t n, int64_t k, bool silu_mul, int num_sms) {
  return ImplBConfig{kWgmmaRows, kWgmmaKStep, kWgmmaMaxStages, wgmma_split_k(n, k, silu_mul, num_sms), kLoaderWgmma};
}

// Why a wgmma config cannot run on a device (every M up to 256 is checked: two stages fit for all of them).
inline const char* wgmma_config_problem(const ImplBConfig& c, int64_t k, int64_t max_smem, int cc_major) {
  if (c.n_tile != kWgmmaRows || c.k_tile != kWgmmaKStep)
    return "a wgmma ImplB config (loader 4) needs n_tile 64 and k_tile 64 (its tiling is fixed)";
  if (c.stages < 2 || c.stages > kWgmmaMaxStages) return "a wgmma ImplB config needs 2 to 8 stages";
  if (c.split_k < 1 || c.split_k > kMaxSplitK) return "split_k must be in 1..8";
  if (!hopper_paths(cc_major)) return "a wgmma ImplB config needs a compute capability 9.x GPU (sm_90a code)";
  if ((k + kWgmmaKStep - 1) / kWgmmaKStep < c.split_k)
    return "split_k is larger than the number of 64-column steps along K";
  if (wgmma_smem_bytes(2, kImplBWgmmaMaxM) > max_smem)
    return "two stages of the wgmma ImplB need more shared memory than the GPU has";
  return nullptr;
}

// Why a config cannot run, or nullptr if it can. max_smem is the device's opt-in shared memory per block,
// cc_major its compute capability (clusters need 9).
inline const char* implb_config_problem(const ImplBConfig& c, int64_t k, int batch_blocks, int64_t max_smem,
                                        int cc_major) {
  if (c.loader != kLoaderTma && c.loader != kLoaderRows && c.loader != kLoaderRows1 && c.loader != kLoaderPair &&
      c.loader != kLoaderWgmma)
    return "loader must be 0 (TMA), 1 (rows), 2 (rows1), 3 (pair) or 4 (wgmma)";
  if (c.row_blocks != 0 && c.row_blocks != 1) return "row_blocks must be 0 (the rule) or 1";
  if (implb_is_wgmma(c)) return wgmma_config_problem(c, k, max_smem, cc_major);
  if (implb_is_pair(c)) {
    if (c.n_tile != 16 || c.k_tile != 1024 || c.split_k != 1)
      return "a pair ImplB config needs n_tile 16, k_tile 1024 and split_k 1 (its tiling is fixed)";
    if (c.stages < 2 || c.stages > 3) return "a pair ImplB config needs 2 or 3 stages";
    if (!hopper_paths(cc_major))
      return "a pair ImplB config needs thread-block clusters (a compute capability 9.x GPU)";
    if (8 * batch_blocks > kImplB1024MaxM) return "a pair ImplB config handles M <= 16";
    if (implb_pair_smem_bytes(2, 8 * batch_blocks) > max_smem)
      return "two stages of the pair ImplB need more shared memory than the GPU has";
    return nullptr;
  }
  if (implb_is_rows(c)) {
    if (c.n_tile != 16 || c.k_tile != 1024 || c.split_k != 1)
      return "a rows ImplB config needs n_tile 16, k_tile 1024 and split_k 1";
    if (c.stages < 2 || c.stages > 4) return "a rows ImplB config needs 2 to 4 stages";
    if (8 * batch_blocks > kImplB1024MaxM) return "a rows ImplB config handles M <= 16";
    if (implb_rows_smem_bytes(2, 8 * batch_blocks) > max_smem)
      return "two stages of the rows ImplB need more shared memory than the GPU has";
    return nullptr;
  }
  if (implb_is_bulk(c)) {
    if (c.n_tile != 16 || c.k_tile != 1024 || c.split_k != 1)
      return "a TMA ImplB config (k_tile >= 1024) needs n_tile 16, k_tile 1024 and split_k 1";
    if (c.stages < 2 || c.stages > 4) return "a TMA ImplB config needs 2 to 4 stages";
    if (!hopper_paths(cc_major)) return "a TMA ImplB config (k_tile >= 1024) needs a compute capability 9.x GPU";
    if (8 * batch_blocks > kImplB1024MaxM) return "a TMA ImplB config handles M <= 16";
    if (k % 64 != 0) return "a TMA ImplB config needs K to be a multiple of 64";
    if (implb_smem_bytes(c, batch_blocks) > max_smem)
      return "stages * k_tile needs more shared memory than the GPU has";
    return nullptr;
  }
  if (c.n_tile != 16 && c.n_tile != 32 && c.n_tile != 64) return "n_tile must be 16, 32 or 64";
  const int kw_times_wk = c.k_tile;
  if (kw_times_wk <= 0 || kw_times_wk % implb_warps_k(c) != 0) return "k_tile must be a multiple of 4 / (n_tile / 16)";
  const int kw = implb_kw(c);
  if (kw != 32 && kw != 64 && kw != 128 && kw != 256)
    return "k_tile / (4 / (n_tile / 16)) (the K slice of one warp per stage) must be 32, 64, 128 or 256";
  if (c.stages < 1 || c.stages > kMaxStages) return "stages must be in 1..8";
  if (c.split_k < 1 || c.split_k > kMaxSplitK) return "split_k must be in 1..8";
  if (c.split_k > 1 && !hopper_paths(cc_major))
    return "split_k > 1 needs thread-block clusters (a compute capability 9.x GPU)";
  const int64_t steps = (k + c.k_tile - 1) / c.k_tile;
  if (steps < c.split_k) return "split_k is larger than the number of k_tile steps along K";
  if (implb_smem_bytes(c, batch_blocks) > max_smem) return "stages * k_tile needs more shared memory than the GPU has";
  return nullptr;
}

// ImplA (GEMV) split-K: the CTAs of one cluster share a row pair's K range. One warp owns a pair of rows; we
// want at least 8 warps per SM resident, and each split to keep at least 256 chunks of 8 elements
// (8 loads of 16 B per lane) so that the loop still streams.
//   o_proj [4096, 4096], 132 SMs: 2048 row pairs >= 1056 -> split 1
//   smollm2 o [576, 576]: 288 pairs, but K/8 = 72 chunks -> split 1
//   [1024, 16384]: 512 pairs < 1056 and 2048 chunks -> split 2 (1024 warps < 1056, 2048 / 4 = 512 >= 256)
//                  -> split 4 (2048 warps >= 1056) -> 4
inline int impla_split_k(int64_t n, int64_t k, bool silu_mul, int num_sms, int cc_major) {
  if (!hopper_paths(cc_major)) return 1;
  const int64_t pairs = silu_mul ? n / 2 : (n + 1) / 2;
  const int64_t chunks = k / 8;
  int split = 1;
  while (split < kMaxSplitK && pairs * split < int64_t(num_sms) * 8 && chunks / (split * 2) >= 256) split *= 2;
  return split;
}

// The ImplB configuration used when a shape has no profile ("unprofiled-default"). Pick the widest n_tile
// that still gives every SM two CTAs, give each warp a 128-wide K slice per stage (the H200 profiles' winners
// all use kw = 128), 3 stages, then split K across a cluster until there are two CTAs per SM.
//   qkv [12288, 4096], 132 SMs: 768 row blocks; n_tile 64 -> 192 CTAs < 264; n_tile 32 -> 384 >= 264
//       -> {n_tile 32, k_tile 256, stages 3, split_k 1}
//   o [4096, 4096]: 256 blocks; n_tile 16 -> 256 CTAs < 264 -> split_k 2 (512 CTAs) -> {16, 512, 3, 2}
//   gate_up [22016, 4096] silu_mul: 1376 blocks; n_tile 64 -> 344 >= 264 -> {64, 128, 3, 1}
//   smollm2 o [576, 576]: 36 blocks -> n_tile 16, K = 576 is 2 steps of 512 -> split_k 2 -> {16, 512, 3, 2}
inline ImplBConfig default_implb_config(int64_t n, int64_t k, bool silu_mul, int num_sms, int cc_major) {
  const int64_t blocks = implb_row_blocks(n, silu_mul);
  const int64_t want = 2 * int64_t(num_sms);
  ImplBConfig c{16, 512, 3, 1};
  for (int n_tile : {64, 32, 16}) {
    if ((blocks + n_tile / 16 - 1) / (n_tile / 16) >= want || n_tile == 16) {
      c.n_tile = n_tile;
      break;
    }
  }
  c.k_tile = 128 * implb_warps_k(c);
  if (hopper_paths(cc_major)) {
    const int64_t steps = (k + c.k_tile - 1) / c.k_tile;
    while (c.split_k < kMaxSplitK && implb_grid(n, silu_mul, c) < want && steps >= 2 * c.split_k) c.split_k *= 2;
  }
  return c;
}

// The plan for a shape with no profile, from the FlatGemm contract's unprofiled_default (m1 0, m2 8, cuBLASLt):
// ImplB from M = 1 up to 8 (one batch block: where it streams the weight as fast as the libraries do on the H200,
// and where the paper's padding argument is strongest), cuBLASLt above. Never ImplA: without a measurement we do
// not know where its CUDA-core arithmetic stops keeping up.
inline Plan default_plan(int64_t n, int64_t k, bool silu_mul, int num_sms, int cc_major) {
  Plan p{};
  p.m1 = contract::kUnprofiledM1;
  p.m2 = contract::kUnprofiledM2;
  p.implb = default_implb_config(n, k, silu_mul, num_sms, cc_major);
  p.implc = static_cast<int32_t>(Impl::kCublasLt);
  p.m3 = p.m2;  // no wgmma range: unmeasured, cuBLASLt keeps the batches above m2
  p.wgmma = default_wgmma_config(n, k, silu_mul, num_sms);
  return p;
}

// The most rows the plan sends to its first ImplB config (0 when it never does): select_impl's range
// (min(m1, 8), min(m2, 64)] (min(m2, 256) for a wgmma config).
//   m1 = 0, m2 = 16 -> 16; m1 = 100, m2 = 200 -> 64 (ImplA up to 8, ImplB 9..64); m1 = m2 = 4 -> 0
//   wgmma config, m1 = 0, m2 = 300 -> 256
inline int64_t implb_plan_max_m(const Plan& p) {
  const int64_t lo = p.m1 < kImplAMaxM ? p.m1 : kImplAMaxM;
  const int64_t cap = implb_max_m(p.implb);
  const int64_t hi = p.m2 < cap ? p.m2 : cap;
  return hi > lo ? hi : 0;
}

// Plan sanity, or nullptr: thresholds ordered, implc known, and a 1024-column ImplB config only where ImplB sees
// at most 16 rows. Thresholds above what an implementation can do are allowed (the FlatGemm contract accepts any
// M): select_impl caps ImplA at M <= 8 and ImplB at M <= 64 (256 with a wgmma config). (The rest of the ImplB config
// is checked at launch,
// where M and the device are known.)
//   {m1 0, m2 16, k_tile 1024} -> ok; {m1 0, m2 32, k_tile 1024} -> refused (M = 17..32 would reach it)
// The third range: m3 >= m2; where it is not empty (m3 > m2) its config is a wgmma one (loader 4), m3 <= 256 and
// m2 <= 64 (no M between the two ImplB ranges falls to ImplC). Where it starts is the profiler's choice: it gives
// the wgmma range only the M above m2 (where cuBLASLt won over mma.sync) at which wgmma, padding M to 32, was
// measured to beat cuBLASLt, so the wgmma config never takes M from the mma.sync one.
//   {m2 16, m3 256, wgmma loader 4} -> ok; {m2 16, m3 8} -> refused; {m2 16, m3 64, loader 0} -> refused
inline const char* plan_problem(const Plan& p) {
  if (p.m1 < 0) return "m1 must be >= 0";
  if (p.m2 < p.m1) return "m2 must be >= m1";
  if (p.implc != static_cast<int32_t>(Impl::kCublasLt) && p.implc != static_cast<int32_t>(Impl::kCutlass))
    return "implc must be 3 (cuBLASLt) or 4 (CUTLASS)";
  if (implb_is_bulk(p.implb) && implb_plan_max_m(p) > kImplB1024MaxM)
    return "a k_tile 1024 ImplB config serves M <= 16: lower m2 to 16 or pick a smaller k_tile";
  if (p.m3 < p.m2) return "m3 must be >= m2 (m3 = m2: no wgmma range)";
  if (p.m3 > kImplBWgmmaMaxM && p.m3 > p.m2)
    return "m3 must be <= 256 (the wgmma ImplB's widest batch): lower m3, or set m3 = m2 for no wgmma range";
  if (p.m3 > p.m2 && p.m2 > implb_max_m(p.implb))
    return "with a wgmma range (m3 > m2), m2 must be <= 64, the first ImplB config's last row (else M 65..m2 fall "
           "to ImplC between the ranges): lower m2, or set m3 = m2";
  if (p.m3 > p.m2 && !implb_is_wgmma(p.wgmma))
    return "the ImplB config of the range m2 < M <= m3 must use the wgmma loader (4): set its loader, or m3 = m2";
  return nullptr;
}

constexpr int kCandidateMaxKTile = 512;

// The ImplB configurations the profiler sweeps for a shape, written to out[0..cap) in a fixed order; returns
// how many there are (may exceed cap). Only configs valid for batch_blocks are listed.
inline int implb_candidates(int64_t n, int64_t k, bool silu_mul, int batch_blocks, int num_sms, int64_t max_smem,
                            int cc_major, ImplBConfig* out, int cap) {
  int count = 0;
  const int64_t blocks = implb_row_blocks(n, silu_mul);
  for (int n_tile : {16, 32, 64}) {
    // A tile wider than the matrix only idles warps.
    if (n_tile > 16 && blocks < n_tile / 16) continue;
    for (int kw : {32, 64, 128, 256}) {
      for (int stages : {2, 3, 4}) {
        for (int split_k : {1, 2, 4, 8}) {
          ImplBConfig c{n_tile, kw * (kImplBWarps / (n_tile / 16)), stages, split_k};
          // The FlatGemm contract (plugins/FlatGemmPlugin/contract.json) carries k_tile <= 512, stages <= 4.
          if (c.k_tile > kCandidateMaxKTile) continue;
          if (implb_config_problem(c, k, batch_blocks, max_smem, cc_major) != nullptr) continue;
          // Prune configs that cannot be competitive: split K only while the grid is short of 4 CTAs per SM,
          // and keep at least 16 KB per CTA in flight (stages * n_tile * k_tile * 2 bytes >= 16384).
          const int64_t grid_unsplit = implb_grid(n, silu_mul, ImplBConfig{n_tile, c.k_tile, stages, 1});
          if (split_k > 1 && grid_unsplit * (split_k / 2) >= 4 * int64_t(num_sms)) continue;
          if (int64_t(stages) * n_tile * c.k_tile * 2 < 16384) continue;
          if (count < cap) out[count] = c;
          ++count;
        }
      }
    }
  }
  for (int stages : {2, 3, 4}) {
    const ImplBConfig c{16, kBulkMinKTile, stages, 1};
    if (implb_config_problem(c, k, batch_blocks, max_smem, cc_major) != nullptr) continue;
    if (count < cap) out[count] = c;
    ++count;
  }
  // The rows kernel: 2 and 3 stages (with 4 or more, two CTAs never fit an SM; the launcher takes fewer
  // stages where M's activation rows do not let two CTAs fit), leading with all of them or with one unit; the
  // cluster-pair kernel (M <= 16) the same way.
  for (int32_t loader : {kLoaderRows, kLoaderRows1, kLoaderPair})
    for (int stages : {2, 3}) {
      const ImplBConfig c{16, kBulkMinKTile, stages, 1, loader};
      if (implb_config_problem(c, k, batch_blocks, max_smem, cc_major) != nullptr) continue;
      if (count < cap) out[count] = c;
      ++count;
    }
  return count;
}

// The wgmma configs the profiler sweeps for a shape (M from kImplBWgmmaMinM; the same list for every M, as the
// launcher fits the stages to M), written to out[0..cap); returns how many there are. 4 stages (two CTAs per SM up
// to M = 64) or 8 (one, the deepest ring that fits) times every split_k whose last wave is at least 85 % full (with
// 8 steps of 64 columns per CTA), and wgmma_split_k's.
//   o [4096, 4096], 132 SMs: splits 4 (97 %) and 8 (97 %) -> 4 configs
inline int wgmma_candidates(int64_t n, int64_t k, bool silu_mul, int num_sms, int64_t max_smem, int cc_major,
                            ImplBConfig* out, int cap) {
  int count = 0;
  const int64_t tiles = wgmma_tiles(n, silu_mul);
  const int64_t steps = (k + kWgmmaKStep - 1) / kWgmmaKStep;
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  const int chosen = wgmma_split_k(n, k, silu_mul, num_sms);
  for (int stages : {4, kWgmmaMaxStages}) {
    for (int split = 1; split <= kMaxSplitK; ++split) {
      const ImplBConfig c{kWgmmaRows, kWgmmaKStep, stages, split, kLoaderWgmma};
      if (wgmma_config_problem(c, k, max_smem, cc_major) != nullptr) continue;
      const int64_t ctas = tiles * split;
      const bool full = ctas * 100 >= 85 * ((ctas + sms - 1) / sms * sms) && (split == 1 || steps / split >= 8);
      if (!full && split != chosen) continue;
      if (count < cap) out[count] = c;
      ++count;
    }
  }
  return count;
}

}  // namespace gemm
}  // namespace fdpp
