// fdpp::AsyncSoftmaxAttention: the plain parameter structs and launchers the C ABI and the TensorRT adapter call.
//
// out[b, h, i, :] = softmax_j(scale * q[b, h, i, :] . k[b, h / G, j, :] (+ bias)) v[b, h / G, j, :],  G = Hq / Hkv
//
// Kernels (chosen by choose_kernel(), or forced for tests and benchmarks):
//   decode   split-KV (FlashDecoding): grid (split, kv head x row block, batch); each CTA reads its KV head's keys
//            once for all G * seq query rows of that head; the splits' partials of a row are then added in a
//            thread block cluster, by the last split CTA to finish, or by a combine kernel (DecodeCombine).
//   prefill  FlashAttention-2 style causal tiles on tensor cores (128 query rows x 64 keys per step).
// Scores may be soft-capped (softcap) and windowed (window): every kernel applies both, and skips key tiles wholly
// before a row block's window.
//   rowwise  one CTA per query row, float32 arithmetic, the synchronized online-max softmax: float32 inputs, and
//            the exact recompute that the guard falls back to.
// softmax: kUnified is FlashDecoding++'s asynchronized softmax (e^(s - phi) with one fixed phi; a guard sends rows
// outside the safe window to the synchronized recompute); kSynchronized is the online-max softmax of
// FlashAttention/FlashDecoding, the baseline the unified max is measured against.
//
// No header here includes TensorRT, torch or Python. Launchers never synchronize or allocate: everything they
// need beyond the inputs is the caller's workspace, sized by attention_workspace_bytes().
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <string>

#include "fdpp_contract_constants.h"

namespace fdpp {

enum class AttnDtype : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };
enum class MaskMode : int { kPastLen = 0, kBias = 1, kNone = 2 };
enum class SoftmaxMode : int { kUnified = 0, kSynchronized = 1 };
enum class AttnKernel : int { kAuto = 0, kDecode = 1, kPrefill = 2, kRowwise = 3 };
// How the decode splits of a row are combined: the plan's choice, the combine kernel (through the workspace), inside
// a thread block cluster of the splits (sm_90, 2 to 8 splits; decode_split_kernel), or by the last split CTA of a
// row block to finish (through the workspace; needs AttentionParams::combine_counters).
enum class DecodeCombine : int { kAuto = 0, kKernel = 1, kCluster = 2, kLastBlock = 3 };

// Guard flag bits a decode split writes per row (unified softmax only).
constexpr uint32_t kGuardAbove = 1u;   // a visible s - phi above guard_hi: e^(s - phi) could overflow
constexpr uint32_t kGuardBelow = 2u;   // a visible s - phi below guard_lo, the row max below guard_lo + kLowGuardTail
constexpr uint32_t kGuardLowMax = 4u;  // (prefill fp16) the row max is below the fp16 precision floor
constexpr uint32_t kGuardAny = kGuardAbove | kGuardBelow | kGuardLowMax;  // any of them: the row is recomputed

// Numeric windows for s - phi (natural-log units), from the contract (plugins/AsyncSoftmaxAttentionPlugin/
// contract.json). The guard bounds given by the caller are intersected with the window of the arithmetic that
// stores e^(s - phi):
//  - decode keeps p = e^(s - phi) in float32 (tf32 for the P.V tensor-core product: fp32's exponent range, fp16's
//    precision): the contract's whole guard range is safe. Its ends: e^-80 is a normal float, and 2^20 keys x
//    e^60 x 65504 < FLT_MAX.
//  - prefill stores P in the input type for the tensor cores. bfloat16 has float32's range: same window. float16
//    tops out at 65504 = e^11.09, so guard_hi is capped at 11; and its normal range ends at e^-9.7, so a row whose
//    largest s - phi is below -2 would lose the precision of its tail: it falls back too (kGuardLowMax).
//    Example: guard_hi 10 stays 10 in every kernel; guard_hi 30 is 30 in decode and bf16 prefill, 11 in fp16.
constexpr float kWindowLo = contract::kAttentionGuardLoMin;
constexpr float kWindowHi = contract::kAttentionGuardHiMax;
constexpr float kFp16PrefillHi = contract::kAttentionFp16PrefillGuardHi;
// The low side flags a row only if its largest s - phi is also below guard_lo + kLowGuardTail (nats): otherwise
// every term e^(s - phi) lost to underflow is below e^-32 of the row's largest (the contract's low_guard_tail_doc).
constexpr float kLowGuardTail = contract::kAttentionLowGuardTail;
constexpr float kFp16PrefillMaxFloor = contract::kAttentionFp16PrefillMaxFloor;

// Positions whose additive bias is at or below this are masked (the contract's bias_mask_threshold).
constexpr float kBiasMaskThreshold = contract::kAttentionBiasMaskThreshold;

// Whether the kernels take this head_dim (the contract's head_dim choices: 64, 80, 96, 128 and 256).
constexpr bool head_dim_supported(int head_dim) {
  for (int d : contract::kAttentionHeadDims)
    if (d == head_dim) return true;
  return false;
}

// The instantiation a head_dim runs in: 64, 128 and 256 their own; 80 and 96 inside the 128 kernels. There the
// dimensions past head_dim are zero-filled in shared memory (never read from global memory), so they add exactly 0
// to every q.k and produce output dimensions that are never written: the same result as a d80/d96 kernel, and the
// same DRAM traffic (what decode is bound by); prefill pays 128/80 or 128/96 of the tensor-core work
// (docs/notes-attention.md, "Head sizes"). Example: 96 -> 128; 256 -> 256. 0 where no kernel takes it.
constexpr int kernel_head_dim(int head_dim) {
  if (!head_dim_supported(head_dim)) return 0;
  if (head_dim == 64 || head_dim == 256) return head_dim;
  return head_dim <= 128 && head_dim % 16 == 0 ? 128 : 0;
}

// Keys per block of a paged KV cache (the contract's kv_block_size): what every kernel's address rule divides by.
constexpr int kKvBlockSize = contract::kAttentionKvBlockSize;

struct AttentionParams {
  AttnDtype dtype = AttnDtype::kFloat16;
  int batch = 0, num_heads = 0, num_kv_heads = 0, seq = 0, head_dim = 0;
  int kv_capacity = 0;  // L: the key/value tensors' length dimension (the cache size)
  int max_kv_len = 0;   // host-side bound on every row's kv length (<= kv_capacity); sizes the split grid
  MaskMode mask_mode = MaskMode::kPastLen;
  SoftmaxMode softmax = SoftmaxMode::kUnified;
  AttnKernel kernel = AttnKernel::kAuto;
  int num_splits = 0;  // decode: 0 = decode_num_splits() heuristic
  // kAuto: the cluster where it can run (cluster_combine_ok), else the last-block combine when combine_counters is
  // given, else the combine kernel.
  DecodeCombine decode_combine = DecodeCombine::kAuto;
  int prefill_config = 0;  // prefill tile shape: 0 = the plan (attention_forward), else 1, 2, 4 or 5 (the C ABI's)
  float scale = 1.0f, phi = contract::kAttentionPhiDefault;
  float guard_lo = contract::kAttentionGuardLoDefault, guard_hi = contract::kAttentionGuardHiDefault;
  // Logit soft-capping: s = softcap * tanh(s / softcap) after the scale, before the mask (Gemma 2); 0 = none.
  float softcap = contract::kAttentionSoftcapDefault;
  // Sliding window (mask_mode kPastLen): key j visible to query i only if (past_len + i) - j < window; 0 = none.
  int window = contract::kAttentionWindowDefault;
  // Programmatic dependent launch of the decode kernels where the GPU runs the sm_90a code: the split grid becomes
  // resident and prefetches its first K/V tiles while the kernel before it finishes (it waits before reading q),
  // and the combine grid is resident before the split grid ends. Off only for a timing baseline, or where K/V are
  // written by a kernel that may still run when attention starts.
  bool pdl = true;

  // Strides in elements; the last dimension (head_dim, or keys for bias) is contiguous. One tensor per line:
  // clang-format off
  const void* q = nullptr;   int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  const void* k = nullptr;   int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  const void* v = nullptr;   int64_t v_sb = 0, v_sh = 0, v_ss = 0;
  void* out = nullptr;       int64_t o_sb = 0, o_sh = 0, o_ss = 0;
  const int64_t* past_len = nullptr;  // [batch], kPastLen: key j visible to query i iff j <= past_len[b] + i
  const void* bias = nullptr; int64_t bias_sb = 0, bias_ss = 0, bias_sl = 1;  // kBias, 0-strides broadcast
  // clang-format on

  // Paged KV cache (mask_mode kPastLen only): k and v point at the pools [blocks, Hkv, kv_block_size, D], and key j
  // of sequence b is row j % kv_block_size of block block_table[b * block_table_stride + j / kv_block_size]
  // (k_sb: the stride between blocks, k_sh: between heads, k_ss: between rows of a block); kv_capacity is
  // W * kv_block_size for a table of W columns. Null table: contiguous caches [B, Hkv, kv_capacity, D].
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;  // elements between table rows (>= W)
  int kv_block_size = 0;           // must equal kKvBlockSize with a table

  // Diagnostics: device counters [0] rows that took the fallback, [1] rows whose kv length exceeded the cache
  // (clamped). Null: the library's own counters (attention_default_counters()).
  unsigned long long* counters = nullptr;
  // The last-block combine's arrival counts, one per (batch, KV head, row block): attention_combine_counters()
  // entries, zero before the first call; every call leaves them zero again, so one buffer serves any sequence of
  // calls on one stream. Null: the decode combines in a cluster or with the combine kernel.
  uint32_t* combine_counters = nullptr;
};

// RoPE on q and the new k, then the new k and v appended to the cache at position past_len[b] + s.
struct RopeAppendParams {
  AttnDtype dtype = AttnDtype::kFloat16;
  int batch = 0, num_heads = 0, num_kv_heads = 0, seq = 0, head_dim = 0, kv_capacity = 0;
  float rope_theta = 10000.0f;
  int rope_interleaved = 0;  // 0: rotate halves (Llama/NeoX: pairs i, i + D/2); 1: adjacent pairs (GPT-J: 2i, 2i+1)
  // One tensor (pointer and strides) per line:
  // clang-format off
  const void* q_in = nullptr;  void* q_out = nullptr;  int64_t q_sb = 0, q_sh = 0, q_ss = 0;   // may alias
  const void* k_new = nullptr; int64_t kn_sb = 0, kn_sh = 0, kn_ss = 0;
  const void* v_new = nullptr; int64_t vn_sb = 0, vn_sh = 0, vn_ss = 0;
  void* k_cache = nullptr;     int64_t kc_sb = 0, kc_sh = 0, kc_ss = 0;
  void* v_cache = nullptr;     int64_t vc_sb = 0, vc_sh = 0, vc_ss = 0;
  // clang-format on
  const int64_t* past_len = nullptr;
  unsigned long long* counters = nullptr;  // [1] counts tokens dropped because their position is past the cache
  int rope_dim = 0;                        // rotated channels per head (even, <= head_dim); 0: append only
  const float* inv_freq = nullptr;  // [rope_dim / 2] angle per position of each pair; nullptr: theta^(-2i/rope_dim)
  // Paged caches, as in AttentionParams: position pos of sequence b goes to row pos % kv_block_size of block
  // block_table[b * block_table_stride + pos / kv_block_size]; kc_sb / vc_sb are the strides between blocks and
  // kv_capacity = W * kv_block_size (positions past it are dropped and counted).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int kv_block_size = 0;
};

// Whether prefill tile shape `config` (1, 2, 4; attention_prefill_impl.cuh; 5, attention_prefill_sm90_tma.cuh) is
// built for these parameters: head_dim 256 has the 64-row shape 2 only; shape 1 (128 rows, at 255 registers) is
// compiled without soft-capping, the sliding window and the zero-filled head dims 80 and 96 (their code made it
// spill), which shapes 2 and 4 have. Shape 5 (forced only) runs 64 and 128 alone: at 80 and 96 the H200 gave
// non-finite and wrong rows from NaN-padded caches (docs/notes-attention.md, "Open").
// Example: head_dim 96, config 1 -> false; head_dim 128 with softcap 50, config 2 -> true.
inline bool prefill_shape_takes(const AttentionParams& p, int config) {
  if (kernel_head_dim(p.head_dim) == 256) return config == 2;
  const bool padded = p.head_dim != kernel_head_dim(p.head_dim);  // 80, 96: zero-filled inside the 128 kernels
  if (config == 1) return p.softcap == 0.f && p.window == 0 && !padded;
  if (config == 5) return !padded;
  return true;
}

// --- argument checks (attention_check.cpp): what the C ABI and the TensorRT adapter both run first ----------------

enum class ParamsError : int { kNone = 0, kInvalid = 1, kUnsupported = 2 };
struct ParamsCheck {
  ParamsError error = ParamsError::kNone;
  std::string message;  // one line naming the parameter and what to do
  explicit operator bool() const { return error != ParamsError::kNone; }
};

// Whether attention_forward can run p: shapes, modes, the guard window and (with_tensors) the pointers, strides
// and alignment; without tensors, what a TensorRT build phase knows. Example: head_dim 48 -> kUnsupported,
// "head_dim 48 is not supported; the kernels are built for head_dim 64, 80, 96, 128 and 256".
ParamsCheck check_attention_params(const AttentionParams& p, bool with_tensors);
ParamsCheck check_rope_append_params(const RopeAppendParams& p);

// --- host-side planning (pure functions; see attention_heuristics.h) -------------------------------------------

// The kernel the dispatcher runs for these parameters (never kAuto).
AttnKernel choose_kernel(const AttentionParams& p);

// Bytes of workspace attention_forward needs (0 when the chosen kernel needs none). Queries the current device's
// SM count and occupancy (host calls, cached per device): call it before CUDA-graph capture.
size_t attention_workspace_bytes(const AttentionParams& p);

// Entries of AttentionParams::combine_counters a call needs: batch x num_kv_heads x row blocks of 16 query rows
// (ceil(num_heads / num_kv_heads x seq / 16)) when it runs the decode kernel, else 0. Shapes only, no device query.
size_t attention_combine_counters(const AttentionParams& p);

// The largest attention_workspace_bytes() over every batch <= p.batch and seq <= p.seq (the other fields as given):
// what an engine reserves once for a range of shapes.
size_t attention_workspace_bound(const AttentionParams& p);

// Runs the attention. Expects validated parameters (the C ABI validates). Never synchronizes.
cudaError_t attention_forward(const AttentionParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);

cudaError_t rope_append(const RopeAppendParams& p, cudaStream_t stream);

// The library's own diagnostic counters on the current device (a device pointer to 2 values).
cudaError_t attention_default_counters(unsigned long long** device_ptr);

// Split count the decode kernel uses for these shapes on the current device.
int decode_splits_for(const AttentionParams& p);

// Whether the decode splits of these shapes combine inside a thread block cluster on the current device (the plan,
// or what decode_combine forces; -1 where the device query failed).
int decode_uses_cluster(const AttentionParams& p);

}  // namespace fdpp
