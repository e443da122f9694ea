// The portable kernels' launchers: the same parameter structs as the NVIDIA kernels (AttentionParams,
// gemm::Problem), one source for nvcc and hipcc (fdpp_portable.h), plain CUDA-core / VALU arithmetic.
//
//   attention_decode  fdpp::AsyncSoftmaxAttention as split-KV blocks of one query row each, any seq (prefill too:
//                     correct, not fast), every mask mode, GQA. softmax kUnified: FlashDecoding++'s unified max phi
//                     with a guard; a row whose visible s - phi leaves [guard_lo, guard_hi] is recomputed exactly
//                     with the online-max softmax, so no row can overflow into Inf or NaN. kSynchronized: the
//                     online-max softmax throughout.
//   gemm              Y = epilogue(X W^T (+ bias)) (+ residual) for M <= 16: a GEMV (M <= 4) or a flat GEMM that
//                     stages X in shared memory (portable_heuristics.h).
// Launchers never synchronize or allocate; they expect parameters already checked (check_attention_params,
// gemm::problem_problem) and say what else they cannot run through *_problem().
#pragma once

#include <stddef.h>

#include "kernels/attention/attention_params.h"
#include "kernels/gemm/gemm.h"
#include "kernels/portable/fdpp_portable.h"

namespace fdpp {
namespace portable {

// Split count for p on the current device: p.num_splits when > 0, else decode_num_splits() with the device's
// compute units (a host query, no stream work: call it before graph capture).
port::Error attention_splits(const AttentionParams& p, int* splits);

// Workspace attention_decode needs for p on the current device (0 with one split).
port::Error attention_workspace_bytes(const AttentionParams& p, size_t* bytes);

port::Error attention_decode(const AttentionParams& p, void* workspace, size_t workspace_bytes, port::Stream stream);

// Why the portable GEMM cannot run p (beyond gemm::problem_problem), or nullptr: M above 16.
const char* gemm_problem(const gemm::Problem& p);

port::Error gemm(const gemm::Problem& p, port::Stream stream);

}  // namespace portable
}  // namespace fdpp
