// The portable decode attention (portable.h): split-KV over blocks of one query row, the unified max with its
// guard and exact fallback, in plain float32 arithmetic that compiles for NVIDIA (nvcc) and AMD (hipcc).
//
// A block (kBlockWarps warps) takes query row (b, hq, s) and one split of its keys. A key is handled by a group of
// head_dim / 8 lanes, each loading 16 bytes of the key row and holding the matching 8 query dims in registers;
// the group sums its dot product with shuffles, then each lane adds p * v for its 8 dims. D = 128: 16 lanes a key,
// 2 keys per step of a 32-lane warp, 4 of a 64-lane wavefront.
// Softmax state per lane (State): unified -- x = s * log2(e) - phi * log2(e), p = 2^x, partials simply add, the
// visible x range is recorded for the guard; synchronized -- the online max m with rescaling. Both merge with one
// rule (weights 2^(m_i - M); the unified m is the constant 0, so its weights are exactly 1).
// One split: the split block writes the row. Several: each writes a partial (acc, m, l, guard bits) to the
// workspace and a combine block per row adds them. A unified row with any guard bit is recomputed exactly by that
// block, synchronized, over all its keys: an overflowing 2^x never reaches the output.
#include "kernels/portable/portable.h"
#include "kernels/portable/portable_heuristics.h"

