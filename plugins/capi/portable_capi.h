// C ABI of the portable kernels (plugins/kernels/portable/: one source for NVIDIA and AMD GPUs). Conventions:
// plugins/capi/fdpp_capi.h. The launches take the same argument structs as fdpp_attention_forward and
// fdpp_gemm_run_impl, so the H200 tests and benchmarks run the portable source beside the Hopper kernels.
//
// Where each function is: the pure host ones in both libraries (libfdpp_plugins.so and, -DFDPP_HIP=ON,
// libfdpp_plugins_hip.so); the launches in libfdpp_plugins.so (on AMD the MIGraphX adapter calls the kernels).
#pragma once

#include "capi/attention_capi.h"
#include "capi/gemm_capi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Lanes per warp the library's portable kernels are built for: 32 (CUDA library) or 64 (HIP library, CDNA).
FDPP_API int fdpp_portable_warp_size(void);

// The decode split heuristic (plugins/kernels/portable/portable_heuristics.h): rows = batch x query heads x query
// tokens, kv_len = keys of the longest row, cus = the GPU's compute units (SMs). Returns >= 1.
FDPP_API int fdpp_portable_decode_splits(int64_t rows, int64_t kv_len, int32_t cus);

// The GEMM plan (portable_heuristics.h) for m rows against n weight rows (silu_mul: n = gate + up rows) on a GPU of
// `cus` compute units with warps of warp_size lanes: *kernel = 1 GEMV or 2 flat GEMM, *m_tile = the padded rows,
// *pairs_per_warp (flat: 1 or 2; GEMV: 1), *k_chunk = K elements the flat GEMM stages per step. Any output pointer
// may be NULL. FDPP_ERR_UNSUPPORTED for m > 16.
FDPP_API fdpp_status fdpp_portable_gemm_plan(int64_t m, int64_t n, int32_t epilogue, int32_t cus, int32_t warp_size,
                                             int32_t* kernel, int32_t* m_tile, int32_t* pairs_per_warp,
                                             int32_t* k_chunk);

// Workspace fdpp_portable_attention_decode needs (0 with one split); reads the device's compute-unit count.
FDPP_API fdpp_status fdpp_portable_attention_workspace_bytes(const fdpp_attention_args* args, size_t* bytes);

// out = attention(args) with the portable kernels: every mask mode, any seq, both softmax modes (unified with the
// exact fallback); args->kernel, prefill_config, decode_combine, pdl and combine_counters are ignored (past the
// shared checks: decode_combine 3 without combine_counters is refused). counters NULL: the library's own
// (fdpp_attention_read_counters). Never synchronizes.
FDPP_API fdpp_status fdpp_portable_attention_decode(const fdpp_attention_args* args, void* workspace,
                                                    size_t workspace_bytes, void* stream);

// Y = epilogue(X W^T (+ bias)) (+ residual) with the portable GEMV / flat GEMM, 1 <= M <= 16 (args->pdl ignored).
FDPP_API fdpp_status fdpp_portable_gemm(const fdpp_gemm_args* args, void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif
