// Launchers of prefill tile shape 5 (the TMA wgmma kernel, attention_prefill_sm90_tma.cuh), instantiated per
// element type in attention_prefill_tma_f16.cu / _bf16.cu; called by attention_forward (attention_launch.cu).
#pragma once

#include <cuda_runtime_api.h>

namespace fdpp {
namespace attn {

struct AttnArgs;

// Runs shape 5 for head_dim 64 or 128 (cudaErrorNotSupported for 256, off sm_90a code, or for K/V layouts the
// tensor maps cannot describe; 80 and 96 are refused by the argument checks: prefill_shape_takes).
template <typename T>
cudaError_t launch_prefill_tma(const AttnArgs& a, bool unified, cudaStream_t stream);

// Whether shape 5 runs here: the loaded binary holds its sm_90a code (host query, cached per device).
template <typename T>
cudaError_t prefill_tma_available(int head_dim, bool* available);

}  // namespace attn
}  // namespace fdpp