namespace fdpp {
namespace portable {
namespace {

using port::kInf;
using port::kLog2e;
using port::kWarpSize;
constexpr int kThreads = kBlockWarps * kWarpSize;
constexpr int kVec = 8;  // elements of a key / value row per lane (one 16-byte load of a 2-byte type)
constexpr int kMaxDim = 128;
constexpr uint32_t kGuardAbove = 1u, kGuardBelow = 2u;  // as the NVIDIA decode's (attention_params.h)

// AttentionParams in kernel form (log2 units, the split layout, the workspace pointers).
struct DecodeArgs {
  int num_heads, group, seq, kv_capacity, num_splits, chunk;
  MaskMode mask_mode;
  float scale_log2, phi_log2, lo_log2, hi_log2;
  // clang-format off
  const void* q;   int64_t q_sb, q_sh, q_ss;
  const void* k;   int64_t k_sb, k_sh, k_ss;
  const void* v;   int64_t v_sb, v_sh, v_ss;
  void* out;       int64_t o_sb, o_sh, o_ss;
  const int64_t* past_len;
  const void* bias; int64_t bias_sb, bias_ss, bias_sl;
  // clang-format on
  float* ws_acc;                 // [rows][splits][D]
  float* ws_ml;                  // [rows][splits][2]: m, l
  uint32_t* ws_flag;             // [rows][splits]: guard bits
  unsigned long long* counters;  // [0] fallback rows, [1] clamped rows; may be null
};

// The contract's key ranges (the same rules as the NVIDIA kernels' kv_len_of / visible_end): in mode past_len,
// sequence b has past_len[b] + seq keys (clamped to the cache, which is counted) and query token s sees keys
// [0, past_len[b] + s]; the other modes see the whole cache.
__device__ __forceinline__ int kv_len_of(const DecodeArgs& a, int b, bool* clamped) {
  *clamped = false;
  if (a.mask_mode != MaskMode::kPastLen) return a.kv_capacity;
  const long long past = a.past_len[b];
  long long len = past + a.seq;
  *clamped = past < 0 || len > a.kv_capacity;
  if (len > a.kv_capacity) len = a.kv_capacity;
  return len < 0 ? 0 : static_cast<int>(len);
}
__device__ __forceinline__ int visible_end(const DecodeArgs& a, int b, int s, int kv_len) {
  if (a.mask_mode != MaskMode::kPastLen) return kv_len;
  const long long end = a.past_len[b] + s + 1;
  return end < kv_len ? (end < 0 ? 0 : static_cast<int>(end)) : kv_len;
}

struct State {
  float m, l;  // unified: m = 0 (p relative to phi); synchronized: the running max (-inf while no key)
  float acc[kVec];
  float x_max, x_min;  // visible x range (the unified guard)
};

template <bool kUnified>
__device__ __forceinline__ void init(State& st) {
  st.m = kUnified ? 0.f : -kInf;
  st.l = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) st.acc[i] = 0.f;
  st.x_max = -kInf, st.x_min = kInf;
}

template <bool kUnified>
__device__ __forceinline__ void add_key(State& st, float x, const float (&v)[kVec]) {
  st.x_max = fmaxf(st.x_max, x);
  st.x_min = fminf(st.x_min, x);
  float alpha = 1.f, p;
  if (kUnified) {
    p = exp2f(x);
  } else {
    const float m_new = fmaxf(st.m, x);
    alpha = exp2f(st.m - m_new);  // m = -inf: 0, nothing accumulated yet
    p = exp2f(x - m_new);
    st.m = m_new;
  }
  st.l = fmaf(st.l, alpha, p);
#pragma unroll
  for (int i = 0; i < kVec; ++i) st.acc[i] = fmaf(st.acc[i], alpha, p * v[i]);
}

// st += (m, l, acc): weights 2^(m_i - M); two empty synchronized partials (M = -inf) stay empty.
__device__ __forceinline__ void merge(State& st, float m, float l, const float (&acc)[kVec], float x_max, float x_min) {
  st.x_max = fmaxf(st.x_max, x_max);
  st.x_min = fminf(st.x_min, x_min);
  const float big = fmaxf(st.m, m);
  if (big == -kInf) return;
  const float w_self = exp2f(st.m - big), w_other = exp2f(m - big);
  st.l = st.l * w_self + l * w_other;
#pragma unroll
  for (int i = 0; i < kVec; ++i) st.acc[i] = st.acc[i] * w_self + acc[i] * w_other;
  st.m = big;
}

__device__ __forceinline__ void merge_from_lane(State& st, int lane_mask) {
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = port::shfl_xor(st.acc[i], lane_mask);
  const float m = port::shfl_xor(st.m, lane_mask), l = port::shfl_xor(st.l, lane_mask);
  const float x_max = port::shfl_xor(st.x_max, lane_mask), x_min = port::shfl_xor(st.x_min, lane_mask);
  merge(st, m, l, acc, x_max, x_min);
}

struct Shared {
  float acc[kBlockWarps][kMaxDim];
  float m[kBlockWarps], l[kBlockWarps], x_max[kBlockWarps], x_min[kBlockWarps];
};

// A block's result for one row: the same m, l and x range in every thread; acc of dim threadIdx.x (0 past D).
struct RowResult {
  float m, l, acc, x_max, x_min;
};

// Keys [j_begin, j_end) of row (b, hq, s), reduced over the block. All threads of the block must call it.
template <typename E, int D, bool kUnified>
__device__ RowResult row_range(const DecodeArgs& a, int b, int hq, int s, int j_begin, int j_end, Shared& sh) {
  using S = typename E::Storage;
  constexpr int kLanes = D / kVec;  // lanes per key
  constexpr int kGroupsPerWarp = kWarpSize / kLanes;
  constexpr int kGroups = kBlockWarps * kGroupsPerWarp;
  static_assert(kGroupsPerWarp >= 1 && D <= kMaxDim && D <= kThreads, "head_dim must fit a warp and a block");
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int sub = lane % kLanes, group = warp * kGroupsPerWarp + lane / kLanes;
  const int hkv = hq / a.group;

  float q[kVec];
  port::load8<E>(static_cast<const S*>(a.q) + b * a.q_sb + hq * a.q_sh + s * a.q_ss + sub * kVec, q);
#pragma unroll
  for (int i = 0; i < kVec; ++i) q[i] *= a.scale_log2;
  const S* k_row = static_cast<const S*>(a.k) + b * a.k_sb + hkv * a.k_sh + sub * kVec;
  const S* v_row = static_cast<const S*>(a.v) + b * a.v_sb + hkv * a.v_sh + sub * kVec;
  const S* bias_row = static_cast<const S*>(a.bias) + b * a.bias_sb + s * a.bias_ss;
  const float shift = kUnified ? a.phi_log2 : 0.f;

  State st;
  init<kUnified>(st);
  for (int j0 = j_begin; j0 < j_end; j0 += kGroups) {  // the same trip count in every lane: shuffles stay full
    const int j = j0 + group;
    const bool in_range = j < j_end;
    float dot = 0.f;
    if (in_range) {
      float kf[kVec];
      port::load8<E>(k_row + j * a.k_ss, kf);
#pragma unroll
      for (int i = 0; i < kVec; ++i) dot = fmaf(q[i], kf[i], dot);
    }
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) dot += port::shfl_xor(dot, o);
    if (!in_range) continue;
    float x = dot;
    if (a.mask_mode == MaskMode::kBias) {
      const float bias = E::to_float(bias_row[j * a.bias_sl]);
      if (!(bias > kBiasMaskThreshold)) continue;
      x = fmaf(bias, kLog2e, x);
    }
    float vf[kVec];
    port::load8<E>(v_row + j * a.v_ss, vf);
    add_key<kUnified>(st, x - shift, vf);
  }

#pragma unroll
  for (int o = kLanes; o < kWarpSize; o <<= 1) merge_from_lane(st, o);
  if (lane < kLanes) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) sh.acc[warp][sub * kVec + i] = st.acc[i];
  }
  if (lane == 0) sh.m[warp] = st.m, sh.l[warp] = st.l, sh.x_max[warp] = st.x_max, sh.x_min[warp] = st.x_min;
  __syncthreads();
  RowResult r{-kInf, 0.f, 0.f, -kInf, kInf};
