// Flat GEMM for LLM linear layers: Y[M, n_out] = epilogue(X[M, K] W[N, K]^T (+ bias)) (+ residual).
//
// Three implementations (FlashDecoding++ section 5), each a launcher that takes the problem, a caller-provided
// workspace and a stream and returns cudaError_t. None synchronizes, allocates or copies from the host, so
// every one can be captured in a CUDA graph.
//   ImplA  GEMV on CUDA cores (gemm_impla.cu), M <= 8
//   ImplB  flat GEMM on tensor cores, batch padded to 8 on the MMA's N side, M <= 64: a cp.async pipeline
//          (gemm_implb.cu) or, for k_tile 1024 configs at M <= 16, a TMA one (gemm_implb_bulk.cu, sm_90) or a
//          row-streaming cp.async one (gemm_implb_stream.cu), by the config's loader; with the wgmma loader,
//          M <= 256 on warpgroup MMAs, the batch on their N side (gemm_implb_wgmma.cu, sm_90a)
//   ImplC  cuBLASLt, loaded at run time (gemm_implc_cublaslt.cu), or CUTLASS 2.x (gemm_implc_cutlass.cu)
// run_gemm() (gemm_dispatch.cu) picks one by the plan in gemm_heuristics.h.
//
// Layouts: X [M, K], W [N, K], residual and Y [M, n_out], all row-major and contiguous; bias [N].
// Epilogue kSiluMul: W holds the gate rows [0, N/2) then the up rows [N/2, N); Y[m, i] =
// silu(gate[m, i] + bias[i]) * (up[m, i] + bias[N/2 + i]) (+ residual[m, i]); n_out = N/2.
// Accumulation is fp32; the result is rounded once to the output dtype.
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/gemm/gemm_heuristics.h"

namespace fdpp {
namespace gemm {

enum class Dtype : int32_t { kFloat16 = 0, kBFloat16 = 1 };  // = fdpp_dtype values
enum class Epilogue : int32_t { kNone = 0, kSiluMul = 1 };

struct Problem {
  const void* x = nullptr;         // [m, k]
  const void* w = nullptr;         // [n, k]
  const void* bias = nullptr;      // [n] or null
  const void* residual = nullptr;  // [m, n_out] or null
  void* y = nullptr;               // [m, n_out]
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Dtype dtype = Dtype::kFloat16;
  Epilogue epilogue = Epilogue::kNone;
  // Programmatic dependent launch of ImplA/ImplB where the GPU runs the library's sm_90a code (hopper_paths):
  // the kernel lets the next one start early and streams its weights before waiting for the previous kernel's
  // output (griddepcontrol). Speed only, on one condition: W is constant while GEMMs run. The kernels read nothing
  // but W before the wait, and the TMA ImplB's producer reads all of W without ever waiting; as every kernel lets
  // its successor start at its top, that read may overlap any earlier kernel still running. A W written on the GPU
  // (dequantized, refitted) must be written by a kernel that completed before the GEMMs were launched, or pdl off.
  bool pdl = true;

