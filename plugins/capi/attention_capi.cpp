// C ABI of fdpp::AsyncSoftmaxAttention: validate, translate to AttentionParams, launch. Every check names the
// argument and what to do; nothing here synchronizes except fdpp_attention_read_counters (diagnostics).
#include "capi/attention_capi.h"

#include <string>

#include "capi/capi_errors.h"
#include "capi/portable_capi.h"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.h"
#include "kernels/portable/portable.h"

namespace {

using fdpp::set_error;

std::string str(long long v) { return std::to_string(v); }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

fdpp_status invalid(const char* fn, const std::string& msg) {
  return set_error(FDPP_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + msg);
}

fdpp_status unsupported(const char* fn, const std::string& msg) {
  return set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": " + msg);
}

// A failed check_*_params as a status with "<fn>: <message>" as the last error.
fdpp_status from_check(const char* fn, const fdpp::ParamsCheck& c) {
  if (!c) return FDPP_OK;
  const fdpp_status code =
      c.error == fdpp::ParamsError::kUnsupported ? FDPP_ERR_UNSUPPORTED : FDPP_ERR_INVALID_ARGUMENT;
  return set_error(code, std::string(fn) + ": " + c.message);
}

// The args as AttentionParams (a plain translation), then the shared checks (check_attention_params; the pointers,
// strides and alignment too when with_tensors).
fdpp_status to_params(const fdpp_attention_args* x, fdpp::AttentionParams* p, const char* fn,
                      bool with_tensors = true) {
  if (x == nullptr) return invalid(fn, "args is NULL");
  if (x->pdl != FDPP_PDL_AUTO && x->pdl != FDPP_PDL_OFF)
    return invalid(fn, "pdl must be FDPP_PDL_AUTO (0) or FDPP_PDL_OFF (1)");
  p->dtype = static_cast<fdpp::AttnDtype>(x->dtype);
  p->batch = x->batch, p->num_heads = x->num_heads, p->num_kv_heads = x->num_kv_heads;
  p->seq = x->seq, p->head_dim = x->head_dim, p->kv_capacity = x->kv_capacity;
  p->max_kv_len = x->max_kv_len == 0 ? x->kv_capacity : x->max_kv_len;
  p->mask_mode = static_cast<fdpp::MaskMode>(x->mask_mode);
  p->softmax = static_cast<fdpp::SoftmaxMode>(x->softmax_mode);
  p->kernel = static_cast<fdpp::AttnKernel>(x->kernel);
  p->num_splits = x->num_splits;
  p->decode_combine = static_cast<fdpp::DecodeCombine>(x->decode_combine);
  p->prefill_config = x->prefill_config;
  p->scale = x->scale, p->phi = x->phi, p->guard_lo = x->guard_lo, p->guard_hi = x->guard_hi;
  p->pdl = x->pdl == FDPP_PDL_AUTO;
  p->q = x->query, p->q_sb = x->q_stride_b, p->q_sh = x->q_stride_h, p->q_ss = x->q_stride_s;
  p->k = x->key, p->k_sb = x->k_stride_b, p->k_sh = x->k_stride_h, p->k_ss = x->k_stride_s;
  p->v = x->value, p->v_sb = x->v_stride_b, p->v_sh = x->v_stride_h, p->v_ss = x->v_stride_s;
  p->out = x->output, p->o_sb = x->o_stride_b, p->o_sh = x->o_stride_h, p->o_ss = x->o_stride_s;
  p->past_len = x->past_len;
  p->bias = x->bias, p->bias_sb = x->bias_stride_b, p->bias_ss = x->bias_stride_s, p->bias_sl = x->bias_stride_l;
  p->counters = x->counters;
  p->combine_counters = x->combine_counters;
  p->block_table = x->block_table, p->block_table_stride = x->block_table_stride, p->kv_block_size = x->kv_block_size;
  p->softcap = x->softcap, p->window = x->window;
  return from_check(fn, fdpp::check_attention_params(*p, with_tensors));
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

fdpp_status fdpp_attention_combine_counters(const fdpp_attention_args* args, size_t* count) {
  return fdpp::guarded("fdpp_attention_combine_counters", [&] {
    const char* fn = "fdpp_attention_combine_counters";
    if (count == nullptr) return invalid(fn, "count is NULL");
    fdpp::AttentionParams p;
    // Shapes only: a caller asks before it has the buffer.
    if (fdpp_status st = to_params(args, &p, fn, /*with_tensors=*/false)) return st;
    *count = fdpp::attention_combine_counters(p);
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
        fdpp::decode_uses_cluster(p) == 0) {
      const std::string splits = str(fdpp::decode_splits_for(p));
      return unsupported(fn,
                         "decode_combine cluster needs an sm_90 GPU and 2 to 8 decode splits in one wave of one "
                         "CTA per SM (this call has " +
                             splits + " splits); use 0 (plan) or 1 (kernel)");
    }
    const cudaError_t err = fdpp::attention_forward(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    if (err == cudaErrorNotSupported && (p.prefill_config == 4 || p.prefill_config == 5))
      return unsupported(fn, "prefill_config " + str(static_cast<long long>(p.prefill_config)) +
                                 " (a wgmma kernel) needs an sm_90 GPU and a library built for 90a; use 0 (the plan)");
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
    p.block_table = x->block_table, p.block_table_stride = x->block_table_stride, p.kv_block_size = x->kv_block_size;
    if (fdpp_status st = from_check(fn, fdpp::check_rope_append_params(p))) return st;
    if (p.batch == 0 || p.seq == 0) return FDPP_OK;
    return fdpp::from_cuda(fdpp::rope_append(p, static_cast<cudaStream_t>(stream)), fn);
  });
}

// --- the portable kernels (portable_capi.h) -----------------------------------------------------------------------

namespace {
// The portable kernels read contiguous caches only.
fdpp_status portable_params(const fdpp_attention_args* args, fdpp::AttentionParams* p, const char* fn) {
  if (fdpp_status st = to_params(args, p, fn)) return st;
  if (p->block_table != nullptr)
    return unsupported(fn,
                       "the portable kernels take contiguous caches; pass block_table NULL or use "
                       "fdpp_attention_forward");
  if (p->head_dim != 64 && p->head_dim != 128)
    return unsupported(fn, "head_dim " + str(static_cast<long long>(p->head_dim)) +
                               " is not supported by the portable kernels (built for 64 and 128); use "
                               "fdpp_attention_forward");
  if (p->softcap != 0.f || p->window != 0)
    return unsupported(fn,
                       "the portable kernels have no softcap or window; pass 0 for both or use "
                       "fdpp_attention_forward");
  return FDPP_OK;
}
}  // namespace

fdpp_status fdpp_portable_attention_workspace_bytes(const fdpp_attention_args* args, size_t* bytes) {
  return fdpp::guarded("fdpp_portable_attention_workspace_bytes", [&] {
    const char* fn = "fdpp_portable_attention_workspace_bytes";
    if (bytes == nullptr) return invalid(fn, "bytes is NULL");
    fdpp::AttentionParams p;
    if (fdpp_status st = portable_params(args, &p, fn)) return st;
    return fdpp::from_cuda(fdpp::portable::attention_workspace_bytes(p, bytes), fn);
  });
}

fdpp_status fdpp_portable_attention_decode(const fdpp_attention_args* args, void* workspace, size_t workspace_bytes,
                                           void* stream) {
  return fdpp::guarded("fdpp_portable_attention_decode", [&] {
    const char* fn = "fdpp_portable_attention_decode";
    fdpp::AttentionParams p;
    if (fdpp_status st = portable_params(args, &p, fn)) return st;
    size_t need = 0;
    if (fdpp_status st = fdpp::from_cuda(fdpp::portable::attention_workspace_bytes(p, &need), fn)) return st;
    if (need > 0 && (workspace == nullptr || workspace_bytes < need || !aligned16(workspace)))
      return invalid(fn, "workspace of " + str(static_cast<long long>(workspace_bytes)) + " bytes; this call needs " +
                             str(static_cast<long long>(need)) +
                             " bytes, 16-byte aligned (ask fdpp_portable_attention_workspace_bytes)");
    if (p.counters == nullptr) {
      if (fdpp_status st = fdpp::from_cuda(fdpp::attention_default_counters(&p.counters), fn)) return st;
    }
    return fdpp::from_cuda(
        fdpp::portable::attention_decode(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream)), fn);
  });
}

}  // extern "C"