#pragma unroll
  for (int w = 0; w < kBlockWarps; ++w) {
    r.m = fmaxf(r.m, sh.m[w]);
    r.x_max = fmaxf(r.x_max, sh.x_max[w]);
    r.x_min = fminf(r.x_min, sh.x_min[w]);
  }
  if (r.m > -kInf) {
    const int d = threadIdx.x < D ? threadIdx.x : 0;
#pragma unroll
    for (int w = 0; w < kBlockWarps; ++w) {
      const float weight = exp2f(sh.m[w] - r.m);
      r.l = fmaf(weight, sh.l[w], r.l);
      r.acc = fmaf(weight, sh.acc[w][d], r.acc);
    }
  }
  __syncthreads();  // sh may be reused by the caller
  return r;
}

template <bool kUnified>
__device__ __forceinline__ uint32_t guard_bits(const DecodeArgs& a, const RowResult& r) {
  if (!kUnified) return 0;
  const bool below = r.x_min < a.lo_log2 && r.x_max < a.lo_log2 + kLowGuardTail * port::kLog2e;  // attention_params.h
  return (r.x_max > a.hi_log2 ? kGuardAbove : 0u) | (below ? kGuardBelow : 0u);
}

// Writes row (b, hq, s) from r, or, for a unified row with guard bits, from its exact recompute.
template <typename E, int D, bool kUnified>
__device__ void finish_row(const DecodeArgs& a, int b, int hq, int s, int end, RowResult r, uint32_t guard,
                           Shared& sh) {
  if (kUnified && guard != 0) {  // the same in every thread of the block
    if (threadIdx.x == 0 && a.counters) atomicAdd(a.counters, 1ull);
    r = row_range<E, D, false>(a, b, hq, s, 0, end, sh);
  }
  if (threadIdx.x < D) {
    auto* out = static_cast<typename E::Storage*>(a.out) + b * a.o_sb + hq * a.o_sh + s * a.o_ss;
    out[threadIdx.x] = E::from_float(r.l > 0.f ? r.acc / r.l : 0.f);  // no visible key: 0
  }
}

struct RowIndex {
  int b, hq, s;
  __device__ explicit RowIndex(const DecodeArgs& a, int row) {
    s = row % a.seq;
    const int bh = row / a.seq;
    hq = bh % a.num_heads;
    b = bh / a.num_heads;
  }
};

