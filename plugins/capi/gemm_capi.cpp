// C ABI of the flat GEMM: validates, translates to fdpp::gemm types, calls the launchers.
#include "capi/gemm_capi.h"

#include <string>

#include "capi/capi_errors.h"
#include "capi/portable_capi.h"
#include "kernels/gemm/gemm.h"
#include "kernels/portable/portable.h"

namespace {

namespace g = fdpp::gemm;

g::ImplBConfig to_config(const fdpp_gemm_implb_config& c) {
  return g::ImplBConfig{c.n_tile, c.k_tile, c.stages, c.split_k, c.loader, c.row_blocks};
}

fdpp_gemm_implb_config from_config(const g::ImplBConfig& c) {
  return fdpp_gemm_implb_config{c.n_tile, c.k_tile, c.stages, c.split_k, c.loader, c.row_blocks};
}

g::Plan to_plan(const fdpp_gemm_plan& p) {
  // m3 = 0 means no third range, as in the FlatGemm contract (a zero-initialised struct keeps ABI 6's plan)
  return g::Plan{p.m1, p.m2, to_config(p.implb), p.implc, p.m3 == 0 ? p.m2 : p.m3, to_config(p.wgmma)};
}

fdpp_gemm_plan from_plan(const g::Plan& p) {
  return fdpp_gemm_plan{p.m1, p.m2, from_config(p.implb), p.implc, p.m3, from_config(p.wgmma)};
}

fdpp_status invalid(const char* fn, const std::string& why) {
  return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + why);
}

// The epilogue and dtype codes of the query functions (the run functions check them through to_problem).
const char* codes_problem(int32_t epilogue, int32_t dtype) {
  if (epilogue != FDPP_GEMM_EPILOGUE_NONE && epilogue != FDPP_GEMM_EPILOGUE_SILU_MUL)
    return "epilogue must be FDPP_GEMM_EPILOGUE_NONE (0) or FDPP_GEMM_EPILOGUE_SILU_MUL (1)";
  if (dtype != FDPP_FLOAT16 && dtype != FDPP_BFLOAT16) return "dtype must be FDPP_FLOAT16 (0) or FDPP_BFLOAT16 (1)";
  return nullptr;
}

// Args -> Problem, or an error status with the message set.
fdpp_status to_problem(const char* fn, const fdpp_gemm_args* args, g::Problem* out) {
  if (args == nullptr) return invalid(fn, "args is NULL");
  if (args->dtype == FDPP_FLOAT32)
    return fdpp::set_error(FDPP_ERR_UNSUPPORTED,
                           std::string(fn) + ": float32 GEMM is not implemented; use float16 or bfloat16");
  g::Problem p;
  p.x = args->x;
  p.w = args->w;
  p.bias = args->bias;
  p.residual = args->residual;
  p.y = args->y;
  p.m = args->m;
  p.n = args->n;
  p.k = args->k;
  p.dtype = static_cast<g::Dtype>(args->dtype);
  p.epilogue = static_cast<g::Epilogue>(args->epilogue);
  if (args->pdl != FDPP_PDL_AUTO && args->pdl != FDPP_PDL_OFF)
    return invalid(fn, "pdl must be FDPP_PDL_AUTO (0) or FDPP_PDL_OFF (1)");
  p.pdl = args->pdl == FDPP_PDL_AUTO;
  if (const char* why = g::problem_problem(p)) return invalid(fn, why);
  *out = p;
  return FDPP_OK;
}

// A launcher's cudaError_t -> status; "not supported" and argument errors carry the launcher's detail message.
fdpp_status from_launch(const char* fn, cudaError_t err) {
  if (err == cudaSuccess) return FDPP_OK;
  const std::string detail = g::last_detail();
  g::set_detail("");
  if (err == cudaErrorNotSupported) return fdpp::set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": " + detail);
  if (err == cudaErrorInvalidValue && !detail.empty()) return invalid(fn, detail);
  std::string msg = std::string(fn) + ": " + cudaGetErrorString(err);
  if (!detail.empty()) msg += " (" + detail + ")";
  return fdpp::set_error(FDPP_ERR_CUDA, msg);
}

