// C ABI of fdpp::RMSNorm (plugins/RMSNormPlugin/contract.json). Conventions: plugins/capi/fdpp_capi.h.
#pragma once

#include "capi/fdpp_capi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bump when fdpp_rms_norm_args changes (checked against sizeof by the Python side).
#define FDPP_NORM_ABI 1

// y = to_dtype(to_dtype(x / sqrt(mean(x^2) + epsilon)) * weight) over rows of `hidden` channels. hidden a multiple
// of 8, at most 16384; x, weight and y 16-byte aligned; row strides in elements (0: hidden), multiples of 16
// bytes; y may be x (in place).
typedef struct fdpp_rms_norm_args {
  int32_t dtype;   // fdpp_dtype
  int32_t hidden;  // H
  int64_t rows;    // product of the leading dimensions
  float epsilon;
  const void* x;
  int64_t x_row_stride;
  const void* weight;  // [hidden], x's dtype; constant while kernels run (read before the PDL wait, so no
                       // kernel still running may write it)
  void* y;
  int64_t y_row_stride;
} fdpp_rms_norm_args;

FDPP_API int fdpp_rms_norm_args_size(void);

// One launch on `stream` (a cudaStream_t; NULL = the legacy default stream). Never synchronizes or allocates.
FDPP_API fdpp_status fdpp_rms_norm(const fdpp_rms_norm_args* args, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif
