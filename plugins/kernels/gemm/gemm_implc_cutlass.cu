// ImplC through CUTLASS 2.x (headers from the nvidia-cutlass wheel): a classic multistage tensor-op GEMM with
// 64 x 128 x 32 threadblock tiles -- the "pad M to 64" GEMM the paper compares against, and the ImplC that
// works without cuBLASLt. Uses mma.sync (sm_80 code, which also runs on sm_90).
//
// D[M, N] = X[M, K] (row-major) * W^T (W [N, K] row-major = column-major [K, N]) + C, where C is the bias
// broadcast over rows (a row-major C with leading dimension 0) or the residual, so the product is rounded once,
// as cuBLAS's fused bias does. What is left (silu_mul; a residual on top of a bias) is finished by
// launch_gemm_epilogue.
#include "kernels/gemm/gemm.h"

#if defined(FDPP_WITH_CUTLASS)
#include <cutlass/bfloat16.h>
#include <cutlass/gemm/device/gemm.h>
#include <cutlass/half.h>
#endif

namespace fdpp {
namespace gemm {

#if defined(FDPP_WITH_CUTLASS)
namespace {

template <typename Element>
using CutlassGemm =
    cutlass::gemm::device::Gemm<Element, cutlass::layout::RowMajor,     // A = X
                                Element, cutlass::layout::ColumnMajor,  // B = W^T
                                Element, cutlass::layout::RowMajor,     // C, D
                                float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
                                cutlass::gemm::GemmShape<64, 128, 32>, cutlass::gemm::GemmShape<32, 64, 32>,
                                cutlass::gemm::GemmShape<16, 8, 16>,
                                cutlass::epilogue::thread::LinearCombination<Element, 8, float, float>,
                                cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 4>;

template <typename Element>
cudaError_t run_typed(const Problem& p, void* d_ptr, const void* c_ptr, int64_t ldc, cudaStream_t stream) {
  using Gemm = CutlassGemm<Element>;
  const Element* x = static_cast<const Element*>(p.x);
  const Element* w = static_cast<const Element*>(p.w);
  Element* d = static_cast<Element*>(d_ptr);
  const Element* c = c_ptr ? static_cast<const Element*>(c_ptr) : d;
  typename Gemm::Arguments args({int(p.m), int(p.n), int(p.k)}, {x, p.k}, {w, p.k}, {c, c_ptr ? ldc : p.n}, {d, p.n},
                                {1.0f, c_ptr ? 1.0f : 0.0f});
  Gemm gemm;
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess) {
    set_detail("CUTLASS ImplC cannot run this problem (K and N must be multiples of 8, pointers 16-byte aligned)");
    return cudaErrorNotSupported;
  }
  status = gemm.initialize(args, nullptr, stream);
  if (status == cutlass::Status::kSuccess) status = gemm(stream);
  if (status != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    set_detail(cutlassGetStatusString(status));
    return cudaErrorUnknown;
  }
  return cudaGetLastError();
}

}  // namespace

bool cutlass_available() { return true; }

cudaError_t launch_implc_cutlass(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < implc_workspace_bytes(p.m, p.n, p.epilogue, p.dtype)) {
    set_detail("ImplC (CUTLASS) workspace is smaller than fdpp_gemm_workspace_bytes asked for");
    return cudaErrorInvalidValue;
  }
  const bool silu = p.silu_mul();
  // Same scratch layout as the cuBLASLt path: the pre-activation buffer follows the first 8 MiB.
  void* d_ptr = silu ? static_cast<void*>(static_cast<unsigned char*>(workspace) + kImplCScratchOffset) : p.y;
  const void* c_ptr = p.bias ? p.bias : (silu ? nullptr : p.residual);
  const int64_t ldc = p.bias ? 0 : p.n;  // leading dimension 0: every row of C is the bias
  cudaError_t err = p.dtype == Dtype::kBFloat16 ? run_typed<cutlass::bfloat16_t>(p, d_ptr, c_ptr, ldc, stream)
                                                : run_typed<cutlass::half_t>(p, d_ptr, c_ptr, ldc, stream);
  if (err != cudaSuccess) return err;
  if (silu) return launch_gemm_epilogue(d_ptr, nullptr, p.residual, p.y, p.m, p.n, p.epilogue, p.dtype, p.pdl, stream);
  if (p.bias && p.residual)
    return launch_gemm_epilogue(p.y, nullptr, p.residual, p.y, p.m, p.n, p.epilogue, p.dtype, p.pdl, stream);
  return cudaSuccess;
}

#else

bool cutlass_available() { return false; }

cudaError_t launch_implc_cutlass(const Problem&, void*, size_t, cudaStream_t) {
  set_detail("this build has no CUTLASS ImplC (configure with the nvidia-cutlass headers: pip install nvidia-cutlass)");
  return cudaErrorNotSupported;
}

#endif

}  // namespace gemm
}  // namespace fdpp