fdpp_status device_facts(int32_t* num_sms, int32_t* cc_major) {
  if (*num_sms > 0 && *cc_major > 0) return FDPP_OK;
  g::DeviceInfo dev;
  cudaError_t err = g::current_device_info(&dev);
  if (err != cudaSuccess) return fdpp::from_cuda(err, "device query (pass num_sms and cc_major to skip it)");
  if (*num_sms <= 0) *num_sms = dev.num_sms;
  if (*cc_major <= 0) *cc_major = dev.cc_major;
  return FDPP_OK;
}

}  // namespace

extern "C" {

fdpp_status fdpp_gemm_default_plan(int64_t n, int64_t k, int32_t epilogue, int32_t num_sms, int32_t cc_major,
                                   fdpp_gemm_plan* out) {
  return fdpp::guarded("fdpp_gemm_default_plan", [&] {
    if (out == nullptr) return invalid("fdpp_gemm_default_plan", "out is NULL");
    if (n < 1 || k < 1) return invalid("fdpp_gemm_default_plan", "N and K must be >= 1");
    fdpp_status s = device_facts(&num_sms, &cc_major);
    if (s != FDPP_OK) return s;
    const g::Plan p = g::default_plan(n, k, epilogue == FDPP_GEMM_EPILOGUE_SILU_MUL, num_sms, cc_major);
    *out = from_plan(p);
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_select(int64_t m, const fdpp_gemm_plan* plan, int32_t* impl_out) {
  return fdpp::guarded("fdpp_gemm_select", [&] {
    if (plan == nullptr || impl_out == nullptr)
      return invalid("fdpp_gemm_select", "plan and impl_out must not be NULL");
    if (m < 1) return invalid("fdpp_gemm_select", "M must be >= 1");
    const g::Plan p = to_plan(*plan);
    if (const char* why = g::plan_problem(p)) return invalid("fdpp_gemm_select", why);
    *impl_out = static_cast<int32_t>(g::select_impl(m, p));
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_select_implb_config(int64_t m, const fdpp_gemm_plan* plan, int32_t* range_out) {
  return fdpp::guarded("fdpp_gemm_select_implb_config", [&] {
    const char* fn = "fdpp_gemm_select_implb_config";
    if (plan == nullptr || range_out == nullptr) return invalid(fn, "plan and range_out must not be NULL");
    if (m < 1) return invalid(fn, "M must be >= 1");
    const g::Plan p = to_plan(*plan);
    if (const char* why = g::plan_problem(p)) return invalid(fn, why);
    *range_out = g::select_impl(m, p) != g::Impl::kB ? 0 : &g::plan_implb_config(m, p) == &p.wgmma ? 2 : 1;
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_check_implb_config(const fdpp_gemm_implb_config* config, int64_t m, int64_t k, int64_t max_smem,
                                         int32_t cc_major) {
  return fdpp::guarded("fdpp_gemm_check_implb_config", [&] {
    if (config == nullptr) return invalid("fdpp_gemm_check_implb_config", "config is NULL");
    const g::ImplBConfig c = to_config(*config);
    if (m < 1 || m > g::implb_max_m(c))
      return invalid("fdpp_gemm_check_implb_config", "ImplB handles 1 <= M <= 64 (256 with the wgmma loader, 4)");
    const char* why = g::implb_config_problem(c, k, g::implb_batch_blocks(m, 8), max_smem, cc_major);
    return why ? invalid("fdpp_gemm_check_implb_config", why) : FDPP_OK;
  });
}

fdpp_status fdpp_gemm_implb_candidates(int64_t n, int64_t k, int32_t epilogue, int64_t m, int32_t num_sms,
                                       int64_t max_smem, int32_t cc_major, fdpp_gemm_implb_config* out, int32_t cap,
                                       int32_t* count) {
  return fdpp::guarded("fdpp_gemm_implb_candidates", [&] {
    if (count == nullptr || (cap > 0 && out == nullptr))
      return invalid("fdpp_gemm_implb_candidates", "out (when cap > 0) and count must not be NULL");
    if (m < 1 || m > g::kImplBWgmmaMaxM)
      return invalid("fdpp_gemm_implb_candidates", "ImplB handles 1 <= M <= 256 (above 64 only the wgmma loader)");
    if (n < 1 || k < 8 || k % 8 != 0)
      return invalid("fdpp_gemm_implb_candidates", "N must be >= 1 and K a positive multiple of 8");
    if (const char* why = codes_problem(epilogue, FDPP_FLOAT16)) return invalid("fdpp_gemm_implb_candidates", why);
    if (num_sms < 1 || max_smem < 1 || cc_major < 1)
      return invalid("fdpp_gemm_implb_candidates", "num_sms, max_smem and cc_major must be positive");
    constexpr int kMax = 512;
    g::ImplBConfig tmp[kMax];
    const bool silu = epilogue == FDPP_GEMM_EPILOGUE_SILU_MUL;
    // mma.sync configs up to M = 64, then the wgmma ones from M = 17 (above 64 only those).
    int total = m <= g::kImplBMaxM ? g::implb_candidates(n, k, silu, g::implb_batch_blocks(m, 8), num_sms, max_smem,
                                                         cc_major, tmp, kMax)
                                   : 0;
    if (m >= g::kImplBWgmmaMinM) {
      const int at = total < kMax ? total : kMax;
      total += g::wgmma_candidates(n, k, silu, num_sms, max_smem, cc_major, tmp + at, kMax - at);
    }
    for (int i = 0; i < total && i < cap && i < kMax; ++i) out[i] = from_config(tmp[i]);
    *count = total;
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_workspace_bytes(int64_t max_m, int64_t n, int32_t epilogue, int32_t dtype,
                                      const fdpp_gemm_plan* plan, size_t* bytes) {
  return fdpp::guarded("fdpp_gemm_workspace_bytes", [&] {
    if (bytes == nullptr) return invalid("fdpp_gemm_workspace_bytes", "bytes is NULL");
    if (max_m < 1 || n < 1) return invalid("fdpp_gemm_workspace_bytes", "max_m and N must be >= 1");
    if (const char* why = codes_problem(epilogue, dtype)) return invalid("fdpp_gemm_workspace_bytes", why);
    const auto ep = static_cast<g::Epilogue>(epilogue);
    const auto dt = static_cast<g::Dtype>(dtype);
    if (plan == nullptr) {
      *bytes = g::implc_workspace_bytes(max_m, n, ep, dt);
    } else {
      const g::Plan p = to_plan(*plan);
      if (const char* why = g::plan_problem(p)) return invalid("fdpp_gemm_workspace_bytes", why);
      *bytes = g::workspace_bytes(max_m, n, ep, dt, p);
    }
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_run(const fdpp_gemm_args* args, const fdpp_gemm_plan* plan, void* workspace,
                          size_t workspace_bytes, void* stream) {
  return fdpp::guarded("fdpp_gemm_run", [&] {
    g::Problem p;
    fdpp_status s = to_problem("fdpp_gemm_run", args, &p);
    if (s != FDPP_OK) return s;
    if (plan == nullptr) return invalid("fdpp_gemm_run", "plan is NULL (fdpp_gemm_default_plan makes one)");
    const g::Plan pl = to_plan(*plan);
    if (const char* why = g::plan_problem(pl)) return invalid("fdpp_gemm_run", why);
    const g::Impl impl = g::select_impl(p.m, pl);
    if ((impl == g::Impl::kCublasLt || impl == g::Impl::kCutlass) &&
        workspace_bytes < g::implc_workspace_bytes(p.m, p.n, p.epilogue, p.dtype))
      return invalid("fdpp_gemm_run", "workspace is smaller than fdpp_gemm_workspace_bytes(max_m >= M) asked for");
    return from_launch("fdpp_gemm_run", g::run_gemm(p, pl, impl, nullptr, 8, workspace, workspace_bytes,
                                                    static_cast<cudaStream_t>(stream)));
  });
}

fdpp_status fdpp_gemm_run_impl(const fdpp_gemm_args* args, int32_t impl, const fdpp_gemm_implb_config* implb_config,
                               int32_t pad_m, int32_t impla_split_k, void* workspace, size_t workspace_bytes,
                               void* stream) {
  return fdpp::guarded("fdpp_gemm_run_impl", [&] {
    const char* fn = "fdpp_gemm_run_impl";
    g::Problem p;
    fdpp_status s = to_problem(fn, args, &p);
    if (s != FDPP_OK) return s;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (impl) {
      case FDPP_GEMM_IMPLA:
        if (impla_split_k < 0 || impla_split_k > g::kMaxSplitK) return invalid(fn, "impla_split_k must be in 0..8");
        return from_launch(fn, g::launch_impla(p, impla_split_k, st));
      case FDPP_GEMM_IMPLB: {
        g::ImplBConfig config;
        if (implb_config) {
          config = to_config(*implb_config);
        } else {
          g::DeviceInfo dev;
          cudaError_t err = g::current_device_info(&dev);
          if (err != cudaSuccess) return fdpp::from_cuda(err, fn);
          config = g::default_implb_config(p.n, p.k, p.silu_mul(), dev.num_sms, dev.cc_major);
        }
        return from_launch(fn, g::launch_implb(p, config, pad_m > 0 ? pad_m : 8, st));
      }
      case FDPP_GEMM_IMPLC_CUBLASLT:
        return from_launch(fn, g::launch_implc_cublaslt(p, workspace, workspace_bytes, st));
      case FDPP_GEMM_IMPLC_CUTLASS: return from_launch(fn, g::launch_implc_cutlass(p, workspace, workspace_bytes, st));
      default: return invalid(fn, "impl must be 1 (ImplA), 2 (ImplB), 3 (cuBLASLt) or 4 (CUTLASS)");
    }
  });
}

fdpp_status fdpp_gemm_prepare(const fdpp_gemm_args* args, const fdpp_gemm_plan* plan) {
  return fdpp::guarded("fdpp_gemm_prepare", [&] {
    g::Problem p;
    fdpp_status s = to_problem("fdpp_gemm_prepare", args, &p);
    if (s != FDPP_OK) return s;
    if (plan != nullptr) {
      const g::Plan pl = to_plan(*plan);
      if (const char* why = g::plan_problem(pl)) return invalid("fdpp_gemm_prepare", why);
      if (g::select_impl(p.m, pl) != g::Impl::kCublasLt) return FDPP_OK;
    }
    return from_launch("fdpp_gemm_prepare", g::prepare_implc_cublaslt(p));
  });
}

fdpp_status fdpp_gemm_device_info(int32_t* num_sms, int32_t* cc_major, int32_t* cc_minor, int64_t* max_smem_optin) {
  return fdpp::guarded("fdpp_gemm_device_info", [&] {
    g::DeviceInfo dev;
    cudaError_t err = g::current_device_info(&dev);
    if (err != cudaSuccess) return fdpp::from_cuda(err, "fdpp_gemm_device_info");
    if (num_sms) *num_sms = dev.num_sms;
    if (cc_major) *cc_major = dev.cc_major;
    if (cc_minor) *cc_minor = dev.cc_minor;
    if (max_smem_optin) *max_smem_optin = dev.max_smem_optin;
    return FDPP_OK;
  });
}

fdpp_status fdpp_gemm_load_cublaslt(const char* path) {
  return fdpp::guarded("fdpp_gemm_load_cublaslt",
                       [&] { return from_launch("fdpp_gemm_load_cublaslt", fdpp::gemm::load_cublaslt(path)); });
}

int32_t fdpp_gemm_cublaslt_available(void) {
  try {
    return fdpp::gemm::cublaslt_available() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int32_t fdpp_gemm_cutlass_available(void) { return fdpp::gemm::cutlass_available() ? 1 : 0; }

// --- the portable kernels (portable_capi.h) -----------------------------------------------------------------------

fdpp_status fdpp_portable_gemm(const fdpp_gemm_args* args, void* stream) {
  return fdpp::guarded("fdpp_portable_gemm", [&] {
    const char* fn = "fdpp_portable_gemm";
    g::Problem p;
    if (fdpp_status s = to_problem(fn, args, &p)) return s;
    if (const char* why = fdpp::portable::gemm_problem(p))
      return fdpp::set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": " + why);
    return fdpp::from_cuda(fdpp::portable::gemm(p, static_cast<cudaStream_t>(stream)), fn);
  });
}

}  // extern "C"
