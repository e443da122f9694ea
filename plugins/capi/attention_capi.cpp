// C ABI of fdpp::AsyncSoftmaxAttention: validate, translate to AttentionParams, launch. Every check names the
// argument and what to do; nothing here synchronizes except fdpp_attention_read_counters (diagnostics).
#include "capi/attention_capi.h"

#include <cmath>
#include <string>

#include "capi/capi_errors.h"
#include "kernels/attention_heuristics.h"
#include "kernels/attention_params.h"

namespace {

using fdpp::set_error;

constexpr int kMaxGridYZ = 65535;

int elem_bytes(int32_t dtype) { return dtype == FDPP_FLOAT32 ? 4 : 2; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

std::string str(long long v) { return std::to_string(v); }

fdpp_status invalid(const char* fn, const std::string& msg) {
  return set_error(FDPP_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + msg);
}

// A tensor operand: pointer alignment and strides that keep every row 16-byte aligned.
fdpp_status check_operand(const char* fn, const char* name, const void* ptr, int64_t sb, int64_t sh, int64_t ss,
                          int esize) {
  if (ptr == nullptr) return invalid(fn, std::string(name) + " is NULL; pass a device pointer");
  if (!aligned16(ptr))
    return invalid(fn, std::string(name) + " is not 16-byte aligned; pass a tensor whose storage starts aligned "
                                           "(e.g. a contiguous torch tensor, not a slice at an odd offset)");
  const int64_t per16 = 16 / esize;
  for (int64_t s : {sb, sh, ss}) {
    if (s < 0 || s % per16 != 0)
      return invalid(fn, std::string(name) + " has stride " + str(s) + "; strides must be >= 0 and multiples of " +
                             str(per16) + " elements (16 bytes)");
  }
  return FDPP_OK;
}

fdpp_status to_params(const fdpp_attention_args* x, fdpp::AttentionParams* p, const char* fn) {
  if (x == nullptr) return invalid(fn, "args is NULL");
  if (x->dtype < FDPP_FLOAT16 || x->dtype > FDPP_FLOAT32)
    return invalid(fn, "unknown dtype code " + str(x->dtype) + " (0 float16, 1 bfloat16, 2 float32)");
  if (x->head_dim != 64 && x->head_dim != 128)
    return set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": head_dim " + str(x->head_dim) +
                                               " is not supported; this build has kernels for head_dim 64 and 128");
  if (x->batch < 0 || x->seq < 0)
    return invalid(fn, "batch and seq must be >= 0 (got " + str(x->batch) + ", " + str(x->seq) + ")");
  if (x->num_heads < 1 || x->num_kv_heads < 1 || x->num_heads % x->num_kv_heads != 0)
    return invalid(fn, "num_heads " + str(x->num_heads) + " must be a positive multiple of num_kv_heads " +
                           str(x->num_kv_heads));
  if (x->kv_capacity < 1) return invalid(fn, "kv_capacity (the key/value length dimension) must be >= 1");
  const int max_kv = x->max_kv_len == 0 ? x->kv_capacity : x->max_kv_len;
  if (max_kv < 0 || max_kv > x->kv_capacity)
    return invalid(fn, "max_kv_len " + str(x->max_kv_len) + " exceeds the KV cache length " + str(x->kv_capacity) +
                           "; the keys must fit in the cache (grow the cache or shorten the sequence)");
  if (x->mask_mode == FDPP_MASK_PAST_LEN && (x->seq > max_kv))
    return invalid(fn, "seq " + str(x->seq) + " new tokens do not fit in a KV length of " + str(max_kv) +
                           " (max_kv_len / kv_capacity); grow the cache");
  if (x->mask_mode < FDPP_MASK_PAST_LEN || x->mask_mode > FDPP_MASK_NONE)
    return invalid(fn, "unknown mask_mode " + str(x->mask_mode) + " (0 past_len, 1 bias, 2 none)");
  if (x->softmax_mode != FDPP_SOFTMAX_UNIFIED && x->softmax_mode != FDPP_SOFTMAX_SYNCHRONIZED)
    return invalid(fn, "unknown softmax_mode " + str(x->softmax_mode) + " (0 unified, 1 synchronized)");
  if (x->kernel < FDPP_ATTN_AUTO || x->kernel > FDPP_ATTN_ROWWISE)
    return invalid(fn, "unknown kernel " + str(x->kernel) + " (0 auto, 1 decode, 2 prefill, 3 rowwise)");
  if (x->dtype == FDPP_FLOAT32 && (x->kernel == FDPP_ATTN_DECODE || x->kernel == FDPP_ATTN_PREFILL))
    return set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": the decode and prefill kernels take float16 or "
                                                             "bfloat16; float32 runs on the rowwise kernel (kernel 0 or 3)");
  if (x->num_splits < 0 || x->num_splits > 1024) return invalid(fn, "num_splits must be in [0, 1024]");
  if (x->decode_combine < FDPP_COMBINE_AUTO || x->decode_combine > FDPP_COMBINE_CLUSTER)
    return invalid(fn, "unknown decode_combine " + str(x->decode_combine) + " (0 plan, 1 kernel, 2 cluster)");
  if (x->prefill_config < 0 || x->prefill_config > 4)
    return invalid(fn, "unknown prefill_config " + str(x->prefill_config) +
                           " (0 plan, 1 128x32, 2 64x64, 3 128x32 rolled, 4 wgmma on sm_90)");
  if (!(std::isfinite(x->scale) && x->scale > 0.f)) return invalid(fn, "scale must be finite and > 0");
  if (!std::isfinite(x->phi)) return invalid(fn, "phi must be finite");
  if (!(std::isfinite(x->guard_lo) && std::isfinite(x->guard_hi) && x->guard_lo < x->guard_hi))
    return invalid(fn, "guard_lo < guard_hi must hold, both finite (got " + std::to_string(x->guard_lo) + ", " +
                           std::to_string(x->guard_hi) + ")");

