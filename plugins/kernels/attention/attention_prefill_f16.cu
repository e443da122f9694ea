// Prefill kernels for __half at head_dim 64 and 128 (and 80, 96 inside 128; see attention_prefill.cuh). The
// head_dim 256 kernels compile in attention_prefill_d256.cu.
#include "kernels/attention/attention_prefill_impl.cuh"

namespace fdpp {
namespace attn {
extern template cudaError_t launch_prefill_dim<__half, 256>(const AttnArgs&, bool, cudaStream_t);

template cudaError_t launch_prefill<__half>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t prefill_sm90_available<__half>(int, bool*);
}  // namespace attn
}  // namespace fdpp