template <typename E, int D, bool kUnified>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const DecodeArgs a) {
  __shared__ Shared sh;
  const int row = blockIdx.x, split = blockIdx.y;
  const RowIndex at(a, row);
  bool clamped = false;
  const int kv_len = kv_len_of(a, at.b, &clamped);
  if (clamped && split == 0 && threadIdx.x == 0 && a.counters) atomicAdd(a.counters + 1, 1ull);
  const int end = visible_end(a, at.b, at.s, kv_len);
  const int begin = split * a.chunk;
  // The last split takes every key left, so a row longer than the plan's bound is still read whole.
  const int stop = split == a.num_splits - 1 || begin + a.chunk > end ? end : begin + a.chunk;
  const RowResult r = row_range<E, D, kUnified>(a, at.b, at.hq, at.s, begin, stop, sh);
  if (a.num_splits == 1)
    return finish_row<E, D, kUnified>(a, at.b, at.hq, at.s, end, r, guard_bits<kUnified>(a, r), sh);
  const int64_t slot = int64_t(row) * a.num_splits + split;
  if (threadIdx.x < D) a.ws_acc[slot * D + threadIdx.x] = r.acc;
  if (threadIdx.x == 0) {
    a.ws_ml[2 * slot] = r.m;
    a.ws_ml[2 * slot + 1] = r.l;
    a.ws_flag[slot] = guard_bits<kUnified>(a, r);
  }
}

template <typename E, int D, bool kUnified>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeArgs a) {
  __shared__ Shared sh;
  const int row = blockIdx.x;
  const RowIndex at(a, row);
  bool clamped = false;
  const int end = visible_end(a, at.b, at.s, kv_len_of(a, at.b, &clamped));
  const int64_t base = int64_t(row) * a.num_splits;
  uint32_t guard = 0;
  RowResult r{-kInf, 0.f, 0.f, -kInf, kInf};
  for (int i = 0; i < a.num_splits; ++i) guard |= a.ws_flag[base + i], r.m = fmaxf(r.m, a.ws_ml[2 * (base + i)]);
  if (!(kUnified && guard != 0) && r.m > -kInf) {
    const int d = threadIdx.x < D ? threadIdx.x : 0;
    for (int i = 0; i < a.num_splits; ++i) {
      const float weight = exp2f(a.ws_ml[2 * (base + i)] - r.m);
      r.l = fmaf(weight, a.ws_ml[2 * (base + i) + 1], r.l);
      r.acc = fmaf(weight, a.ws_acc[(base + i) * D + d], r.acc);
    }
  }
  finish_row<E, D, kUnified>(a, at.b, at.hq, at.s, end, r, guard, sh);
}

template <typename E, int D, bool kUnified>
port::Error launch(const DecodeArgs& a, int rows, port::Stream stream) {
  decode_split_kernel<E, D, kUnified><<<dim3(rows, a.num_splits), kThreads, 0, stream>>>(a);
  port::Error err = port::last_launch_error();
  if (err != port::kSuccess || a.num_splits == 1) return err;
  decode_combine_kernel<E, D, kUnified><<<rows, kThreads, 0, stream>>>(a);
  return port::last_launch_error();
}

template <typename E>
port::Error launch_dtype(const DecodeArgs& a, int head_dim, bool unified, int rows, port::Stream stream) {
  if (head_dim == 128) return unified ? launch<E, 128, true>(a, rows, stream) : launch<E, 128, false>(a, rows, stream);
  if (head_dim == 64) return unified ? launch<E, 64, true>(a, rows, stream) : launch<E, 64, false>(a, rows, stream);
  return port::kInvalidValue;
}

int64_t rows_of(const AttentionParams& p) { return int64_t(p.batch) * p.num_heads * p.seq; }

// Keys the split plan covers: the bound on past_len + seq in mode past_len, the whole cache otherwise.
int planned_keys(const AttentionParams& p) { return p.mask_mode == MaskMode::kPastLen ? p.max_kv_len : p.kv_capacity; }

size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