  const int64_t rows = static_cast<int64_t>(x->batch) * x->num_heads * x->seq;
  if (rows > 0x7fffffff) return invalid(fn, "batch x num_heads x seq exceeds 2^31 rows");
  const int group = x->num_heads / x->num_kv_heads;
  const int64_t row_blocks = (static_cast<int64_t>(group) * x->seq + 15) / 16;
  if (x->batch > kMaxGridYZ || static_cast<int64_t>(x->num_kv_heads) * row_blocks > kMaxGridYZ ||
      (static_cast<int64_t>(x->seq) + 63) / 64 > kMaxGridYZ)
    return invalid(fn, "shape beyond the launch grid (batch <= 65535, kv heads x row blocks <= 65535)");

  const int esize = elem_bytes(x->dtype);
  if (rows > 0) {
    fdpp_status st;
    if ((st = check_operand(fn, "query", x->query, x->q_stride_b, x->q_stride_h, x->q_stride_s, esize))) return st;
    if ((st = check_operand(fn, "key", x->key, x->k_stride_b, x->k_stride_h, x->k_stride_s, esize))) return st;
    if ((st = check_operand(fn, "value", x->value, x->v_stride_b, x->v_stride_h, x->v_stride_s, esize))) return st;
    if ((st = check_operand(fn, "output", x->output, x->o_stride_b, x->o_stride_h, x->o_stride_s, esize))) return st;
    if (x->mask_mode == FDPP_MASK_PAST_LEN) {
      if (x->past_len == nullptr) return invalid(fn, "mask_mode past_len needs past_len (a device int64 [batch])");
      if (reinterpret_cast<uintptr_t>(x->past_len) % 8 != 0) return invalid(fn, "past_len is not 8-byte aligned");
    }
    if (x->mask_mode == FDPP_MASK_BIAS) {
      if (x->bias == nullptr) return invalid(fn, "mask_mode bias needs the bias tensor");
      if (reinterpret_cast<uintptr_t>(x->bias) % esize != 0) return invalid(fn, "bias is not element-aligned");
      if (x->bias_stride_b < 0 || x->bias_stride_s < 0 || x->bias_stride_l < 0)
        return invalid(fn, "bias strides must be >= 0 (0 broadcasts)");
    }
  }

