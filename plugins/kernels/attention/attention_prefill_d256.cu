// Prefill kernels at head_dim 256 for both element types: 64-row blocks on mma.sync (attention_prefill_impl.cuh,
// launch_prefill_dim), in their own file so that they compile in parallel with the 64/128 ones.
#include "kernels/attention/attention_prefill_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_prefill_dim<__half, 256>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t launch_prefill_dim<__nv_bfloat16, 256>(const AttnArgs&, bool, cudaStream_t);
}  // namespace attn
}  // namespace fdpp
