// C ABI of the flat GEMM (fdpp::FlatGemm): Y = epilogue(X W^T (+ bias)) (+ residual).
// Conventions as in fdpp_capi.h: fdpp_status return, fdpp_last_error() for the message, no sync/alloc/host
// copies in a launch (CUDA-graph capturable), workspace sized by a query.
#pragma once

#include "capi/fdpp_capi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fdpp_gemm_impl {
  FDPP_GEMM_AUTO = 0,            // by the plan: ImplA if M <= m1, ImplB if M <= m2 or M <= m3, else plan.implc
  FDPP_GEMM_IMPLA = 1,           // GEMV on CUDA cores, M <= 8
  FDPP_GEMM_IMPLB = 2,           // flat GEMM on tensor cores (batch padded to 8), M <= 64 (256: loader 4)
  FDPP_GEMM_IMPLC_CUBLASLT = 3,  // cuBLASLt (dlopen'ed: a path given to fdpp_gemm_load_cublaslt, or by soname)
  FDPP_GEMM_IMPLC_CUTLASS = 4    // CUTLASS 2.x tensor-op GEMM, 64x128 tiles
} fdpp_gemm_impl;

typedef enum fdpp_gemm_epilogue {
  FDPP_GEMM_EPILOGUE_NONE = 0,
  FDPP_GEMM_EPILOGUE_SILU_MUL = 1  // W = [gate rows; up rows] ([2I, K]); Y [M, I] = silu(gate) * up
} fdpp_gemm_epilogue;

// ImplB tile configuration (see plugins/kernels/gemm/gemm_heuristics.h for the meaning and valid values).
typedef struct fdpp_gemm_implb_config {
  int32_t n_tile;      // 16, 32, 64
  int32_t k_tile;      // k_tile / (4 / (n_tile / 16)) in {32, 64, 128, 256}, or 1024 (16-row x 1024 pipelines)
  int32_t stages;      // 1..8 (1 = no overlap of loads and math)
  int32_t split_k;     // 1..8 CTAs of a cluster along K (> 1 needs sm_90)
  int32_t loader;      // k_tile 1024 configs: 0 = TMA (sm_90), 1 = rows, 2 = rows1, 3 = pair (sm_90); ignored below,
                       // except 4 = wgmma (sm_90a, n_tile 64, k_tile 64, stages 2..8, M <= 256)
  int32_t row_blocks;  // 16-row weight blocks per warp below k_tile 1024: 0 = the rule (2 from M = 9 where it
                       // fits), 1 = one
} fdpp_gemm_implb_config;

// One (N, K, dtype)'s dispatch table, as profiled (ABI version 7 added m3 and wgmma).
typedef struct fdpp_gemm_plan {
  int32_t m1;  // ImplA for M <= m1 (0: never); ImplA itself stops at M = 8
  int32_t m2;  // ImplB with implb for m1 < M <= m2 (>= m1); implb itself stops at M = 64 (256 with loader 4)
  fdpp_gemm_implb_config implb;
  int32_t implc;  // FDPP_GEMM_IMPLC_CUBLASLT or FDPP_GEMM_IMPLC_CUTLASS
  int32_t m3;     // ImplB with wgmma for m2 < M <= m3: 0 or m2 for none (wgmma then unread); else m2 <= 64 and
                  // m3 <= 256
  fdpp_gemm_implb_config wgmma;  // the third range's config: loader 4 (wgmma)
} fdpp_gemm_plan;

typedef struct fdpp_gemm_args {
  const void* x;         // [m, k], 16-byte aligned
  const void* w;         // [n, k], 16-byte aligned
  const void* bias;      // [n] or NULL
  const void* residual;  // [m, n_out] or NULL (n_out = n, or n / 2 for silu_mul)
  void* y;               // [m, n_out]
  int64_t m;
  int64_t n;
  int64_t k;         // multiple of 8
  int32_t dtype;     // FDPP_FLOAT16 or FDPP_BFLOAT16
  int32_t epilogue;  // fdpp_gemm_epilogue
  int32_t pdl;       // fdpp_pdl for ImplA/ImplB: AUTO (0) unless W is written on the GPU by a kernel that may
                     // still run when the GEMM starts (plugins/kernels/gemm/gemm.h, Problem::pdl)
} fdpp_gemm_args;

