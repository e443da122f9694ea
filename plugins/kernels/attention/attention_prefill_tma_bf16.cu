// Prefill tile shape 5 (the TMA wgmma kernel, attention_prefill_sm90_tma.cuh) for __nv_bfloat16
// at head_dim 64 and 128 (80 and 96 inside 128): four kernels (two head dims x two softmax variants), in their own file
// so that they compile in parallel with the other prefill kernels.
#include "kernels/attention/attention_prefill_sm90_tma.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_prefill_tma<__nv_bfloat16>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t prefill_tma_available<__nv_bfloat16>(int, bool*);
}  // namespace attn
}  // namespace fdpp
