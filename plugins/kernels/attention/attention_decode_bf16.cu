// Split-KV decode kernels for __nv_bfloat16 (see attention_decode.cuh).
#include "kernels/attention/attention_decode_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_decode<__nv_bfloat16>(const AttnArgs&, bool, bool, cudaStream_t);
template cudaError_t decode_ctas_per_sm<__nv_bfloat16>(int, int*);
template cudaError_t decode_cluster_capacity<__nv_bfloat16>(int, int, int*);
}  // namespace attn
}  // namespace fdpp
