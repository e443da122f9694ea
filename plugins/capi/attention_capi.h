// C ABI of fdpp::AsyncSoftmaxAttention (FlashDecoding++'s asynchronized softmax with a unified max) and its
// companion RoPE + KV-cache append. Conventions: plugins/capi/fdpp_capi.h. Semantics and attributes:
// plugins/AsyncSoftmaxAttentionPlugin/contract.json; kernels: plugins/kernels/attention/attention_params.h.
#pragma once

#include "capi/fdpp_capi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fdpp_mask_mode { FDPP_MASK_PAST_LEN = 0, FDPP_MASK_BIAS = 1, FDPP_MASK_NONE = 2 } fdpp_mask_mode;
typedef enum fdpp_softmax_mode { FDPP_SOFTMAX_UNIFIED = 0, FDPP_SOFTMAX_SYNCHRONIZED = 1 } fdpp_softmax_mode;
typedef enum fdpp_attention_kernel {
  FDPP_ATTN_AUTO = 0,     // decode (split-KV) for seq <= 8, prefill otherwise; rowwise for float32
  FDPP_ATTN_DECODE = 1,   // force the split-KV decode kernel (float16/bfloat16)
  FDPP_ATTN_PREFILL = 2,  // force the tensor-core prefill kernel (float16/bfloat16)
  FDPP_ATTN_ROWWISE = 3   // force the float32 row-per-CTA online-softmax kernel (exact; slow)
} fdpp_attention_kernel;
typedef enum fdpp_decode_combine {
  FDPP_COMBINE_AUTO = 0,       // the plan's choice: in a cluster where the GPU and split count allow it, else
                               // LAST_BLOCK where combine_counters is given, else KERNEL
  FDPP_COMBINE_KERNEL = 1,     // a second kernel adds the splits' partials from the workspace
  FDPP_COMBINE_CLUSTER = 2,    // the splits of a row block form a thread block cluster (sm_90, 2-8 splits)
  FDPP_COMBINE_LAST_BLOCK = 3  // the last split CTA of a row block to finish adds the partials from the workspace
                               // (one kernel per call; needs combine_counters)
} fdpp_decode_combine;

