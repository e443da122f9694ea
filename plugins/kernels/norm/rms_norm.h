// fdpp::RMSNorm on the GPU (plugins/RMSNormPlugin/contract.json): raw pointers and sizes in, cudaError_t out.
// Internal to plugins/; the C ABI (plugins/capi/norm_capi.h) validates before calling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fdpp {

enum class NormDtype : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };  // the fdpp_dtype codes

// Channels per row the kernel handles: each thread keeps its 16-byte vectors in registers between the sum of
// squares and the scaling, 512 threads x 4 vectors x 8 halves = 16384.
constexpr int kRmsNormMaxHidden = 16384;
constexpr int kRmsNormAlign = 8;  // hidden must be a multiple of 8 (a 16-byte vector of float16)

struct RmsNormParams {
  NormDtype dtype = NormDtype::kFloat16;
  int hidden = 0;    // H, a multiple of kRmsNormAlign, at most kRmsNormMaxHidden
  int64_t rows = 0;  // product of the leading dimensions, < 2^31
  float epsilon = 0.f;
  const void* x = nullptr;
  int64_t x_row_stride = 0;      // elements between rows (>= hidden, 16-byte steps)
  const void* weight = nullptr;  // [hidden]
  void* y = nullptr;
  int64_t y_row_stride = 0;  // may equal x (in place)
};

// y = to_dtype(to_dtype(x / sqrt(mean(x^2) + epsilon)) * weight), one CTA per row. Never synchronizes.
// On sm_90a it launches with programmatic dependent launch and loads the weight before waiting for the previous
// kernel (which writes x): the weight must be constant while the kernels run, the GEMMs' rule (gemm.h, Problem::pdl).
cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace fdpp
