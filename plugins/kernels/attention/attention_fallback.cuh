// The exact path: one query row recomputed with the synchronized online-max softmax in float32 on CUDA cores.
// It is what the guard falls back to (decode combine, prefill epilogue) and the whole of the rowwise kernel.
//
// Per block of 32 keys a warp first gives each lane one key (lane-per-key dot products against the query in
// shared memory: no shuffle per key), takes the block max, rescales, then gives each lane D/32 output dims and
// walks the 32 keys with their p broadcast by shuffle (coalesced rows of v).
#pragma once

#include "kernels/attention/attention_common.cuh"

namespace fdpp {
namespace attn {

// Loads 8 consecutive elements of a row as floats (16 bytes for 2-byte types, 32 for float).
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = Elem<T>::to_float2(w[i]);
      f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
  } else {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}

template <typename T>
__device__ __forceinline__ float bias_log2(const AttnArgs& a, int b, int s, int j, bool& visible) {
  const T* bias = static_cast<const T*>(a.bias) + b * a.bias_sb + static_cast<int64_t>(s) * a.bias_ss +
                  static_cast<int64_t>(j) * a.bias_sl;
  const float v = Elem<T>::to_float(*bias);
  visible = v > kBiasMaskThreshold;
  return v * kLog2e;
}

struct OnlineRow {
  float m;  // running max of x (log2 units), warp-uniform; -inf while no visible key
  float l;  // this lane's share of sum 2^(x - m) (summed over the warp at the end)
};

// Accumulates keys [j_begin, j_end) of query row (b, hq, s) into (st, acc), of which keys below j_vis (a sliding
// window's start) are masked. q_s: the query row in shared memory times scale * log2(e), zero past the real head
// dimensions (real_dim). Lane owns dims [lane * D/32, lane * D/32 + D/32). kPaged: the keys are located through
// the block table once per 32 (j_begin is a multiple of 32 in both callers, and 32 keys never straddle a block);
// a template argument so that the contiguous code is the same as without paging (online_row_range below).
template <typename T, int D, bool kPaged>
__device__ void online_row_range(const AttnArgs& a, int b, int hq, int s, const float* q_s, int j_begin, int j_end,
                                 int j_vis, OnlineRow& st, float (&acc)[D / 32]) {
  static_assert(kKvBlockSize % 32 == 0, "32 keys never straddle a KV block");
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x & 31;
  const int dim = real_dim<D>(a);
  const bool lane_dims = lane * kPer < dim;  // this lane's output dims exist (dim is a multiple of kPer)
  const int hkv = hq / a.group;
  const T* k_base = k_row<T>(a, KvRow{b, 0}, hkv);  // contiguous: key j at k_base + j * k_ss
  const T* v_base = v_row<T>(a, KvRow{b, 0}, hkv) + lane * kPer;
  for (int jb = j_begin; jb < j_end; jb += 32) {
    const int j = jb + lane;
    if constexpr (kPaged) {  // keys jb + i at k_base + i * k_ss, v_base + i * v_ss
      const KvRow at = kv_locate(a, b, jb);
      k_base = k_row<T>(a, at, hkv) - static_cast<int64_t>(jb) * a.k_ss;
      v_base = v_row<T>(a, at, hkv) + lane * kPer - static_cast<int64_t>(jb) * a.v_ss;
    }
    float x = -kInf;
    if (j < j_end && j >= j_vis) {
      const T* krow = k_base + static_cast<int64_t>(j) * a.k_ss;
      float dot = 0.f;
#pragma unroll 4
      for (int d = 0; d < D; d += 8) {
        if (d >= dim) break;  // past the real head dims (q_s is zero there, but the row ends); a runtime bound spills
        float kf[8];
        load8(krow + d, kf);
        const float4 q0 = *reinterpret_cast<const float4*>(q_s + d);
        const float4 q1 = *reinterpret_cast<const float4*>(q_s + d + 4);
        dot = fmaf(q0.x, kf[0], dot), dot = fmaf(q0.y, kf[1], dot), dot = fmaf(q0.z, kf[2], dot);
        dot = fmaf(q0.w, kf[3], dot), dot = fmaf(q1.x, kf[4], dot), dot = fmaf(q1.y, kf[5], dot);
        dot = fmaf(q1.z, kf[6], dot), dot = fmaf(q1.w, kf[7], dot);
      }
      bool visible = true;
      if (a.softcap_log2 > 0.f) dot = softcap_x(a, dot);
      if (a.mask_mode == MaskMode::kBias) dot += bias_log2<T>(a, b, s, j, visible);
      x = visible ? dot : -kInf;
    }
    float block_max = x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, o));
    if (block_max == -kInf) continue;  // every key of the block masked
    const float m_new = fmaxf(st.m, block_max);
    const float alpha = fast_exp2(st.m - m_new);  // st.m = -inf -> 0
    const float p = fast_exp2(x - m_new);
    st.m = m_new;
    st.l = st.l * alpha + p;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= alpha;
    const int n = j_end - jb < 32 ? j_end - jb : 32;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      if (pj == 0.f || !lane_dims) continue;  // masked or negligible, or past the real dims: skip the row of v
      const T* vrow = v_base + static_cast<int64_t>(jb + jj) * a.v_ss;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] = fmaf(pj, Elem<T>::to_float(vrow[i]), acc[i]);
    }
  }
}

