// Host side of the GEMM: device facts, problem validation, and run_gemm -- the heuristic dataflow's run-time
// half, a table lookup (select_impl) and a call, never a measurement.
#include <mutex>
#include <string>

#include "kernels/gemm/gemm.h"

namespace fdpp {
namespace gemm {
namespace {

thread_local std::string t_detail;

constexpr int kMaxDevices = 64;

}  // namespace

const char* last_detail() { return t_detail.c_str(); }

void set_detail(const char* msg) {
  try {
    t_detail = msg ? msg : "";
  } catch (...) {
    // Out of memory storing a message: the status code still tells the caller what happened.
  }
}

cudaError_t current_device_info(DeviceInfo* out) {
  static std::mutex mu;
  static DeviceInfo cache[kMaxDevices];
  static bool have[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mu);
  if (!have[device]) {
    DeviceInfo info;
    info.device = device;
    int value = 0;
    if ((err = cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
    info.num_sms = value;
    if ((err = cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) return err;
    info.cc_major = value;
    if ((err = cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMinor, device)) != cudaSuccess) return err;
    info.cc_minor = value;
    if ((err = cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) != cudaSuccess)
      return err;
    info.max_smem_optin = value;
    cache[device] = info;
    have[device] = true;
  }
  *out = cache[device];
  return cudaSuccess;
}

const char* problem_problem(const Problem& p) {
  if (p.m < 1) return "M (the product of X's leading dimensions) must be >= 1";
  if (p.n < 1 || p.k < 1) return "N and K must be >= 1";
  if (p.n > (int64_t(1) << 30) || p.k > (int64_t(1) << 30) || p.m > (int64_t(1) << 30))
    return "M, N and K must each be below 2^30";
  if (p.m * p.k > (int64_t(1) << 31) - 1 || p.n * p.k > (int64_t(1) << 31) - 1)
    return "X and W must each have fewer than 2^31 elements";
  if (p.k % 8 != 0) return "K must be a multiple of 8 (the kernels load 16 bytes = 8 elements at a time)";
  if (p.dtype != Dtype::kFloat16 && p.dtype != Dtype::kBFloat16) return "dtype must be float16 or bfloat16";
  if (p.epilogue != Epilogue::kNone && p.epilogue != Epilogue::kSiluMul) return "epilogue must be none or silu_mul";
  if (p.silu_mul() && p.n % 2 != 0) return "silu_mul needs an even N (gate rows then up rows)";
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) return "x, w and y must be device pointers";
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w) % 16 != 0)
    return "x and w must be 16-byte aligned";
  const uintptr_t two_byte_mask = 1;
  if ((reinterpret_cast<uintptr_t>(p.y) & two_byte_mask) || (reinterpret_cast<uintptr_t>(p.bias) & two_byte_mask) ||
      (reinterpret_cast<uintptr_t>(p.residual) & two_byte_mask))
    return "y, bias and residual must be 2-byte aligned";
  return nullptr;
}

size_t workspace_bytes(int64_t max_m, int64_t n, Epilogue epilogue, Dtype dtype, const Plan& plan) {
  // ImplC is reached below max_m unless select_impl keeps every M up to it off ImplC (all of whose caps are at
  // most 256, so at most 256 rows to look at; a gap between the ranges counts).
  bool reached = max_m > kImplBWgmmaMaxM;
  for (int64_t m = 1; m <= max_m && !reached; ++m) {
    const Impl impl = select_impl(m, plan);
    reached = impl == Impl::kCublasLt || impl == Impl::kCutlass;
  }
  if (!reached) return 0;
  return implc_workspace_bytes(max_m, n, epilogue, dtype);
}

cudaError_t run_gemm(const Problem& p, const Plan& plan, Impl impl, const ImplBConfig* config, int pad_m,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (impl == Impl::kAuto) impl = select_impl(p.m, plan);
  switch (impl) {
    case Impl::kA: return launch_impla(p, 0, stream);
    case Impl::kB:
      return launch_implb(p, config ? *config : plan_implb_config(p.m, plan), pad_m > 0 ? pad_m : 8, stream);
    case Impl::kCublasLt:  // where libcublasLt cannot be loaded: cudaErrorNotSupported, naming what to do
      return launch_implc_cublaslt(p, workspace, workspace_bytes, stream);
    case Impl::kCutlass: return launch_implc_cutlass(p, workspace, workspace_bytes, stream);
    default: set_detail("unknown GEMM implementation id"); return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace fdpp