// query [B, Hq, S, D], key/value [B, Hkv, L, D] (L = kv_capacity, e.g. the cache size; or paged pools read through
// block_table, at the end of the struct), output [B, Hq, S, D];
// strides in elements (the last dimension contiguous). Device pointers 16-byte aligned, strides multiples of
// 16 bytes. head_dim: the contract's choices (64, 80, 96, 128, 256); dtype float16, bfloat16 (or float32: the rowwise
// kernel).
// A table, one tensor (pointer and strides) per line:
// clang-format off
typedef struct fdpp_attention_args {
  int32_t dtype;         // fdpp_dtype
  int32_t batch, num_heads, num_kv_heads, seq, head_dim;
  int32_t kv_capacity;   // L
  int32_t max_kv_len;    // host bound on every sequence's kv length, <= kv_capacity (0: kv_capacity)
  int32_t mask_mode;     // fdpp_mask_mode
  int32_t softmax_mode;  // fdpp_softmax_mode
  int32_t kernel;        // fdpp_attention_kernel
  int32_t num_splits;    // decode: 0 = the heuristic (fdpp_attention_decode_splits)
  float scale, phi, guard_lo, guard_hi;
  const void* query;  int64_t q_stride_b, q_stride_h, q_stride_s;
  const void* key;    int64_t k_stride_b, k_stride_h, k_stride_s;
  const void* value;  int64_t v_stride_b, v_stride_h, v_stride_s;
  void* output;       int64_t o_stride_b, o_stride_h, o_stride_s;
  const int64_t* past_len;  // [B] int64, mask_mode past_len: key j visible to query i iff j <= past_len[b] + i
  const void* bias;   int64_t bias_stride_b, bias_stride_s, bias_stride_l;  // mask_mode bias; 0 = broadcast
  unsigned long long* counters;  // device [2]: fallback rows, clamped rows (accumulated); NULL: the library's own
  int32_t prefill_config;  // prefill tile shape: 0 = the plan's choice (4 where the GPU and library have it, else
                           // 1 or 2 by prefill_tile_config), 1 = 128 query rows x 32-key steps, 2 = 64 query
                           // rows x 64-key steps, 4 = 128 rows on warpgroup MMAs (sm_90 with the library's 90a
                           // code; elsewhere FDPP_ERR_UNSUPPORTED), 5 = shape 4 with TMA K/V loads, a setmaxnreg
                           // producer warpgroup and ping-pong consumers (sm_90, 90a code; forced only, never
                           // planned yet); benchmarks and tests force one
  int32_t decode_combine;  // fdpp_decode_combine; CLUSTER where the plan cannot take it: FDPP_ERR_UNSUPPORTED
  int32_t pdl;             // fdpp_pdl for the decode kernels: AUTO (0) unless K/V are written by a kernel that may
                           // still run when attention starts
  uint32_t* combine_counters;  // device uint32 [fdpp_attention_combine_counters], zero before the first call; every
                               // call leaves it zero, so one buffer serves calls in order on one stream. NULL: no
                               // last-block combine (AUTO then takes the combine kernel where no cluster fits)
  // Paged KV cache (mask_mode past_len only): key and value are the pools [blocks, Hkv, kv_block_size, D] (stride_b
  // between blocks, stride_s between rows of a block), key j of sequence b is row j % kv_block_size of block
  // block_table[b * block_table_stride + j / kv_block_size], and kv_capacity = W x kv_block_size for W table
  // columns. NULL: contiguous caches (every field above as documented). Every table entry must name a block of the
  // pool at all times, also while the kernel before this one in the stream rewrites the table: the decode kernel
  // starts its first loads from ids read before that kernel completes (and re-issues them if an id changed).
  const int32_t* block_table;  // device int32 [batch][W] block ids (0: the pool's null block, for unused entries)
  int64_t block_table_stride;  // elements between table rows, >= W
  int32_t kv_block_size;       // with a table: the contract's kv_block_size (64)
  // Gemma 2 / Mistral attention (the contract's softcap and window):
  float softcap;   // > 0: s = softcap * tanh(s / softcap) after the scale, before the mask; 0: none
  int32_t window;  // > 0 (mask_mode past_len): key j visible to query i only if (past_len[b] + i) - j < window
} fdpp_attention_args;
// clang-format on

// sizeof(fdpp_attention_args) and sizeof(fdpp_rope_append_args), for bindings to check their mirror structs.
FDPP_API int fdpp_attention_args_size(void);
FDPP_API int fdpp_rope_append_args_size(void);

// Workspace the call needs (0 for prefill and rowwise). Call before CUDA-graph capture: it reads the device's SM
// count and occupancy once.
FDPP_API fdpp_status fdpp_attention_workspace_bytes(const fdpp_attention_args* args, size_t* bytes);

// Entries of combine_counters a call with these shapes needs: batch x num_kv_heads x ceil(num_heads / num_kv_heads
// x seq / 16) for the decode kernel, 0 otherwise. Reads only the shapes and modes (no pointer, no device query).
FDPP_API fdpp_status fdpp_attention_combine_counters(const fdpp_attention_args* args, size_t* count);

// out = attention(args) on `stream` (a cudaStream_t; NULL = the legacy default stream). Never synchronizes.
FDPP_API fdpp_status fdpp_attention_forward(const fdpp_attention_args* args, void* workspace, size_t workspace_bytes,
                                            void* stream);

// The kernel AUTO picks for these args (an fdpp_attention_kernel value), and the decode split count on the current
// device (>= 1), for diagnostics and benchmarks.
FDPP_API fdpp_status fdpp_attention_plan(const fdpp_attention_args* args, int32_t* kernel, int32_t* num_splits);

// Whether the decode combines its splits inside a thread block cluster for these args on the current device (*cluster
// = 1) or with the combine kernel (0).
FDPP_API fdpp_status fdpp_attention_decode_cluster(const fdpp_attention_args* args, int32_t* cluster);

// The pure host split heuristic (attention_heuristics.h): units = batch x kv heads x row blocks, tiles = key tiles
// of the longest sequence, sms = the GPU's SMs, ctas_per_sm = decode CTAs resident per SM.
FDPP_API int fdpp_attention_decode_splits(int units, int tiles, int sms, int ctas_per_sm);

