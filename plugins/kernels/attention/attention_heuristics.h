// Host-side choices for the attention kernels, as plain functions of the shapes (no CUDA calls): unit-tested on the
// CPU through the C ABI (fdpp_attention_decode_splits() and its neighbours). Why each rule is what it is, with the
// measurements: docs/notes-attention.md.
#pragma once

namespace fdpp {

// Query tokens per sequence up to which the split-KV decode kernel runs; longer prompts take the prefill kernel.
// Decode reads each KV head once for all G * seq rows of that head (in blocks of 16 rows), so it stays the better
// kernel while seq is small: at 8 tokens a 64-row prefill tile would be mostly padding.
constexpr int kDecodeMaxSeq = 8;

// A prompt chunk of up to kChunkDecodeMaxSeq tokens takes the decode kernel too when the prefill grid (batch x
// query heads x 128-row blocks, one CTA each) is smaller than the GPU: the decode kernel splits the key range
// over the idle SMs. A serving step that prefills a 128-token chunk of one Llama2-7B prompt (B = 1, 32 heads) is
// 32 prefill CTAs on 132 SMs: a grid that leaves most SMs idle, while the decode kernel's key splits fill them
// (the timings behind the 128-token bound: docs/notes-attention.md, "Which kernel").
// Worked example (132 SMs): B = 1, 32 heads, seq 128 -> 32 CTAs -> decode; B = 8 -> 256 CTAs -> prefill.
constexpr int kChunkDecodeMaxSeq = 128;
inline bool chunk_takes_decode(int batch, int heads, int seq, int sms) {
  if (seq <= kDecodeMaxSeq) return true;
  return seq <= kChunkDecodeMaxSeq && static_cast<long long>(batch) * heads * ((seq + 127) / 128) < sms;
}

// Number of splits of the key range for the decode kernel.
//   units: CTAs per split (batch x kv heads x row blocks); tiles: key tiles in the longest sequence;
//   sms: streaming multiprocessors; ctas_per_sm: decode CTAs resident per SM (2 on the H200).
// Decode is bound by HBM bandwidth, and each split adds a partial per row that the combine must read and add, so
// the fewest splits that keep every SM streaming win: one CTA per SM (splits = sms / units, rounded down), not one
// per resident slot. At least 1 (more units than SMs: the CTAs fill the slots in equal waves), at most one split
// per tile and 128 (the combine reads them in one pass). One exception: rows of at least kLongRowTiles tiles where
// the rule gives at most 2 splits and one split's grid is a single wave take 4 splits, because the few CTAs of
// such a grid that end last (each streams 8-16 MB) leave the GPU part-idle, and more, shorter CTAs fill in.
// Worked example (H200: 132 SMs x 2 CTAs, 64-key tiles at head_dim 128): B=1, 8 KV heads (GQA), L=8K is 8 units
// of 128 tiles -> 132 / 8 = 16 splits of 8 tiles, 128 CTAs; B=8, 32 KV heads, L=32K is 256 units of 512 tiles in
// one wave -> 1 split by the rule, long rows -> 4 splits.
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
// and only for a grid of at most one CTA per SM, which the launch enforces by padding the shared memory (otherwise
// the cluster scheduler put two CTAs of a cluster on one SM and left others idle). The launcher also checks that
// all the clusters are resident at once (cudaOccupancyMaxActiveClusters). One kernel instead of two per call.
// Worked example (H200): GQA 32/8, B=8 is 64 units x 2 splits = 128 CTAs -> clusters of 2; B=1 with 32 heads is
// 32 units x 4 splits, which passes this rule, but fewer than 32 clusters of 4 fit at once -> the combine kernel.
constexpr int kMaxClusterSplits = 8;
inline bool cluster_combine_ok(int splits, int cc_major, long long ctas, int sms) {
  return cc_major == 9 && splits >= 2 && splits <= kMaxClusterSplits && ctas <= sms;
}

// Pipeline stages of the split kernel (a stage: one key tile of K and V, 32 KB at either head_dim), from its grid:
//   ctas: CTAs of the split grid; sms: streaming multiprocessors; cluster: the splits combine in clusters;
//   tiles_per_split: key tiles one CTA streams (of the longest sequence).
// A cluster combine runs 3 stages (the other splits' partials land in its pipeline buffers, sized for 7 of them).
// A grid of more CTAs than SMs (two per SM) runs 2, and a grid of at most one CTA per SM 4 where each CTA streams
// at least kDeepStageTiles tiles, else 3: about 128 KB of loads in flight per SM in both long cases, the depth that
// saturates the streaming read (docs/notes-attention.md, "Pipeline depth by grid").
// Worked example (H200, 132 SMs): GQA B=1 L=32K is 128 CTAs of 32 tiles -> 4; MHA B=8 L=1K, 256 CTAs -> 2.
constexpr int kDeepStageTiles = 32;
inline int decode_stages(long long ctas, int sms, bool cluster, int tiles_per_split) {
  if (cluster) return 3;
  if (ctas > sms) return 2;
  return tiles_per_split >= kDeepStageTiles ? 4 : 3;
}

// Whether the plan tries one split fewer than decode_num_splits() gives, for rows of at most
// kClusterShortRowTiles tiles, when the rule's count cannot combine in clusters and one fewer can: on short rows
// the second kernel costs more than a quarter fewer CTAs; on long rows the two are even, so they keep the rule's.
// Worked example (H200): B=1, 32 heads, L=1K (16 tiles) -> 4 splits cannot form resident clusters, 3 can -> 3.
constexpr int kClusterShortRowTiles = 32;
inline bool cluster_prefers_one_split_fewer(int splits, int tiles) {
  return splits > 2 && splits - 1 <= kMaxClusterSplits && tiles <= kClusterShortRowTiles;
}

// Prefill tile shape where the wgmma kernel does not run (off sm_90; on sm_90 the plan runs shape 4, see
// attention_forward in attention_launch.cu): 1 = 128 query rows per CTA in 32-key steps, 2 = 64 query rows per CTA
// in 64-key steps.
//   heads: batch x query heads; seq: query tokens; slots: prefill CTAs resident on the GPU (SMs x 2).
// A causal prefill ends when its heaviest query block (the last, which sees every key) ends. While the grid of
// 128-row blocks fits in about two waves, that block is the critical path, and 64-row blocks halve it (twice the
// CTAs, each half the work). Beyond that the grid balances itself, and the 128-row blocks win on arithmetic
// intensity: each K/V fragment read from shared memory feeds two m16 fragments instead of one.
// Worked example (H200: 132 SMs x 2 = 264 slots; B=1, 32 heads): L=1K is 32 x 8 = 256 blocks of 128 rows <= 528
// -> 2; L=4K is 1024 blocks -> 1.
inline int prefill_tile_config(int heads, int seq, int slots) {
  const long long blocks128 = static_cast<long long>(heads) * ((seq + 127) / 128);
  return blocks128 <= 2LL * slots ? 2 : 1;
}

// Whether a prefill asked for the unified max runs the synchronized softmax instead (exact, never falls back; the
// same result within the kernels' rounding): with the 64-row tile shape. There one m16 fragment per warp does not
// pay back the unified kernel's extra work per score (its guard's running max) and its 4 synchronized anchor tiles
// with the rescales it skips; with two fragments it does. Worked example: B=1, 32 heads, L=1K on the H200 -> shape 2,
// synchronized.
inline bool prefill_prefers_synchronized(int heads, int seq, int slots) {
  return prefill_tile_config(heads, seq, slots) == 2;
}

}  // namespace fdpp
