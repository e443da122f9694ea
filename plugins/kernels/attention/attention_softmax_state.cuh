// The per-row softmax state of the tensor-core attention kernels, in its two variants side by side.
//
// A thread holds kRows query rows (the rows of its mma accumulator fragments); the 4 threads of a quad
// (lanes 4g .. 4g+3) share each row and hold different keys of it. Scores arrive as x = s * log2(e), already
// shifted by phi * log2(e) in the unified variant.
//
//   UnifiedMaxSoftmax (FlashDecoding++)         SynchronizedSoftmax (FlashAttention-2 / FlashDecoding)
//   p = 2^(x - phi'), phi' fixed per layer      p = 2^(x - m), m = running row max
//   no per-tile max, no rescale of the output   per tile: row max over the quad, rescale output and l by 2^(m_old - m)
//   partials of tiles, warps, splits just add   partials merge as sum_i 2^(m_i - M) * part_i, M = max_i m_i
//   a guard records the visible x range; rows   always safe; nothing to record
//   outside the window are recomputed exactly
//
// AnchoredUnifiedSoftmax (the prefill kernel's unified max): a prefill CTA sees all keys of its rows, so instead of
// the calibrated phi it anchors each row on its own scores: the first kAnchorTiles tiles it processes (the
// diagonal tiles, then tile 0 with the attention sink) run the synchronized update; then phi_row freezes at the
// running max and every later tile uses p = 2^(x - phi_row) with no max and no rescale. Why: the prefill kernel
// keeps P in fp16 for the tensor cores, whose range (e^-9.7 .. e^11) cannot hold real rows around one calibrated
// phi (smollm2's row maxima spread over 15-20 nats per layer), while a row's max beyond its anchor by more than
// 11 is rare (none in 553K held-out rows). The guard catches it: a later score above phi_row + 11 -> fallback.
#pragma once

#include "kernels/attention/attention_mma.cuh"

namespace fdpp {
namespace attn {

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_min(float v) {
  v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fminf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// kTf32P: p is rounded to tf32 (the precision the decode kernel's P.V mma uses) before it is summed into l, so
// numerator and denominator see the same p (a row with one visible key then returns its v exactly).
__device__ __forceinline__ float round_p(float p, bool tf32) { return tf32 ? __uint_as_float(to_tf32(p)) : p; }

template <int kRows, bool kTf32P = false>
struct UnifiedMaxSoftmax {
  static constexpr bool kRescales = false;
  float l[kRows];      // sum of p over the keys this thread has seen, per row (quad-summed in finish())
  float x_max[kRows];  // largest visible x - phi' seen (-inf while none): above the window -> overflow risk
  float x_min[kRows];  // smallest visible x - phi' seen (+inf while none): below the window with a low row max
                       // -> fallback too (kLowGuardTail)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = 0.f, x_max[r] = -kInf, x_min[r] = kInf;
  }
  // Start of a tile: nothing to do; `tile_max` is unused and alpha is 1 (no rescale).
  __device__ __forceinline__ float begin_tile(int, float) { return 1.f; }
  // x -> p for one score. kMasked: x may be -inf (a masked key), which must not count as a visible minimum.
  template <bool kMasked>
  __device__ __forceinline__ float exp(int r, float x) {
    x_max[r] = fmaxf(x_max[r], x);
    x_min[r] = fminf(x_min[r], kMasked && x == -kInf ? kInf : x);
    const float p = round_p(fast_exp2(x), kTf32P);
    l[r] += p;
    return p;
  }
  // After the last tile: make l, x_max and x_min the whole quad's (all 4 lanes of a row agree).
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = quad_sum(l[r]), x_max[r] = quad_max(x_max[r]), x_min[r] = quad_min(x_min[r]);
  }
  // Guard bits of row r for the window [lo, hi] (log2 units); max_floor: see kGuardLowMax.
  __device__ __forceinline__ uint32_t guard_bits(int r, float lo, float hi, float max_floor) const {
    uint32_t bits = 0;
    if (x_max[r] > hi) bits |= kGuardAbove;
    if (x_min[r] < lo && x_max[r] < lo + kLowGuardTail * kLog2e) bits |= kGuardBelow;
    if (x_max[r] < max_floor && x_max[r] > -kInf) bits |= kGuardLowMax;
    return bits;
  }
  // Weight of a partial with recorded stat when merging: partials of the unified max simply add.
  static __device__ __forceinline__ float merge_weight(float, float) { return 1.f; }
};

template <int kRows, bool kTf32P = false>
struct SynchronizedSoftmax {
  static constexpr bool kRescales = true;
  float l[kRows];      // sum of 2^(x - m) over the keys this thread has seen, relative to the current m
  float m[kRows];      // running max of x over the keys the quad has seen (-inf while none)
  float m_sub[kRows];  // what exp() subtracts: m, or 0 while m is -inf (so that -inf - -inf never makes a NaN)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = 0.f, m[r] = -kInf, m_sub[r] = 0.f;
  }
  // Start of a tile with this thread's max of row r's scores in the tile: the quad agrees on the new max, and the
  // returned alpha = 2^(m_old - m_new) rescales everything accumulated so far (the caller rescales the output).
  __device__ __forceinline__ float begin_tile(int r, float tile_max) {
    const float m_new = fmaxf(m[r], quad_max(tile_max));
    const float sub = m_new == -kInf ? 0.f : m_new;
    const float alpha = fast_exp2(m[r] - sub);  // m_old = -inf -> 0: nothing accumulated yet
    m[r] = m_new;
    m_sub[r] = sub;
    l[r] *= alpha;
    return alpha;
  }
  template <bool kMasked>
  __device__ __forceinline__ float exp(int r, float x) {
    const float p = round_p(fast_exp2(x - m_sub[r]), kTf32P);
    l[r] += p;
    return p;
  }
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = quad_sum(l[r]);
  }
  __device__ __forceinline__ uint32_t guard_bits(int, float, float, float) const { return 0; }
  // Weight of a partial recorded with running max m_i when the merged max is M.
  static __device__ __forceinline__ float merge_weight(float m_i, float M) {
    return M == -kInf ? 0.f : fast_exp2(m_i - M);
  }
};