// The plan used when a shape has no profile, for this device (num_sms, cc_major > 0) or the given ones.
FDPP_API fdpp_status fdpp_gemm_default_plan(int64_t n, int64_t k, int32_t epilogue, int32_t num_sms, int32_t cc_major,
                                            fdpp_gemm_plan* out);

// Which implementation the plan picks for m rows (pure host logic).
FDPP_API fdpp_status fdpp_gemm_select(int64_t m, const fdpp_gemm_plan* plan, int32_t* impl_out);

// Which of the plan's ImplB configs serves m rows: *range_out 0 when ImplB does not (ImplA or ImplC), 1 for
// plan->implb (m1 < M <= m2), 2 for plan->wgmma (m2 < M <= m3). Pure host logic.
FDPP_API fdpp_status fdpp_gemm_select_implb_config(int64_t m, const fdpp_gemm_plan* plan, int32_t* range_out);

// FDPP_OK if the ImplB config can run (m rows, pad 8, on a device with max_smem bytes and compute capability
// cc_major); otherwise FDPP_ERR_INVALID_ARGUMENT with the reason in fdpp_last_error().
FDPP_API fdpp_status fdpp_gemm_check_implb_config(const fdpp_gemm_implb_config* config, int64_t m, int64_t k,
                                                  int64_t max_smem, int32_t cc_major);

// ImplB configs the profiler sweeps for a shape and batch size (1..256): the mma.sync ones up to M = 64, then
// the wgmma ones (loader 4) from M = 17; writes up to cap, *count gets the total.
FDPP_API fdpp_status fdpp_gemm_implb_candidates(int64_t n, int64_t k, int32_t epilogue, int64_t m, int32_t num_sms,
                                                int64_t max_smem, int32_t cc_major, fdpp_gemm_implb_config* out,
                                                int32_t cap, int32_t* count);

// Workspace bytes fdpp_gemm_run needs for any M <= max_m under plan (plan NULL: any implementation, the
// profiler's case).
FDPP_API fdpp_status fdpp_gemm_workspace_bytes(int64_t max_m, int64_t n, int32_t epilogue, int32_t dtype,
                                               const fdpp_gemm_plan* plan, size_t* bytes);

// Y = ... through the plan's choice for args->m.
FDPP_API fdpp_status fdpp_gemm_run(const fdpp_gemm_args* args, const fdpp_gemm_plan* plan, void* workspace,
                                   size_t workspace_bytes, void* stream);

// One implementation by id (profiling, tests, ablations). implb_config: NULL for the default config; pad_m:
// 0 or 8 (the paper); 16 or 64, the padding ablation, only in a library built with FDPP_BENCH_ABLATIONS=ON
// (else FDPP_ERR_UNSUPPORTED). impla_split_k: 0 for the heuristic.
FDPP_API fdpp_status fdpp_gemm_run_impl(const fdpp_gemm_args* args, int32_t impl,
                                        const fdpp_gemm_implb_config* implb_config, int32_t pad_m,
                                        int32_t impla_split_k, void* workspace, size_t workspace_bytes, void* stream);

// Builds the host-side cuBLASLt plan for args (no GPU work), so a later call inside graph capture does no
// heuristic query. A no-op for the other implementations.
FDPP_API fdpp_status fdpp_gemm_prepare(const fdpp_gemm_args* args, const fdpp_gemm_plan* plan);

// Facts about the current device the heuristics use (host queries only, cached).
FDPP_API fdpp_status fdpp_gemm_device_info(int32_t* num_sms, int32_t* cc_major, int32_t* cc_minor,
                                           int64_t* max_smem_optin);

// Loads libcublasLt from `path` (NULL: the dynamic linker's search by soname) unless one is
// loaded already; call it before the first cuBLASLt GEMM. FDPP_ERR_UNSUPPORTED when it cannot be loaded.
FDPP_API fdpp_status fdpp_gemm_load_cublaslt(const char* path);

// 1 if ImplC through cuBLASLt / CUTLASS is usable in this process, else 0 (the first loads libcublasLt as
// fdpp_gemm_load_cublaslt(NULL) does, if nothing is loaded yet).
FDPP_API int32_t fdpp_gemm_cublaslt_available(void);
FDPP_API int32_t fdpp_gemm_cutlass_available(void);

#ifdef __cplusplus
}  // extern "C"
#endif
