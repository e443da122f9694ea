// Prefill kernels for __nv_bfloat16 (see attention_prefill.cuh).
#include "kernels/attention/attention_prefill_impl.cuh"

namespace fdpp {
namespace attn {
template cudaError_t launch_prefill<__nv_bfloat16>(const AttnArgs&, bool, cudaStream_t);
template cudaError_t prefill_sm90_available<__nv_bfloat16>(int, bool*);
}  // namespace attn
}  // namespace fdpp