// See the header comment. kRows rows per thread; x arrives unshifted (x = s * log2(e)).
template <int kRows>
struct AnchoredUnifiedSoftmax {
  static constexpr bool kRescales = true;  // while anchoring

  float l[kRows];       // sum of 2^(x - m_sub) over this thread's keys
  float m[kRows];       // running max while anchoring (quad-wide), then frozen
  float m_sub[kRows];   // what exp() subtracts: the running max (0 while -inf), after the freeze phi_row
  float x_max[kRows];   // after the freeze: largest visible x - phi_row (the guard's overflow check)
  uint32_t unanchored;  // bit r: row r saw no visible key before the freeze (only possible in mask_mode bias)
  bool frozen;

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = 0.f, m[r] = -kInf, m_sub[r] = 0.f, x_max[r] = -kInf;
    unanchored = 0;
    frozen = false;
  }
  __device__ __forceinline__ float begin_tile(int r, float tile_max) {
    const float m_new = fmaxf(m[r], quad_max(tile_max));
    const float sub = m_new == -kInf ? 0.f : m_new;
    const float alpha = fast_exp2(m[r] - sub);
    m[r] = m_new;
    m_sub[r] = sub;
    l[r] *= alpha;
    return alpha;
  }
  // From now on phi_row = the running max.
  __device__ __forceinline__ void freeze() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (m[r] == -kInf) unanchored |= 1u << r;
    }
    frozen = true;
  }
  // While anchoring: x is the scaled score; after the freeze the caller passes x - phi_row already (one FFMA).
  template <bool kMasked>
  __device__ __forceinline__ float exp(int r, float x) {
    const float xs = frozen ? x : x - m_sub[r];
    if (frozen) x_max[r] = fmaxf(x_max[r], xs);
    const float p = fast_exp2(xs);
    l[r] += p;
    return p;
  }
  // The two phases of exp() for a caller that knows which one it is in (no per-score test of `frozen`).
  __device__ __forceinline__ float exp_anchoring(int r, float x) {
    const float p = fast_exp2(x - m_sub[r]);
    l[r] += p;
    return p;
  }
  __device__ __forceinline__ float exp_frozen(int r, float xs) {
    x_max[r] = fmaxf(x_max[r], xs);
    const float p = fast_exp2(xs);
    l[r] += p;
    return p;
  }
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) l[r] = quad_sum(l[r]), x_max[r] = quad_max(x_max[r]);
  }
  // An anchored row has p = 1 at its anchor, so only overflow can hurt it (elements far below it underflow no
  // sooner than in the synchronized softmax, whose max is at least phi_row). A row without an anchor that sees
  // keys later takes the exact path.
  __device__ __forceinline__ uint32_t guard_bits(int r, float, float hi, float) const {
    uint32_t bits = 0;
    if (x_max[r] > hi) bits |= kGuardAbove;
    if (((unanchored >> r) & 1u) && x_max[r] > -kInf) bits |= kGuardLowMax;
    return bits;
  }
};

}  // namespace attn
}  // namespace fdpp
