// Helpers for the C ABI implementation files: record a message, turn a cudaError_t into a status.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "capi/fdpp_capi.h"

namespace fdpp {

// Stores msg as this thread's last error and returns code.
fdpp_status set_error(fdpp_status code, const std::string& msg) noexcept;

// FDPP_OK for cudaSuccess; otherwise records "<where>: <cuda message>" and returns FDPP_ERR_CUDA.
fdpp_status from_cuda(cudaError_t err, const char* where) noexcept;

// Runs body (a callable returning fdpp_status) and converts any escaping exception into FDPP_ERR_INTERNAL,
// so that no exception crosses the C ABI.
template <typename Body>
fdpp_status guarded(const char* where, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return set_error(FDPP_ERR_INTERNAL, std::string(where) + ": " + e.what());
  } catch (...) {
    return set_error(FDPP_ERR_INTERNAL, std::string(where) + ": unknown exception");
  }
}

}  // namespace fdpp