  int64_t n_out() const { return epilogue == Epilogue::kSiluMul ? n / 2 : n; }
  bool silu_mul() const { return epilogue == Epilogue::kSiluMul; }
};

// What the launchers need to know about the current device; cached per device, host queries only.
struct DeviceInfo {
  int device = 0;
  int num_sms = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int64_t max_smem_optin = 0;  // bytes of dynamic shared memory one block may opt in to
};
cudaError_t current_device_info(DeviceInfo* out);

// Why a problem cannot run on any implementation (null pointers, sizes, alignment), or nullptr.
const char* problem_problem(const Problem& p);

// The message behind the last non-CUDA failure of a launcher on this thread (cuBLASLt missing, a config that
// does not fit), for the C ABI to report; "" if none.
const char* last_detail();
void set_detail(const char* msg);

// ImplA: M <= 8. split_k from impla_split_k() unless split_k > 0 is given.
cudaError_t launch_impla(const Problem& p, int split_k, cudaStream_t stream);

// ImplB: M <= 64 (a wgmma config, loader 4: M <= 256, pad_m 8, launch_implb_wgmma). pad_m is 8 (the paper's choice); 16
// and 64 run the same kernel on more zero rows, the padding ablation, in FDPP_BENCH_ABLATIONS builds only (elsewhere
// cudaErrorNotSupported). When M's batch rows make the warp-tiled kernel's config.stages too deep for shared memory,
// fewer stages (at least 2) are used. A k_tile 1024 config (implb_is_bulk) runs gemm_implb_bulk.cu (loader TMA: sm_90,
// K % 64 == 0), gemm_implb_stream.cu (loaders rows and rows1) or gemm_implb_pair.cu (loader pair: sm_90), all M <= 16;
// where it cannot run, the launch fails with cudaErrorInvalidValue and the reason in last_detail().
cudaError_t launch_implb(const Problem& p, const ImplBConfig& config, int pad_m, cudaStream_t stream);
// Raises a kernel's dynamic shared memory limit to `bytes` (never lowers it), once per (kernel, device) and size;
// thread-safe. A no-op up to 48 KB.
cudaError_t ensure_dynamic_smem(const void* kernel, int device, int64_t bytes);
// The TMA kernel itself, for batch_blocks (1 or 2) blocks of 8 rows.
cudaError_t launch_implb_bulk(const Problem& p, const ImplBConfig& config, int batch_blocks, cudaStream_t stream);
// The row-streaming cp.async kernel (gemm_implb_stream.cu), for batch_blocks (1 or 2) blocks of 8 rows; the first
// and the second half of its grid issue lead_first and lead_second units' weights before the PDL wait.
cudaError_t launch_implb_stream(const Problem& p, int stages, int lead_first, int lead_second, int batch_blocks,
                                cudaStream_t stream);
// The cluster-pair kernel (gemm_implb_pair.cu, loader pair): M <= 16, clusters of two CTAs on one 32-row block.
cudaError_t launch_implb_pair(const Problem& p, int stages, cudaStream_t stream);
// The warpgroup-MMA kernel (gemm_implb_wgmma.cu, loader wgmma): M <= 256, sm_90a, the config's stages (fewer where
// M's batch tile leaves no room) and split_k (a cluster along K, reduced in distributed shared memory).
cudaError_t launch_implb_wgmma(const Problem& p, const ImplBConfig& config, cudaStream_t stream);
// CTAs of a kernel of `threads` threads resident per SM with this dynamic shared memory (host query, cached per
// kernel and size; at least 1).
int resident_ctas_per_sm(const void* kernel, int device, int64_t smem, int threads = 128);

// ImplC through cuBLASLt. Workspace: implc_workspace_bytes(). Returns cudaErrorNotSupported (with a detail
// message) when libcublasLt cannot be loaded.
cudaError_t launch_implc_cublaslt(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Whether libcublasLt is loaded, loading it on first use from $FDPP_CUBLASLT_LIBRARY or by soname.
bool cublaslt_available();
// Loads libcublasLt from `path` (null or "": as cublaslt_available does) unless a library is loaded already.
// cudaErrorNotSupported with a detail message when it cannot be loaded.
cudaError_t load_cublaslt(const char* path);
// Builds the cached host-side plan launch_implc_cublaslt(p, ...) will use (no GPU work).
cudaError_t prepare_implc_cublaslt(const Problem& p);

// ImplC through CUTLASS (only in builds with the CUTLASS headers; otherwise cudaErrorNotSupported).
cudaError_t launch_implc_cutlass(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream);
bool cutlass_available();

// ImplC workspace layout: cuBLASLt's scratch first, then (silu_mul only) the pre-activation [M, N] buffer.
constexpr size_t kImplCScratchOffset = size_t(8) << 20;

// Workspace one ImplC call needs for a problem with up to max_m rows (cuBLASLt's scratch plus, for silu_mul,
// the pre-activation [max_m, N] buffer).
size_t implc_workspace_bytes(int64_t max_m, int64_t n, Epilogue epilogue, Dtype dtype);

// The ImplC epilogue pass: y[m, j] = f(d[m, :]) for the parts of the epilogue the library did not fuse.
//   silu_mul: d [m, n] -> y [m, n/2] with bias and residual; otherwise: y [m, n] = d + bias (d may alias y).
// pdl: programmatic dependent launch where the GPU runs the sm_90a code (it reads nothing before the wait).
cudaError_t launch_gemm_epilogue(const void* d, const void* bias, const void* residual, void* y, int64_t m, int64_t n,
                                 Epilogue epilogue, Dtype dtype, bool pdl, cudaStream_t stream);

// Runs one implementation (Impl::kAuto: the plan's choice for p.m). config/pad_m apply to ImplB (config null:
// the plan's). Workspace must be at least workspace_bytes(p.m, ...).
cudaError_t run_gemm(const Problem& p, const Plan& plan, Impl impl, const ImplBConfig* config, int pad_m,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Workspace run_gemm needs for any M up to max_m under plan (0 when ImplC is never reached).
size_t workspace_bytes(int64_t max_m, int64_t n, Epilogue epilogue, Dtype dtype, const Plan& plan);

}  // namespace gemm
}  // namespace fdpp
