// Split-KV decode kernels at head_dim 256 for both element types (their own file: they compile in parallel with the
// 64/128 ones in attention_decode_f16.cu and _bf16.cu).
#include "kernels/attention/attention_decode_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_decode_dim<__half, 256>(const AttnArgs&, bool, bool, cudaStream_t);
template cudaError_t decode_ctas_per_sm_dim<__half, 256>(int*);
template cudaError_t decode_cluster_capacity_dim<__half, 256>(int, int*);
template cudaError_t launch_decode_dim<__nv_bfloat16, 256>(const AttnArgs&, bool, bool, cudaStream_t);
template cudaError_t decode_ctas_per_sm_dim<__nv_bfloat16, 256>(int*);
template cudaError_t decode_cluster_capacity_dim<__nv_bfloat16, 256>(int, int*);
}  // namespace attn
}  // namespace fdpp
