#include <string>

#include "capi/capi_errors.h"

namespace {
constexpr int kAbiVersion = 7;  // CHANGELOG.md lists what each version changed
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

}  // extern "C"
