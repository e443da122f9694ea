// Only on the include path of the HIP build (cmake/fdpp_hip.cmake): lets the shared parameter headers
// (attention_params.h, gemm.h) and the C ABI's error helpers, which name the CUDA runtime's two types, compile
// with hipcc unchanged. Nothing else of CUDA is mapped: the portable kernels use fdpp_portable.h.
#pragma once

#include <hip/hip_runtime_api.h>

using cudaError_t = hipError_t;
using cudaStream_t = hipStream_t;
constexpr hipError_t cudaSuccess = hipSuccess;
inline const char* cudaGetErrorString(hipError_t err) { return hipGetErrorString(err); }