struct WorkspaceLayout {
  size_t acc = 0, ml = 0, flag = 0, total = 0;  // byte offsets, and the size
};
WorkspaceLayout layout(const AttentionParams& p, int splits) {
  WorkspaceLayout w;
  if (splits <= 1) return w;
  const size_t slots = size_t(rows_of(p)) * splits;
  w.ml = align16(slots * p.head_dim * sizeof(float));
  w.flag = w.ml + align16(slots * 2 * sizeof(float));
  w.total = w.flag + align16(slots * sizeof(uint32_t));
  return w;
}

}  // namespace

port::Error attention_splits(const AttentionParams& p, int* splits) {
  if (p.num_splits > 0) {
    *splits = p.num_splits;
    return port::kSuccess;
  }
  int cus = 0;
  const port::Error err = port::multiprocessor_count(&cus);
  if (err == port::kSuccess) *splits = decode_num_splits(rows_of(p), planned_keys(p), cus);
  return err;
}

port::Error attention_workspace_bytes(const AttentionParams& p, size_t* bytes) {
  int splits = 1;
  const port::Error err = attention_splits(p, &splits);
  if (err == port::kSuccess) *bytes = layout(p, splits).total;
  return err;
}

port::Error attention_decode(const AttentionParams& p, void* workspace, size_t workspace_bytes, port::Stream stream) {
  const int64_t rows = rows_of(p);
  if (rows == 0) return port::kSuccess;
  int splits = 1;
  if (port::Error err = attention_splits(p, &splits)) return err;
  const WorkspaceLayout ws = layout(p, splits);
  if (workspace_bytes < ws.total || (ws.total > 0 && workspace == nullptr)) return port::kInvalidValue;
  DecodeArgs a{};
  a.num_heads = p.num_heads, a.group = p.num_heads / p.num_kv_heads, a.seq = p.seq, a.kv_capacity = p.kv_capacity;
  a.num_splits = splits;
  a.chunk = (planned_keys(p) + splits - 1) / splits;
  a.mask_mode = p.mask_mode;
  // p = 2^(x - phi') is kept in float32: the contract's whole guard window is safe (as in the NVIDIA decode).
  const float lo = p.guard_lo > kWindowLo ? p.guard_lo : kWindowLo;
  const float hi = p.guard_hi < kWindowHi ? p.guard_hi : kWindowHi;
  a.scale_log2 = p.scale * port::kLog2e, a.phi_log2 = p.phi * port::kLog2e;
  a.lo_log2 = lo * port::kLog2e, a.hi_log2 = hi * port::kLog2e;
  a.q = p.q, a.q_sb = p.q_sb, a.q_sh = p.q_sh, a.q_ss = p.q_ss;
  a.k = p.k, a.k_sb = p.k_sb, a.k_sh = p.k_sh, a.k_ss = p.k_ss;
  a.v = p.v, a.v_sb = p.v_sb, a.v_sh = p.v_sh, a.v_ss = p.v_ss;
  a.out = p.out, a.o_sb = p.o_sb, a.o_sh = p.o_sh, a.o_ss = p.o_ss;
  a.past_len = p.past_len;
  a.bias = p.bias, a.bias_sb = p.bias_sb, a.bias_ss = p.bias_ss, a.bias_sl = p.bias_sl;
  char* base = static_cast<char*>(workspace);
  a.ws_acc = reinterpret_cast<float*>(base + ws.acc);
  a.ws_ml = reinterpret_cast<float*>(base + ws.ml);
  a.ws_flag = reinterpret_cast<uint32_t*>(base + ws.flag);
  a.counters = p.counters;
  const bool unified = p.softmax == SoftmaxMode::kUnified;
  const int n = static_cast<int>(rows);
  switch (p.dtype) {
    case AttnDtype::kFloat16: return launch_dtype<port::F16>(a, p.head_dim, unified, n, stream);
    case AttnDtype::kBFloat16: return launch_dtype<port::BF16>(a, p.head_dim, unified, n, stream);
    case AttnDtype::kFloat32: return launch_dtype<port::F32>(a, p.head_dim, unified, n, stream);
  }
  return port::kInvalidValue;
}

}  // namespace portable
}  // namespace fdpp
