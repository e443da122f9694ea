// The trivial kernel that proves the build and the C ABI end to end.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace fdpp {

// y[i] = a * x[i] + y[i]; returns the launch error, if any.
cudaError_t launch_axpy_f32(float a, const float* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace fdpp
