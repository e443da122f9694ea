// The pure host half of the portable kernels' C ABI (portable_capi.h), built into both libraries. The launches are
// at the end of attention_capi.cpp and gemm_capi.cpp, beside the argument translation they share.
#include "capi/portable_capi.h"

#include "capi/capi_errors.h"
#include "kernels/portable/fdpp_portable.h"
#include "kernels/portable/portable_heuristics.h"

namespace pt = fdpp::portable;

extern "C" {

int fdpp_portable_warp_size(void) { return fdpp::port::kWarpSize; }

int fdpp_portable_decode_splits(int64_t rows, int64_t kv_len, int32_t cus) {
  return pt::decode_num_splits(rows, kv_len, cus);
}

fdpp_status fdpp_portable_gemm_plan(int64_t m, int64_t n, int32_t epilogue, int32_t cus, int32_t warp_size,
                                    int32_t* kernel, int32_t* m_tile, int32_t* pairs_per_warp, int32_t* k_chunk) {
  const char* fn = "fdpp_portable_gemm_plan";
  if (n < 1 || cus < 1 || (warp_size != 32 && warp_size != 64))
    return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT,
                           std::string(fn) + ": N and cus must be >= 1 and warp_size 32 or 64");
  if (epilogue != FDPP_GEMM_EPILOGUE_NONE && epilogue != FDPP_GEMM_EPILOGUE_SILU_MUL)
    return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, std::string(fn) + ": epilogue must be 0 (none) or 1 (silu_mul)");
  const pt::GemmKernel chosen = pt::gemm_kernel(m);
  if (chosen == pt::GemmKernel::kNone)
    return fdpp::set_error(FDPP_ERR_UNSUPPORTED, std::string(fn) + ": M " + std::to_string(m) +
                                                     " is outside 1..16, the portable kernels' range");
  const int64_t pairs = epilogue == FDPP_GEMM_EPILOGUE_SILU_MUL ? n / 2 : (n + 1) / 2;
  const bool flat = chosen == pt::GemmKernel::kFlat;
  if (kernel) *kernel = static_cast<int32_t>(chosen);
  if (m_tile) *m_tile = pt::gemm_m_tile(m);
  if (pairs_per_warp) *pairs_per_warp = flat ? pt::flat_pairs_per_warp(pairs, cus) : 1;
  if (k_chunk) *k_chunk = pt::flat_k_chunk(warp_size);
  return FDPP_OK;
}

}  // extern "C"
