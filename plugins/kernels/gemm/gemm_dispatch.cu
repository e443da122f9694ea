// Host side of the GEMM: device facts, problem validation, and run_gemm -- the heuristic dataflow's run-time
// half, a table lookup (select_impl) and a call, never a measurement.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/gemm.h"

namespace fdpp {
namespace gemm {
namespace {

thread_local std::string t_detail;

// -1: not decided yet (decided on first use from the environment and the device).
std::atomic<int> g_pdl{-1};

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

bool pdl_enabled() {
  int value = g_pdl.load();
  if (value < 0) {
    const char* env = std::getenv("FDPP_GEMM_PDL");
    DeviceInfo dev;
    const bool supported = current_device_info(&dev) == cudaSuccess && hopper_paths(dev.cc_major);
    // On by default where supported: in a decode step's graph of back-to-back GEMMs it measured 10 to 20%
    // faster per ImplB GEMM (docs/notes-gemm.md, run 5). FDPP_GEMM_PDL=0 turns it off (an A/B switch).
    value = supported && !(env && std::strcmp(env, "0") == 0) ? 1 : 0;
    int expected = -1;
    g_pdl.compare_exchange_strong(expected, value);
    value = g_pdl.load();
  }
  return value == 1;
}

void set_pdl_enabled(bool enabled) {
  if (enabled) {
    DeviceInfo dev;
    enabled = current_device_info(&dev) == cudaSuccess && hopper_paths(dev.cc_major);
  }
  g_pdl.store(enabled ? 1 : 0);
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
  const int64_t last_non_c = plan.m2 < kImplBMaxM ? plan.m2 : kImplBMaxM;
  if (max_m <= last_non_c && max_m <= kImplBMaxM) return 0;
  return implc_workspace_bytes(max_m, n, epilogue, dtype);
}

cudaError_t run_gemm(const Problem& p, const Plan& plan, Impl impl, const ImplBConfig* config, int pad_m,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (impl == Impl::kAuto) impl = select_impl(p.m, plan);
  switch (impl) {
    case Impl::kA:
      return launch_impla(p, 0, stream);
    case Impl::kB:
      return launch_implb(p, config ? *config : plan.implb, pad_m > 0 ? pad_m : 8, stream);
    case Impl::kCublasLt:
      // A plan made where cuBLASLt was present, run where it is not (a TensorRT deployment without
      // nvidia-cublas): CUTLASS computes the same product, only slower.
      if (!cublaslt_available() && cutlass_available())
        return launch_implc_cutlass(p, workspace, workspace_bytes, stream);
      return launch_implc_cublaslt(p, workspace, workspace_bytes, stream);
    case Impl::kCutlass:
      return launch_implc_cutlass(p, workspace, workspace_bytes, stream);
    default:
      set_detail("unknown GEMM implementation id");
      return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace fdpp
