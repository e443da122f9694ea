// The argument checks of fdpp::AsyncSoftmaxAttention and its RoPE + cache append (attention_params.h): one set,
// run by the C ABI (plugins/capi/attention_capi.cpp) and the TensorRT adapter before they launch. Host code only.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/attention/attention_params.h"

namespace fdpp {
namespace {

constexpr int kMaxGridYZ = 65535;  // CUDA's limit on a grid's y and z dimensions

std::string str(long long v) { return std::to_string(v); }

ParamsCheck invalid(std::string message) { return ParamsCheck{ParamsError::kInvalid, std::move(message)}; }
ParamsCheck unsupported(std::string message) { return ParamsCheck{ParamsError::kUnsupported, std::move(message)}; }

std::string supported_head_dims() {
  std::string list;
  const int n = static_cast<int>(sizeof(contract::kAttentionHeadDims) / sizeof(contract::kAttentionHeadDims[0]));
  for (int i = 0; i < n; ++i)
    list += (i == 0 ? "" : i + 1 == n ? " and " : ", ") + str(contract::kAttentionHeadDims[i]);
  return list;
}

ParamsCheck check_head_dim(int head_dim) {
  if (head_dim_supported(head_dim)) return {};
  return unsupported("head_dim " + str(head_dim) + " is not supported; the kernels are built for head_dim " +
                     supported_head_dims());
}

int elem_bytes(AttnDtype dtype) { return dtype == AttnDtype::kFloat32 ? 4 : 2; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A tensor operand: pointer alignment and strides that keep every row 16-byte aligned.
ParamsCheck check_operand(const char* name, const void* ptr, int64_t sb, int64_t sh, int64_t ss, int esize) {
  if (ptr == nullptr) return invalid(std::string(name) + " is NULL; pass a device pointer");
  if (!aligned16(ptr))
    return invalid(std::string(name) +
                   " is not 16-byte aligned; pass a tensor whose storage starts aligned (e.g. a contiguous torch "
                   "tensor, not a slice at an odd offset)");
  const int64_t per16 = 16 / esize;
  for (int64_t s : {sb, sh, ss}) {
    if (s < 0 || s % per16 != 0)
      return invalid(std::string(name) + " has stride " + str(s) + "; strides must be >= 0 and multiples of " +
                     str(per16) + " elements (16 bytes)");
  }
  return {};
}

ParamsCheck check_heads(int num_heads, int num_kv_heads) {
  if (num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads != 0)
    return invalid("num_heads " + str(num_heads) + " must be a positive multiple of num_kv_heads " + str(num_kv_heads));
  return {};
}

// A paged cache's table (attention and the cache append): the block size is the contract's, the capacity whole
// blocks, and each table row at least W = kv_capacity / kKvBlockSize entries long.
ParamsCheck check_pages(const int32_t* table, int64_t stride, int block_size, int kv_capacity) {
  if (table == nullptr) return {};
  if (block_size != kKvBlockSize)
    return invalid("kv_block_size " + str(block_size) + " with a block_table; the kernels are built for blocks of " +
                   str(kKvBlockSize) + " tokens (the contract's kv_block_size): use pools [blocks, heads, " +
                   str(kKvBlockSize) + ", head_dim]");
  if (kv_capacity % kKvBlockSize != 0)
    return invalid("kv_capacity " + str(kv_capacity) + " with a block_table must be W x " + str(kKvBlockSize) +
                   " for a table of W columns; pass the table's width times the block size");
  const int64_t width = kv_capacity / kKvBlockSize;
  if (stride < width)
    return invalid("block_table_stride " + str(stride) + " is below the table's " + str(width) +
                   " columns (kv_capacity / kv_block_size); pass the row stride of the [batch, W] table");
  if (reinterpret_cast<uintptr_t>(table) % 4 != 0) return invalid("block_table is not 4-byte aligned (int32)");
  return {};
}

}  // namespace

ParamsCheck check_attention_params(const AttentionParams& p, bool with_tensors) {
  const int dtype = static_cast<int>(p.dtype);
  if (dtype < 0 || dtype > 2)
    return invalid("unknown dtype code " + str(dtype) + " (0 float16, 1 bfloat16, 2 float32)");
  if (ParamsCheck c = check_head_dim(p.head_dim)) return c;
  if (p.batch < 0 || p.seq < 0)
    return invalid("batch and seq must be >= 0 (got " + str(p.batch) + ", " + str(p.seq) + ")");
  if (ParamsCheck c = check_heads(p.num_heads, p.num_kv_heads)) return c;
  if (p.kv_capacity < 1) return invalid("kv_capacity (the key/value length dimension) must be >= 1");
  if (p.block_table != nullptr && p.max_kv_len > p.kv_capacity)
    return invalid("max_kv_len " + str(p.max_kv_len) + " is above the block table's " + str(p.kv_capacity) +
                   " keys (W x kv_block_size); widen the table or shorten the sequence");
  if (p.max_kv_len < 1 || p.max_kv_len > p.kv_capacity)
    return invalid("max_kv_len " + str(p.max_kv_len) + " is outside [1, " + str(p.kv_capacity) +
                   "] (the KV cache length); the keys must fit in the cache (grow the cache or shorten the sequence)");
  const int mask = static_cast<int>(p.mask_mode);
  if (mask < 0 || mask > 2) return invalid("unknown mask_mode " + str(mask) + " (0 past_len, 1 bias, 2 none)");
  if (p.block_table != nullptr && p.mask_mode != MaskMode::kPastLen)
    return invalid("a block_table (paged KV cache) needs mask_mode past_len (0); pass past_len, or contiguous caches");
  if (ParamsCheck c = check_pages(p.block_table, p.block_table_stride, p.kv_block_size, p.kv_capacity)) return c;
  if (p.mask_mode == MaskMode::kPastLen && p.seq > p.max_kv_len)
    return invalid("seq " + str(p.seq) + " new tokens do not fit in a KV length of " + str(p.max_kv_len) +
                   " (max_kv_len / kv_capacity); grow the cache");
  const int softmax = static_cast<int>(p.softmax);
  if (softmax != 0 && softmax != 1)
    return invalid("unknown softmax_mode " + str(softmax) + " (0 unified, 1 synchronized)");
  const int kernel = static_cast<int>(p.kernel);
  if (kernel < 0 || kernel > 3)
    return invalid("unknown kernel " + str(kernel) + " (0 auto, 1 decode, 2 prefill, 3 rowwise)");
  if (p.dtype == AttnDtype::kFloat32 && (p.kernel == AttnKernel::kDecode || p.kernel == AttnKernel::kPrefill))
    return unsupported(
        "the decode and prefill kernels take float16 or bfloat16; float32 runs on the rowwise "
        "kernel (kernel 0 or 3)");
  if (p.num_splits < 0 || p.num_splits > 1024) return invalid("num_splits must be in [0, 1024]");
  const int combine = static_cast<int>(p.decode_combine);
  if (combine < 0 || combine > 3)
    return invalid("unknown decode_combine " + str(combine) + " (0 plan, 1 kernel, 2 cluster, 3 last_block)");
  if (p.prefill_config < 0 || p.prefill_config > 5 || p.prefill_config == 3)
    return invalid("unknown prefill_config " + str(p.prefill_config) +
                   " (0 plan, 1 128 rows x 32-key steps, 2 64 rows x 64-key steps, 4 wgmma on sm_90, 5 TMA + wgmma "
                   "on sm_90)");
  if (p.prefill_config != 0 && !prefill_shape_takes(p, p.prefill_config))
    return unsupported("prefill_config " + str(p.prefill_config) + " is not built for head_dim " + str(p.head_dim) +
                       (p.softcap != 0.f || p.window != 0 ? " with softcap or window" : "") +
                       "; use 0 (the plan) or 2 (64-row blocks)");
  if (!(std::isfinite(p.scale) && p.scale > 0.f)) return invalid("scale must be finite and > 0");
  if (!std::isfinite(p.phi)) return invalid("phi must be finite");
  if (!(std::isfinite(p.guard_lo) && std::isfinite(p.guard_hi) && p.guard_lo < p.guard_hi))
    return invalid("guard_lo < guard_hi must hold, both finite (got " + std::to_string(p.guard_lo) + ", " +
                   std::to_string(p.guard_hi) + ")");
  // 0.001 floor: the kernels scale by 2 / softcap, which a tinier cap overflows (0 * inf = NaN at a zero score)
  if (!(std::isfinite(p.softcap) && (p.softcap == 0.f || p.softcap >= 1e-3f) &&
        p.softcap <= contract::kAttentionSoftcapMax))
    return invalid("softcap " + std::to_string(p.softcap) + " must be 0 (no soft-capping) or in [0.001, " +
                   std::to_string(contract::kAttentionSoftcapMax) + "]");
  if (p.window < 0) return invalid("window " + str(p.window) + " must be >= 0 (0: no sliding window)");
  if (p.window > 0 && p.mask_mode != MaskMode::kPastLen)
    return invalid("window " + str(p.window) +
                   " needs mask_mode past_len (0): the window counts back from each query's position past_len + i");

  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads * p.seq;
  if (rows > 0x7fffffff) return invalid("batch x num_heads x seq exceeds 2^31 rows");
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t row_blocks = (static_cast<int64_t>(group) * p.seq + 15) / 16;
  if (p.batch > kMaxGridYZ || static_cast<int64_t>(p.num_kv_heads) * row_blocks > kMaxGridYZ ||
      (static_cast<int64_t>(p.seq) + 63) / 64 > kMaxGridYZ)
    return invalid("shape beyond the launch grid (batch <= 65535, kv heads x row blocks <= 65535)");
  if (!with_tensors || rows == 0) return {};

  const int esize = elem_bytes(p.dtype);
  if (ParamsCheck c = check_operand("query", p.q, p.q_sb, p.q_sh, p.q_ss, esize)) return c;
  if (ParamsCheck c = check_operand("key", p.k, p.k_sb, p.k_sh, p.k_ss, esize)) return c;
  if (ParamsCheck c = check_operand("value", p.v, p.v_sb, p.v_sh, p.v_ss, esize)) return c;
  if (ParamsCheck c = check_operand("output", p.out, p.o_sb, p.o_sh, p.o_ss, esize)) return c;
  if (p.mask_mode == MaskMode::kPastLen) {
    if (p.past_len == nullptr) return invalid("mask_mode past_len needs past_len (a device int64 [batch])");
    if (reinterpret_cast<uintptr_t>(p.past_len) % 8 != 0) return invalid("past_len is not 8-byte aligned");
  }
  if (p.decode_combine == DecodeCombine::kLastBlock && p.combine_counters == nullptr)
    return invalid(
        "decode_combine last_block needs combine_counters: a zeroed device uint32 buffer of batch x num_kv_heads x "
        "row blocks entries (fdpp_attention_combine_counters), or use 0 (plan) or 1 (kernel)");
  if (reinterpret_cast<uintptr_t>(p.combine_counters) % 4 != 0)
    return invalid("combine_counters is not 4-byte aligned");
  if (p.mask_mode == MaskMode::kBias) {
    if (p.bias == nullptr) return invalid("mask_mode bias needs the bias tensor");
    if (reinterpret_cast<uintptr_t>(p.bias) % esize != 0) return invalid("bias is not element-aligned");
    if (p.bias_sb < 0 || p.bias_ss < 0 || p.bias_sl < 0) return invalid("bias strides must be >= 0 (0 broadcasts)");
  }
  return {};
}

ParamsCheck check_rope_append_params(const RopeAppendParams& p) {
  const int dtype = static_cast<int>(p.dtype);
  if (dtype < 0 || dtype > 2) return invalid("unknown dtype code " + str(dtype));
  if (ParamsCheck c = check_head_dim(p.head_dim)) return c;
  if (p.batch < 0 || p.seq < 0 || p.batch > kMaxGridYZ || p.seq > kMaxGridYZ)
    return invalid("batch and seq must be in [0, 65535]");
  if (ParamsCheck c = check_heads(p.num_heads, p.num_kv_heads)) return c;
  if (p.kv_capacity < 1) return invalid("kv_capacity must be >= 1");
  if (ParamsCheck c = check_pages(p.block_table, p.block_table_stride, p.kv_block_size, p.kv_capacity)) return c;
  if (p.rope_dim < 0 || p.rope_dim > p.head_dim || p.rope_dim % 2 != 0)
    return invalid("rope_dim " + str(p.rope_dim) + " must be even and in [0, head_dim " + str(p.head_dim) +
                   "] (0: no rotation)");
  if (p.rope_dim > 0 && p.inv_freq == nullptr && !(std::isfinite(p.rope_theta) && p.rope_theta > 1.f))
    return invalid("rope_theta must be finite and > 1 (or pass inv_freq)");
  if (reinterpret_cast<uintptr_t>(p.inv_freq) % 4 != 0) return invalid("inv_freq is not 4-byte aligned");
  if (p.batch == 0 || p.seq == 0) return {};
  const int esize = elem_bytes(p.dtype);
  if (ParamsCheck c = check_operand("q_in", p.q_in, p.q_sb, p.q_sh, p.q_ss, esize)) return c;
  if (ParamsCheck c = check_operand("q_out", p.q_out, p.q_sb, p.q_sh, p.q_ss, esize)) return c;
  if (ParamsCheck c = check_operand("k_new", p.k_new, p.kn_sb, p.kn_sh, p.kn_ss, esize)) return c;
  if (ParamsCheck c = check_operand("v_new", p.v_new, p.vn_sb, p.vn_sh, p.vn_ss, esize)) return c;
  if (ParamsCheck c = check_operand("k_cache", p.k_cache, p.kc_sb, p.kc_sh, p.kc_ss, esize)) return c;
  if (ParamsCheck c = check_operand("v_cache", p.v_cache, p.vc_sb, p.vc_sh, p.vc_ss, esize)) return c;
  if (p.past_len == nullptr || reinterpret_cast<uintptr_t>(p.past_len) % 8 != 0)
    return invalid("past_len must be a device int64 [batch] pointer");
  return {};
}

}  // namespace fdpp