// The pure host prefill heuristics off Hopper (attention_heuristics.h; on sm_90 the plan runs prefill_config 4,
// synchronized): heads = batch x query heads, seq = query tokens,
// slots = resident prefill CTAs on the GPU. Returns the prefill_config the plan picks (1-3); *synchronized (if not
// NULL) = 1 where the plan runs the synchronized softmax although the unified one was asked for.
FDPP_API int fdpp_attention_prefill_plan(int heads, int seq, int slots, int* synchronized);

// The pure host rule for the decode's cluster combine (attention_heuristics.h): 1 where a grid of `ctas` CTAs in
// `splits` splits on a GPU of compute capability major `cc_major` with `sms` SMs may combine in clusters (the
// launcher also checks that all the clusters fit at once), else 0.
FDPP_API int fdpp_attention_cluster_combine_ok(int splits, int cc_major, int ctas, int sms);

// The pure host rule for the decode's pipeline stages (attention_heuristics.h): the stages the split kernel runs
// for a grid of `ctas` CTAs on `sms` SMs, combining in clusters (cluster != 0) or not, each CTA streaming
// `tiles_per_split` key tiles. Returns 2, 3 or 4.
FDPP_API int fdpp_attention_decode_stages(int ctas, int sms, int cluster, int tiles_per_split);

// The library's own counters on the current device (used when args->counters is NULL): copies them to the host
// (a synchronizing copy: diagnostics only, never inside a launch path) and zeroes them when reset != 0.
FDPP_API fdpp_status fdpp_attention_read_counters(unsigned long long* host_fallback_rows,
                                                  unsigned long long* host_clamped_rows, int reset);

// RoPE on q (in place when q_out == q_in) and on the new k, then k and v written into the caches at positions
// past_len[b] + s. q [B, Hq, S, D], k_new/v_new [B, Hkv, S, D], caches [B, Hkv, kv_capacity, D] (or paged pools
// with block_table, below). Tokens whose
// position falls outside the cache are not written and are counted in counters[1]. The first rope_dim channels of
// each head rotate (pairs (i, i + rope_dim/2), or (2i, 2i+1) when interleaved), the rest pass through; e.g.
// chatglm2: head_dim 128, rope_dim 64, interleaved; OPT: rope_dim 0 (append only, q copied to q_out).
// A table, one tensor (pointer and strides) per line:
// clang-format off
typedef struct fdpp_rope_append_args {
  int32_t dtype;
  int32_t batch, num_heads, num_kv_heads, seq, head_dim, kv_capacity;
  int32_t rope_interleaved;  // 0: rotate halves (pairs i, i + D/2; Llama/NeoX); 1: adjacent pairs (2i, 2i+1; GPT-J)
  float rope_theta;
  const void* q_in;   void* q_out;   int64_t q_stride_b, q_stride_h, q_stride_s;
  const void* k_new;  int64_t kn_stride_b, kn_stride_h, kn_stride_s;
  const void* v_new;  int64_t vn_stride_b, vn_stride_h, vn_stride_s;
  void* k_cache;      int64_t kc_stride_b, kc_stride_h, kc_stride_s;
  void* v_cache;      int64_t vc_stride_b, vc_stride_h, vc_stride_s;
  const int64_t* past_len;
  unsigned long long* counters;
  int32_t rope_dim;        // rotated channels per head, even, <= head_dim; 0: no rotation (set head_dim for full RoPE)
  const float* inv_freq;   // device float32 [rope_dim / 2]: angle per position of pair i (the model's rotary table,
                           // rope scaling included); NULL: rope_theta^(-2i / rope_dim)
  // Paged caches, as in fdpp_attention_args: position pos of sequence b goes to row pos % kv_block_size of block
  // block_table[b * block_table_stride + pos / kv_block_size]; positions >= kv_capacity (W x kv_block_size) are
  // dropped and counted. NULL: contiguous caches.
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t kv_block_size;
} fdpp_rope_append_args;
// clang-format on

FDPP_API fdpp_status fdpp_rope_append(const fdpp_rope_append_args* args, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif
