#include <string>

#include "capi/capi_errors.h"
#include "kernels/axpy.h"

namespace {
constexpr int kAbiVersion = 2;  // 2: fdpp_gemm_implb_config.loader
thread_local std::string t_last_error;
}  // namespace

namespace fdpp {

fdpp_status set_error(fdpp_status code, const std::string& msg) noexcept {
  try {
    t_last_error = msg;
  } catch (...) {
    // Out of memory while storing the message: keep the code, lose the text.
  }
  return code;
}

fdpp_status from_cuda(cudaError_t err, const char* where) noexcept {
  if (err == cudaSuccess) return FDPP_OK;
  return set_error(FDPP_ERR_CUDA, std::string(where) + ": " + cudaGetErrorString(err));
}

}  // namespace fdpp

extern "C" {

int fdpp_abi_version(void) { return kAbiVersion; }

const char* fdpp_last_error(void) { return t_last_error.c_str(); }

fdpp_status fdpp_axpy_f32(float a, const float* x, float* y, int64_t n, void* stream) {
  return fdpp::guarded("fdpp_axpy_f32", [&] {
    if (n < 0) return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, "fdpp_axpy_f32: n must be >= 0");
    if (n > 0 && (x == nullptr || y == nullptr))
      return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, "fdpp_axpy_f32: x and y must be device pointers");
    return fdpp::from_cuda(fdpp::launch_axpy_f32(a, x, y, n, static_cast<cudaStream_t>(stream)),
                           "fdpp_axpy_f32");
  });
}

}  // extern "C"
