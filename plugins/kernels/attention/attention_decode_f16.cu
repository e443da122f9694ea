// Split-KV decode kernels for __half (see attention_decode.cuh).
#include "kernels/attention/attention_decode_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_decode<__half>(const AttnArgs&, bool, bool, cudaStream_t);
template cudaError_t decode_ctas_per_sm<__half>(int, int*);
template cudaError_t decode_cluster_capacity<__half>(int, int, int*);
}  // namespace attn
}  // namespace fdpp
