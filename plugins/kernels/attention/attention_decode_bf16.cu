// Split-KV decode kernels for __nv_bfloat16 at head_dim 64 and 128 (and 80, 96 inside 128; see attention_decode.cuh).
// The head_dim 256 kernels compile in attention_decode_d256.cu.
#include "kernels/attention/attention_decode_impl.cuh"

namespace fdpp {
namespace attn {
extern template cudaError_t launch_decode_dim<__nv_bfloat16, 256>(const AttnArgs&, bool, bool, cudaStream_t);
extern template cudaError_t decode_ctas_per_sm_dim<__nv_bfloat16, 256>(int*);
extern template cudaError_t decode_cluster_capacity_dim<__nv_bfloat16, 256>(int, int*);

template cudaError_t launch_decode<__nv_bfloat16>(const AttnArgs&, bool, bool, cudaStream_t);
template cudaError_t decode_ctas_per_sm<__nv_bfloat16>(int, int*);
template cudaError_t decode_cluster_capacity<__nv_bfloat16>(int, int, int*);
}  // namespace attn
}  // namespace fdpp
