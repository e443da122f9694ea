// The MIGraphX adapter's C entry points (libfdpp_migraphx.so: cmake -DFDPP_HIP=ON -DMIGraphX_INCLUDE_DIR=...).
//
// Each call registers one MIGraphX custom op (migraphx::experimental_custom_op_base) for one attribute set and
// writes its name to name_out, e.g. "fdpp::AsyncSoftmaxAttention.1". MIGraphX's custom ops carry no attributes of
// their own, so every distinct set is its own op; registering the same set twice returns the same name.
// MIGraphX's ONNX parser does not map unknown node types, so the ops are inserted after parsing: a caller builds
// or edits the program's module (module.add_instruction(migraphx.op(name), inputs)), see docs/amd.md.
//
//   fdpp::AsyncSoftmaxAttention  inputs: query [B, Hq, S, D], key and value [B, Hkv, L, D], past_len int64 [B],
//                                a workspace allocation (any size: the decode uses as many splits as it holds,
//                                one with none), the output allocation [B, Hq, S, D]. mask_mode past_len.
//   fdpp::FlatGemm               inputs: x [..., K] with M = its rows <= 16, w [N, K], then bias [N] and
//                                residual [..., n_out] when registered with them, the output allocation.
//                                One portable kernel serves every M: the node's plan attributes (m1, m2,
//                                m3, implb_*, implb_wgmma_*; the sm_90-only loaders) are not read.
// Both run on the offload target (inputs in GPU memory) on the context's hipStream_t, through the portable kernels.
#pragma once

#include "capi/fdpp_capi.h"

#ifdef __cplusplus
extern "C" {
#endif

// softmax_mode: 0 unified (with the exact fallback), 1 synchronized. Attribute ranges: the op contract's
// (plugins/AsyncSoftmaxAttentionPlugin/contract.json).
FDPP_API fdpp_status fdpp_migraphx_register_attention(float scale, float phi, float guard_lo, float guard_hi,
                                                      int32_t softmax_mode, char* name_out, size_t name_capacity);

// epilogue: 0 none, 1 silu_mul (w = [gate rows; up rows]); has_bias / has_residual: 0 or 1.
FDPP_API fdpp_status fdpp_migraphx_register_flat_gemm(int32_t epilogue, int32_t has_bias, int32_t has_residual,
                                                      char* name_out, size_t name_capacity);

#ifdef __cplusplus
}  // extern "C"
#endif