  p->dtype = static_cast<fdpp::AttnDtype>(x->dtype);
  p->batch = x->batch, p->num_heads = x->num_heads, p->num_kv_heads = x->num_kv_heads;
  p->seq = x->seq, p->head_dim = x->head_dim, p->kv_capacity = x->kv_capacity, p->max_kv_len = max_kv;
  p->mask_mode = static_cast<fdpp::MaskMode>(x->mask_mode);
  p->softmax = static_cast<fdpp::SoftmaxMode>(x->softmax_mode);
  p->kernel = static_cast<fdpp::AttnKernel>(x->kernel);
  p->num_splits = x->num_splits;
  p->decode_combine = static_cast<fdpp::DecodeCombine>(x->decode_combine);
  p->prefill_config = x->prefill_config;
  p->scale = x->scale, p->phi = x->phi, p->guard_lo = x->guard_lo, p->guard_hi = x->guard_hi;
  p->q = x->query, p->q_sb = x->q_stride_b, p->q_sh = x->q_stride_h, p->q_ss = x->q_stride_s;
  p->k = x->key, p->k_sb = x->k_stride_b, p->k_sh = x->k_stride_h, p->k_ss = x->k_stride_s;
  p->v = x->value, p->v_sb = x->v_stride_b, p->v_sh = x->v_stride_h, p->v_ss = x->v_stride_s;
  p->out = x->output, p->o_sb = x->o_stride_b, p->o_sh = x->o_stride_h, p->o_ss = x->o_stride_s;
  p->past_len = x->past_len;
  p->bias = x->bias, p->bias_sb = x->bias_stride_b, p->bias_ss = x->bias_stride_s, p->bias_sl = x->bias_stride_l;
  p->counters = x->counters;
  return FDPP_OK;
}

}  // namespace

extern "C" {

int fdpp_attention_args_size(void) { return static_cast<int>(sizeof(fdpp_attention_args)); }
int fdpp_rope_append_args_size(void) { return static_cast<int>(sizeof(fdpp_rope_append_args)); }

int fdpp_attention_decode_splits(int units, int tiles, int sms, int ctas_per_sm) {
  return fdpp::decode_num_splits(units, tiles, sms, ctas_per_sm);
}

int fdpp_attention_decode_stages(int ctas, int sms, int cluster, int tiles_per_split) {
  return fdpp::decode_stages(ctas, sms, cluster != 0, tiles_per_split);
}

int fdpp_attention_cluster_combine_ok(int splits, int cc_major, int ctas, int sms) {
  return fdpp::cluster_combine_ok(splits, cc_major, ctas, sms) ? 1 : 0;
}

int fdpp_attention_prefill_plan(int heads, int seq, int slots, int* synchronized) {
  if (synchronized) *synchronized = fdpp::prefill_prefers_synchronized(heads, seq, slots) ? 1 : 0;
  return fdpp::prefill_tile_config(heads, seq, slots);
}

fdpp_status fdpp_attention_workspace_bytes(const fdpp_attention_args* args, size_t* bytes) {
  return fdpp::guarded("fdpp_attention_workspace_bytes", [&] {
    if (bytes == nullptr) return invalid("fdpp_attention_workspace_bytes", "bytes is NULL");
    fdpp::AttentionParams p;
    if (fdpp_status st = to_params(args, &p, "fdpp_attention_workspace_bytes")) return st;
    *bytes = fdpp::attention_workspace_bytes(p);
    if (fdpp::choose_kernel(p) == fdpp::AttnKernel::kDecode && *bytes == 0)
      return fdpp::from_cuda(cudaGetLastError(), "fdpp_attention_workspace_bytes (device query)");
    return FDPP_OK;
  });
}

fdpp_status fdpp_attention_plan(const fdpp_attention_args* args, int32_t* kernel, int32_t* num_splits) {
  return fdpp::guarded("fdpp_attention_plan", [&] {
    fdpp::AttentionParams p;
    if (fdpp_status st = to_params(args, &p, "fdpp_attention_plan")) return st;
    if (kernel) *kernel = static_cast<int32_t>(fdpp::choose_kernel(p));
    if (num_splits) {
      const int splits = fdpp::decode_splits_for(p);
      if (splits < 1) return fdpp::from_cuda(cudaGetLastError(), "fdpp_attention_plan (device query)");
      *num_splits = splits;
    }
    return FDPP_OK;
  });
}

fdpp_status fdpp_attention_decode_cluster(const fdpp_attention_args* args, int32_t* cluster) {
  return fdpp::guarded("fdpp_attention_decode_cluster", [&] {
    if (cluster == nullptr) return invalid("fdpp_attention_decode_cluster", "cluster is NULL");
    fdpp::AttentionParams p;
    if (fdpp_status st = to_params(args, &p, "fdpp_attention_decode_cluster")) return st;
    const int uses = fdpp::decode_uses_cluster(p);
    if (uses < 0) return fdpp::from_cuda(cudaGetLastError(), "fdpp_attention_decode_cluster (device query)");
    *cluster = uses;
    return FDPP_OK;
  });
}

fdpp_status fdpp_attention_forward(const fdpp_attention_args* args, void* workspace, size_t workspace_bytes,
                                   void* stream) {
  return fdpp::guarded("fdpp_attention_forward", [&] {
    const char* fn = "fdpp_attention_forward";
    fdpp::AttentionParams p;
    if (fdpp_status st = to_params(args, &p, fn)) return st;
    const size_t need = fdpp::attention_workspace_bytes(p);
    if (need > 0 && (workspace == nullptr || workspace_bytes < need || !aligned16(workspace)))
      return invalid(fn, "workspace of " + str(static_cast<long long>(workspace_bytes)) + " bytes at " +
                             (workspace ? "a misaligned or small buffer" : "NULL") + "; this call needs " +
                             str(static_cast<long long>(need)) +
                             " bytes, 16-byte aligned (ask fdpp_attention_workspace_bytes)");
    if (fdpp::choose_kernel(p) == fdpp::AttnKernel::kDecode && need == 0)
      return fdpp::from_cuda(cudaGetLastError(), "fdpp_attention_forward (device query)");
    if (p.decode_combine == fdpp::DecodeCombine::kCluster && fdpp::choose_kernel(p) == fdpp::AttnKernel::kDecode &&
        fdpp::decode_uses_cluster(p) == 0)
      return fdpp::set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": decode_combine cluster needs an sm_90 GPU "
                                                                     "and 2 to 8 decode splits in one wave of one CTA "
                                                                     "per SM (this call has " +
                                                                     str(fdpp::decode_splits_for(p)) +
                                                                     " splits); use 0 (plan) or 1 (kernel)");
    const cudaError_t err = fdpp::attention_forward(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    if (err == cudaErrorInvalidDeviceFunction && p.prefill_config == 4) {
      return fdpp::set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": prefill_config 4 (the wgmma kernel) needs an "
                                                                     "sm_90 GPU and a library built for 90a; use 0");
    }
    return fdpp::from_cuda(err, fn);
  });
}

fdpp_status fdpp_attention_read_counters(unsigned long long* host_fallback_rows, unsigned long long* host_clamped_rows,
                                         int reset) {
  return fdpp::guarded("fdpp_attention_read_counters", [&] {
    unsigned long long* dev = nullptr;
    cudaError_t err = fdpp::attention_default_counters(&dev);
    unsigned long long host[2] = {0, 0};
    if (err == cudaSuccess) err = cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && reset) err = cudaMemset(dev, 0, sizeof(host));
    if (err != cudaSuccess) return fdpp::from_cuda(err, "fdpp_attention_read_counters");
    if (host_fallback_rows) *host_fallback_rows = host[0];
    if (host_clamped_rows) *host_clamped_rows = host[1];
    return FDPP_OK;
  });
}

