// Prefill kernels for __nv_bfloat16 at head_dim 64 and 128 (and 80, 96 inside 128; see attention_prefill.cuh). The
// head_dim 256 kernels compile in attention_prefill_d256.cu.
#include "kernels/attention/attention_prefill_impl.cuh"

namespace fdpp {
namespace attn {
extern template cudaError_t launch_prefill_dim<__nv_bfloat16, 256>(const AttnArgs&, bool, cudaStream_t);

template cudaError_t launch_prefill<__nv_bfloat16>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t prefill_sm90_available<__nv_bfloat16>(int, bool*);
}  // namespace attn
}  // namespace fdpp
