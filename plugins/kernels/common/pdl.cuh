// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream serialization may become
// resident while the kernel before it in the stream is still running. The rule every fdpp kernel keeps: nothing it
// reads or writes that another kernel may touch is accessed before wait_for_primary() (which returns once the
// previous grid has completed and its memory is visible), and launch_dependents() lets the next grid start early.
// Both are no-ops in code compiled for older targets, which is why launches ask for PDL only where the sm_90a code
// runs (runs_sm90a_code).
#pragma once

#include <cuda_runtime_api.h>

namespace fdpp {
namespace pdl {

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether the current device runs this library's sm_90a code (compute capability 9.x), where the griddepcontrol
// instructions above exist; elsewhere the compute_80 PTX runs without them and a PDL launch would race. Cached per
// device after the first query (host attribute reads only: safe to call while a CUDA graph is being captured).
cudaError_t runs_sm90a_code(bool* yes);

// kernel<<<grid, block, 0, stream>>>(args...), with programmatic stream serialization when `pdl`.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cfg.attrs = pdl ? &attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace pdl
}  // namespace fdpp
