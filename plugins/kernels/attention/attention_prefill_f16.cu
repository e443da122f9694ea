// Prefill kernels for __half (see attention_prefill.cuh).
#include "kernels/attention/attention_prefill_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_prefill<__half>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t prefill_sm90_available<__half>(int, bool*);
}  // namespace attn
}  // namespace fdpp
