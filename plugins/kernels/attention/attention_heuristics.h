// Host-side choices for the attention kernels, as plain functions of the shapes (no CUDA calls): unit-tested on the
// CPU through fdpp_attention_decode_splits().
#pragma once

namespace fdpp {

// Query tokens per sequence up to which the split-KV decode kernel runs; longer prompts take the prefill kernel.
// Decode reads each KV head once for all G * seq rows of that head (in blocks of 16 rows), so it stays the better
// kernel while seq is small: at 8 tokens a 64-row prefill tile would be mostly padding.
constexpr int kDecodeMaxSeq = 8;

// Number of splits of the key range for the decode kernel.
//   units: CTAs per split (batch x kv heads x row blocks); tiles: key tiles in the longest sequence;
//   sms: streaming multiprocessors; ctas_per_sm: decode CTAs resident per SM (2 on the H200).
// Decode is bound by HBM bandwidth. Each split adds a partial per row that the combine kernel must read and add,
// so the fewest splits that keep every SM streaming win: one CTA per SM (splits = sms / units, rounded down), not
// one per resident slot. Measured on the H200 (run 4, same run, us): with twice these splits (one per slot) the
// grid was slower or equal in every multi-split shape: B=1 MHA L=1K 9.5 vs 10.3, GQA 32/8 B=1 L=8K 13.8 vs 14.7,
// L=32K 36.5 vs 37.4; equal within 1% at B=1 L=8K/32K and GQA B=8 L=1K/8K; GQA B=8 L=32K 246.1 vs 244.7 (0.6%
// slower, inside the run's noise). Four times these splits were slower everywhere (runs 2-4).
// At least 1 (more units than SMs: one split; the CTAs then fill the slots in equal waves), at most one split
// per tile and 128 (the combine reads them in one pass).
// One exception, measured: rows of >= kLongRowTiles tiles (32K keys at head_dim 128) when the rule gives at most
// 2 splits and one split's grid is a single wave: 4 splits. The CTAs of such grids stream 8-16 MB each and the few
// that end last leave the GPU part-idle; more, shorter CTAs fill in behind them. Same-run pairs (us):
//   B=8, 32 heads, L=32K (256 units): 1 split 978.9 / 970.8, 2 splits 961.0 / 960.5 (runs 3, 4), 4 splits 953.0
//     (run 4); 2 splits 932.7 against 4 splits 928.5 (run 8);
//   GQA 32/8, B=8, L=32K (64 units): 2 splits 246.1 / 240.4 against 4 splits 244.7 / 239.1 (runs 4, 8).
// At L=8K more splits were slower (B=8: 2 splits 244.9 / 245.1 vs 240.7 / 241.4: the combine costs more than the
// shorter tail saves), and with 4 or more splits from the main rule doubling was not better (B=1 L=32K 123.6 vs
// 123.0, GQA B=1 L=32K 36.2 vs 36.0, run 8).
// Not better, measured (run 19): one split on a 6-stage pipeline (one CTA per SM, 192 KB in flight each, no combine)
// where this rule gives 2 (GQA 32/8 B=8: L=1K 14.8 against 14.2 us, L=8K 90.8 against 65.6 -- as slow as one split
// on 3 stages, so what limits a lone CTA is not the bytes it has in flight).
// Worked examples (H200: 132 SMs x 2 CTAs; 64-key tiles at head_dim 128):
//   B=1, Hkv=32, L=1K  (16 tiles):  units 32  -> 4 splits of 4 tiles: 128 CTAs of 128 KB of K+V each
//   B=1, Hkv=32, L=32K (512 tiles): units 32  -> 4 splits of 128 tiles: 128 CTAs of 4 MB each
//   B=8, Hkv=32, L=1K or 8K:        units 256 -> 1 split: 256 CTAs (no combine: they write the output)
//   B=8, Hkv=32, L=32K (512 tiles): units 256 -> 1 split, long rows in one wave -> 4 splits: 1024 CTAs of 4 MB
//   B=1, Hkv=8 (GQA), L=8K (128 tiles): units 8 -> 16 splits of 8 tiles: 128 CTAs
//   B=1, Hkv=8, L=1K (16 tiles):    units 8   -> 16 splits of 1 tile: 128 CTAs
//   B=8, Hkv=8 (GQA, 4 rows per KV head: one row block): units 64 -> 2 splits (L=1K, 8K); at L=32K 4
//   B=16, Hkv=32:                   units 512 -> 1 split: 512 CTAs, two equal waves (any L)
constexpr int kLongRowTiles = 512;
inline int decode_num_splits(int units, int tiles, int sms, int ctas_per_sm) {
  if (units <= 0 || tiles <= 1 || sms <= 0) return 1;
  int splits = sms / units;
  const bool one_wave = units <= static_cast<long long>(sms) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  if (splits <= 2 && one_wave && tiles >= kLongRowTiles) splits = 4;
  if (splits < 1) splits = 1;
  const int cap = tiles < 128 ? tiles : 128;
  return splits > cap ? cap : splits;
}

// Whether a decode grid of `ctas` CTAs in `splits` splits combines them inside thread block clusters: on sm_90
// (clusters and distributed shared memory; the kernel's cluster code is compiled for sm_90a only), with 2 to 8
// splits (8 is the portable cluster size, and 7 other splits' row partials fit the first CTA's pipeline buffers),
// and only for a grid of at most one CTA per SM, which the launch enforces by padding the shared memory (the
// cluster scheduler otherwise put two CTAs of a cluster on one SM and left SMs idle). The launcher also checks
// that all the clusters are resident at once (cudaOccupancyMaxActiveClusters).
// Measured (H200, us, graph timing, cluster / combine kernel, same run):
//   run 31 (as committed): GQA 32/8 B=8 (64 units x 2 splits in clusters of 2) L=1K 12.8 / 14.4, L=8K 65.0 / 67.0
//     (cuDNN 14.4, 66.5). B=1 32 heads (32 units x 4 splits) is not taken: fewer than 32 clusters of 4 fit at once.
//   run 30 (no padding, no residency check): B=1 32 heads L=8K 52.6 / 36.4, L=32K 193.7 / 123.6; GQA B=8 L=32K
//     (256 CTAs, two per SM) 316.1 / 239.6.
constexpr int kMaxClusterSplits = 8;
// Pipeline stages of the split kernel (a stage: one key tile of K and V, 32 KB at either head_dim), from its grid:
//   ctas: CTAs of the split grid; sms: streaming multiprocessors; cluster: the splits combine in clusters;
//   tiles_per_split: key tiles one CTA streams (of the longest sequence).
// A cluster combine runs 3 stages (the other splits' partials land in its pipeline buffers, sized for 7 of them).
// A grid of more CTAs than SMs (two per SM) runs 2, and a grid of at most one CTA per SM 4 where each CTA streams
// at least kDeepStageTiles tiles, else 3: about 128 KB of loads in flight per SM in both long cases. More was
// slower with two CTAs per SM and fewer with one. Measured (H200 run 65, ratio cuDNN / ours, same process, 2 / 3 /
// 4 stages; head_dim 128, 32 query heads, fp16):
//   two CTAs per SM: MHA B=8 L=1K 1.005 / 0.995 / 0.926, L=8K 0.991 / 0.978 / 0.984, L=32K (1024 CTAs) 1.002 /
//     0.994 / 0.993; GQA 32/8 B=8 L=32K 0.998 / 0.992 / 0.979;
//   one CTA per SM: MHA B=1 L=8K (32 tiles per split) 0.855 / 0.975 / 0.978, L=32K (128) 0.840 / 0.989 / 0.991;
//     GQA B=1 L=32K (32) 0.877 / 1.000 / 1.003, L=8K (8) 0.970 / 1.041 / 1.010, L=1K (1) 1.085 / 1.048 / 1.032.
// Worked examples (H200, 132 SMs): MHA B=8 L=1K, 256 CTAs -> 2; GQA B=1 L=32K, 128 CTAs of 32 tiles -> 4; GQA B=1
// L=8K, 128 CTAs of 8 tiles -> 3; GQA B=8 L=8K in clusters of 2 -> 3.
constexpr int kDeepStageTiles = 32;
inline int decode_stages(long long ctas, int sms, bool cluster, int tiles_per_split) {
  if (cluster) return 3;
  if (ctas > sms) return 2;
  return tiles_per_split >= kDeepStageTiles ? 4 : 3;
}
inline bool cluster_combine_ok(int splits, int cc_major, long long ctas, int sms) {
  return cc_major == 9 && splits >= 2 && splits <= kMaxClusterSplits && ctas <= sms;
}

// Whether the plan tries one split fewer than decode_num_splits() gives, for rows of at most
// kClusterShortRowTiles tiles, when the rule's count cannot combine in clusters and one fewer can. On short rows
// the second kernel costs more than a quarter fewer CTAs. Measured (H200 run 34, us, same run; B=1, 32 heads,
// 32 units, cuDNN 10.35 / 36.4): L=1K (16 tiles) 4 splits + combine kernel 10.32, 3 splits in clusters 9.56;
// L=8K (128 tiles) 36.95 against 36.74, equal within noise, so long rows keep the rule's count.
constexpr int kClusterShortRowTiles = 32;
inline bool cluster_prefers_one_split_fewer(int splits, int tiles) {
  return splits > 2 && splits - 1 <= kMaxClusterSplits && tiles <= kClusterShortRowTiles;
}

// Prefill tile shape off Hopper (on sm_90 the launcher runs shape 4, the wgmma kernel, synchronized: see
// attention_forward in attention_launch.cu): 1 = 128 query rows per CTA in 32-key steps, 2 = 64 query rows per CTA
// in 64-key steps
// (3, shape 1 with a rolled Q.K loop and no register spills, was slower everywhere: it is never picked).
//   heads: batch x query heads; seq: query tokens; slots: prefill CTAs resident on the GPU (SMs x 2).
// A causal prefill ends when its heaviest query block (the last one, which sees every key) ends. While the grid
// of 128-row blocks fits in about two waves, that block is the critical path, and 64-row blocks halve it (twice
// the CTAs, each half the work). Beyond that the grid is long enough to balance itself, and the 128-row blocks
// win on arithmetic intensity: each K/V fragment read from shared memory feeds two m16 fragments instead of one.
// Measured (run 4, us, unified / synchronized): L=1K shape 2 56.8 / 55.4 against shape 1 60.2 / 62.7; at 4K and
// 16K shape 1 wins (492 vs 590 unified at 4K, 7287 vs 8881 at 16K).
// Worked examples (H200: 132 SMs x 2 = 264 slots; B=1, 32 heads):
//   L=1K:  32 x 8 = 256 blocks of 128 rows  <= 528 -> 2 (512 blocks of 64 rows; the heaviest does 16 key tiles
//          of 64 rows instead of 16 of 128)
//   L=4K:  32 x 32 = 1024 blocks > 528              -> 1
//   L=16K: 32 x 128 = 4096 blocks                   -> 1
inline int prefill_tile_config(int heads, int seq, int slots) {
  const long long blocks128 = static_cast<long long>(heads) * ((seq + 127) / 128);
  return blocks128 <= 2LL * slots ? 2 : 1;
}

// Whether a prefill asked for the unified max runs the synchronized softmax instead (exact, never falls back; the
// result is the same within the kernels' rounding). The plan picks it where it was measured faster: with the
// 64-row tile shape. H200, B=1, 32 heads, us, same run (run 4), unified / synchronized:
//   64-row blocks (2):  L=1K 56.8 / 55.4 (and 61.6 / 57.4 measured again), L=4K 589.5 / 564.0, L=16K 8880 / 8310
//   128-row blocks (1): L=1K 60.2 / 62.7, L=4K 492.1 / 528.9, L=16K 7287 / 7856
// With one m16 fragment per warp the unified kernel's extra work per score (its guard's running max) and its 4
// synchronized anchor tiles are not paid back by the rescales it skips; with two fragments they are.
inline bool prefill_prefers_synchronized(int heads, int seq, int slots) {
  return prefill_tile_config(heads, seq, slots) == 2;
}

}  // namespace fdpp