fdpp_status fdpp_rope_append(const fdpp_rope_append_args* x, void* stream) {
  return fdpp::guarded("fdpp_rope_append", [&] {
    const char* fn = "fdpp_rope_append";
    if (x == nullptr) return invalid(fn, "args is NULL");
    if (x->dtype < FDPP_FLOAT16 || x->dtype > FDPP_FLOAT32) return invalid(fn, "unknown dtype code " + str(x->dtype));
    if (x->head_dim != 64 && x->head_dim != 128)
      return set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": head_dim " + str(x->head_dim) +
                                                 " is not supported; this build has kernels for head_dim 64 and 128");
    if (x->batch < 0 || x->seq < 0 || x->batch > kMaxGridYZ || x->seq > kMaxGridYZ)
      return invalid(fn, "batch and seq must be in [0, 65535]");
    if (x->num_heads < 1 || x->num_kv_heads < 1 || x->num_heads % x->num_kv_heads != 0)
      return invalid(fn, "num_heads must be a positive multiple of num_kv_heads");
    if (x->kv_capacity < 1) return invalid(fn, "kv_capacity must be >= 1");
    if (x->rope_dim < 0 || x->rope_dim > x->head_dim || x->rope_dim % 2 != 0)
      return invalid(fn, "rope_dim " + str(x->rope_dim) + " must be even and in [0, head_dim " + str(x->head_dim) +
                             "] (0: no rotation)");
    if (x->rope_dim > 0 && x->inv_freq == nullptr && !(std::isfinite(x->rope_theta) && x->rope_theta > 1.f))
      return invalid(fn, "rope_theta must be finite and > 1 (or pass inv_freq)");
    if (reinterpret_cast<uintptr_t>(x->inv_freq) % 4 != 0) return invalid(fn, "inv_freq is not 4-byte aligned");
    if (x->batch == 0 || x->seq == 0) return FDPP_OK;
    const int esize = elem_bytes(x->dtype);
    fdpp_status st;
    if ((st = check_operand(fn, "q_in", x->q_in, x->q_stride_b, x->q_stride_h, x->q_stride_s, esize))) return st;
    if ((st = check_operand(fn, "q_out", x->q_out, x->q_stride_b, x->q_stride_h, x->q_stride_s, esize))) return st;
    if ((st = check_operand(fn, "k_new", x->k_new, x->kn_stride_b, x->kn_stride_h, x->kn_stride_s, esize))) return st;
    if ((st = check_operand(fn, "v_new", x->v_new, x->vn_stride_b, x->vn_stride_h, x->vn_stride_s, esize))) return st;
    if ((st = check_operand(fn, "k_cache", x->k_cache, x->kc_stride_b, x->kc_stride_h, x->kc_stride_s, esize)))
      return st;
    if ((st = check_operand(fn, "v_cache", x->v_cache, x->vc_stride_b, x->vc_stride_h, x->vc_stride_s, esize)))
      return st;
    if (x->past_len == nullptr || reinterpret_cast<uintptr_t>(x->past_len) % 8 != 0)
      return invalid(fn, "past_len must be a device int64 [batch] pointer");
    fdpp::RopeAppendParams p;
    p.dtype = static_cast<fdpp::AttnDtype>(x->dtype);
    p.batch = x->batch, p.num_heads = x->num_heads, p.num_kv_heads = x->num_kv_heads, p.seq = x->seq;
    p.head_dim = x->head_dim, p.kv_capacity = x->kv_capacity;
    p.rope_theta = x->rope_theta, p.rope_interleaved = x->rope_interleaved;
    p.q_in = x->q_in, p.q_out = x->q_out, p.q_sb = x->q_stride_b, p.q_sh = x->q_stride_h, p.q_ss = x->q_stride_s;
    p.k_new = x->k_new, p.kn_sb = x->kn_stride_b, p.kn_sh = x->kn_stride_h, p.kn_ss = x->kn_stride_s;
    p.v_new = x->v_new, p.vn_sb = x->vn_stride_b, p.vn_sh = x->vn_stride_h, p.vn_ss = x->vn_stride_s;
    p.k_cache = x->k_cache, p.kc_sb = x->kc_stride_b, p.kc_sh = x->kc_stride_h, p.kc_ss = x->kc_stride_s;
    p.v_cache = x->v_cache, p.vc_sb = x->vc_stride_b, p.vc_sh = x->vc_stride_h, p.vc_ss = x->vc_stride_s;
    p.past_len = x->past_len;
    p.counters = x->counters;
    p.rope_dim = x->rope_dim, p.inv_freq = x->inv_freq;
    return fdpp::from_cuda(fdpp::rope_append(p, static_cast<cudaStream_t>(stream)), fn);
  });
}

}  // extern "C"