template <typename T, int D>
__device__ __forceinline__ void online_row_range(const AttnArgs& a, int b, int hq, int s, const float* q_s, int j_begin,
                                                 int j_end, int j_vis, OnlineRow& st, float (&acc)[D / 32]) {
  if (a.block_table != nullptr) {
    online_row_range<T, D, true>(a, b, hq, s, q_s, j_begin, j_end, j_vis, st, acc);
  } else {
    online_row_range<T, D, false>(a, b, hq, s, q_s, j_begin, j_end, j_vis, st, acc);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Loads query row (b, hq, s) into q_s (D floats) times scale * log2(e); `stride` threads from `first` take part.
template <typename T, int D>
__device__ __forceinline__ void load_query_scaled(const AttnArgs& a, int b, int hq, int s, float* q_s, int first,
                                                  int stride) {
  const T* q = row_ptr<T>(a.q, a.q_sb, a.q_sh, a.q_ss, b, hq, s);
  const int dim = real_dim<D>(a);
  for (int d = first; d < D; d += stride) q_s[d] = d < dim ? Elem<T>::to_float(q[d]) * a.scale_log2 : 0.f;
}

// The keys row (b, s) walks in the exact path: [first, end) with first its window's start rounded down to 32 (the
// paged lookup's granularity; online_row_range masks the keys before the window itself).
struct RowKeys {
  int first, vis, end;
};
__device__ __forceinline__ RowKeys row_keys(const AttnArgs& a, int b, int s, int kv_len) {
  const int vis = visible_begin(a, b, s, kv_len);
  return {vis / 32 * 32, vis, visible_end(a, b, s, kv_len)};
}

template <typename T, int D>
__device__ __forceinline__ void store_row_slice(const AttnArgs& a, int b, int hq, int s, int first, const float* vals,
                                                int n) {
  if (first >= real_dim<D>(a)) return;  // past the real dims (first and dim are multiples of n)
  T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(s) * a.o_ss + first;
  for (int i = 0; i < n; ++i) out[i] = Elem<T>::from_float(vals[i]);
}

// One warp recomputes and writes row (b, hq, s). q_s: D floats of shared memory private to this warp.
template <typename T, int D>
__device__ void recompute_row_warp(const AttnArgs& a, int b, int hq, int s, int kv_len, float* q_s) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x & 31;
  load_query_scaled<T, D>(a, b, hq, s, q_s, lane, 32);
  __syncwarp();
  OnlineRow st{-kInf, 0.f};
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  const RowKeys keys = row_keys(a, b, s, kv_len);
  online_row_range<T, D>(a, b, hq, s, q_s, keys.first, keys.end, keys.vis, st, acc);
  const float l = warp_sum(st.l);
  float vals[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) vals[i] = l > 0.f ? acc[i] / l : 0.f;
  store_row_slice<T, D>(a, b, hq, s, lane * kPer, vals, kPer);
  __syncwarp();
}

// Floats of scratch recompute_row_cta needs: the query row, then each warp's max, sum and D partial outputs.
template <int D>
constexpr int kRecomputeCtaFloats = D + 4 + 4 + 4 * D;

// A CTA of 4 warps recomputes and writes row (b, hq, s): each warp takes a quarter of the keys, then the four
// online states merge (the synchronized merge: rescale by the max). Must be called by all 128 threads. scratch:
// kRecomputeCtaFloats<D> floats of shared memory, 16-byte aligned, free until the call returns.
template <typename T, int D>
__device__ __forceinline__ void recompute_row_cta(const AttnArgs& a, int b, int hq, int s, int kv_len, float* scratch) {
  constexpr int kPer = D / 32;
  float* q_s = scratch;
  float* part_m = scratch + D;
  float* part_l = part_m + 4;
  float* part_acc = part_l + 4;  // [4][D]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  load_query_scaled<T, D>(a, b, hq, s, q_s, threadIdx.x, 128);
  __syncthreads();
  const RowKeys keys = row_keys(a, b, s, kv_len);
  const int span = keys.end > keys.first ? keys.end - keys.first : 0;
  const int quarter = ((span + 3) / 4 + 31) / 32 * 32;
  const int j0 = keys.first + warp * quarter;
  const int j1 = j0 + quarter < keys.end ? j0 + quarter : keys.end;
  OnlineRow st{-kInf, 0.f};
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  online_row_range<T, D>(a, b, hq, s, q_s, j0, j1, keys.vis, st, acc);
  const float l = warp_sum(st.l);
  if (lane == 0) part_m[warp] = st.m, part_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kPer; ++i) part_acc[warp * D + lane * kPer + i] = acc[i];
  __syncthreads();
  const float M = fmaxf(fmaxf(part_m[0], part_m[1]), fmaxf(part_m[2], part_m[3]));
  T* out = static_cast<T*>(a.out) + b * a.o_sb + hq * a.o_sh + static_cast<int64_t>(s) * a.o_ss;
  for (int d = threadIdx.x; d < real_dim<D>(a); d += 128) {
    float num = 0.f, den = 0.f;
    if (M > -kInf) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float wt = fast_exp2(part_m[w] - M);
        num = fmaf(wt, part_acc[w * D + d], num);
        den = fmaf(wt, part_l[w], den);
      }
    }
    out[d] = Elem<T>::from_float(den > 0.f ? num / den : 0.f);
  }
  __syncthreads();  // the scratch may be reused by the caller
}

// The same with its own static shared scratch (the combine and rowwise kernels, one row per CTA).
template <typename T, int D>
__device__ void recompute_row_cta(const AttnArgs& a, int b, int hq, int s, int kv_len) {
  __shared__ __align__(16) float scratch[kRecomputeCtaFloats<D>];
  recompute_row_cta<T, D>(a, b, hq, s, kv_len, scratch);
}

}  // namespace attn
}  // namespace fdpp
