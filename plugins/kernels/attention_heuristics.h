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
//   slots: CTAs resident on the whole GPU at once (SMs x CTAs per SM).
// Decode is bound by HBM bandwidth, which stays saturated as long as nearly every SM streams. The best grid is
// therefore ONE wave of equal CTAs that fills the slots: every CTA starts at once and ends at about the same
// time, so there is no tail of a half-empty last wave (two waves of 1.2 slots each would leave the second running
// at a fifth of the bandwidth). So splits = slots / units, rounded down, at least 1 (more units than slots: one
// split, several equal waves), at most one split per tile and 128 (the combine reads them in one pass).
// One exception, measured: when the units alone make the single wave (one split) and the rows are very long
// (>= kLongRowTiles tiles), 2 splits are faster: each CTA of the one-split grid streams 16 MB at L=32K, and the
// few CTAs that end last leave the GPU part-idle; with 2 splits the second half-wave fills in behind the first
// and the tail is half as long. H200, B=8, 32 heads, L=32K: 978.9 us at 1 split, 961.0 at 2 (and run 2 likewise
// had 2 splits faster there only); at L=8K 2 splits were slower (244.9 vs 240.7: the combine costs more than the
// shorter tail saves), so the rule starts at 32K keys.
// Worked examples (H200: 132 SMs x 2 CTAs = 264 slots; 64-key tiles at head_dim 128):
//   B=1, Hkv=32, L=1K  (16 tiles):  units 32  -> 8 splits of 2 tiles: 256 CTAs of 64 KB of K+V each
//   B=1, Hkv=32, L=32K (512 tiles): units 32  -> 8 splits of 64 tiles: 256 CTAs of 2 MB each
//   B=8, Hkv=32, L=1K or 8K:        units 256 -> 1 split: 256 CTAs (no combine: they write the output)
//   B=8, Hkv=32, L=32K (512 tiles): units 256 -> 1 split, long rows -> 2 splits: 512 CTAs of 8 MB
//   B=1, Hkv=8 (GQA), L=8K (128 tiles): units 8 -> 33 splits; chunks of ceil(128/33) = 4 tiles,
//                                       so 32 of them hold keys: 256 CTAs
//   B=1, Hkv=8, L=1K (16 tiles):    units 8   -> 16 splits of 1 tile (capped by the tiles): 128 CTAs
//   B=16, Hkv=32:                   units 512 -> 1 split: 512 CTAs, two equal waves (any L)
constexpr int kLongRowTiles = 512;
inline int decode_num_splits(int units, int tiles, int slots) {
  if (units <= 0 || tiles <= 1 || slots <= 0) return 1;
  int splits = slots / units;
  const int cap = tiles < 128 ? tiles : 128;
  if (splits > cap) splits = cap;
  if (splits == 1 && units <= slots && tiles >= kLongRowTiles) splits = 2;
  return splits < 1 ? 1 : splits;
}

// Prefill tile shape: 1 = 128 query rows per CTA in 32-key steps, 2 = 64 query rows per CTA in 64-key steps.
//   heads: batch x query heads; seq: query tokens; slots: prefill CTAs resident on the GPU (SMs x 2).
// A causal prefill ends when its heaviest query block (the last one, which sees every key) ends. While the grid
// of 128-row blocks fits in about two waves, that block is the critical path, and 64-row blocks halve it (twice
// the CTAs, each half the work). Beyond that the grid is long enough to balance itself, and the 128-row blocks
// win on arithmetic intensity: each K/V fragment read from shared memory feeds two m16 fragments instead of one.
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
// plan may pick it where it was measured faster: the choice is the library's, the result the same within the
// kernels' rounding). Not for any shape yet.
inline bool prefill_prefers_synchronized(int heads, int seq, int slots) {
  (void)heads, (void)seq, (void)slots;
  return false;
}

}  // namespace fdpp
