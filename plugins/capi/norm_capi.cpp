// C ABI of fdpp::RMSNorm: validate, translate to RmsNormParams, launch. Every check names the argument and what
// to do; nothing here synchronizes.
#include "capi/norm_capi.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "capi/capi_errors.h"
#include "kernels/norm/rms_norm.h"

namespace {

constexpr int64_t kMaxRows = 0x7fffffff;  // one CTA per row on grid.x

fdpp_status invalid(const std::string& msg) {
  return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, "fdpp_rms_norm: " + msg);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

fdpp_status check_pointer(const char* name, const void* p) {
  if (p == nullptr) return invalid(std::string(name) + " is NULL; pass a device pointer");
  if (!aligned16(p))
    return invalid(std::string(name) + " is not 16-byte aligned; pass a tensor whose storage starts aligned");
  return FDPP_OK;
}

fdpp_status row_stride(const char* name, int64_t given, int hidden, int esize, int64_t* stride) {
  *stride = given == 0 ? hidden : given;
  if (*stride < hidden || (*stride * esize) % 16 != 0)
    return invalid(std::string(name) + " " + std::to_string(given) + " must be 0 or >= hidden (" +
                   std::to_string(hidden) + ") and a multiple of " + std::to_string(16 / esize) + " elements");
  return FDPP_OK;
}

}  // namespace

extern "C" {

int fdpp_rms_norm_args_size(void) { return static_cast<int>(sizeof(fdpp_rms_norm_args)); }

fdpp_status fdpp_rms_norm(const fdpp_rms_norm_args* a, void* stream) {
  return fdpp::guarded("fdpp_rms_norm", [&] {
    if (a == nullptr) return invalid("args is NULL");
    if (a->dtype < FDPP_FLOAT16 || a->dtype > FDPP_FLOAT32)
      return invalid("unknown dtype code " + std::to_string(a->dtype) + " (0 float16, 1 bfloat16, 2 float32)");
    if (a->hidden < fdpp::kRmsNormAlign || a->hidden > fdpp::kRmsNormMaxHidden || a->hidden % fdpp::kRmsNormAlign)
      return fdpp::set_error(FDPP_ERR_UNSUPPORTED, "fdpp_rms_norm: hidden " + std::to_string(a->hidden) +
                                                       " is not supported; the kernel takes a multiple of 8 up to " +
                                                       std::to_string(fdpp::kRmsNormMaxHidden));
    if (a->rows < 0 || a->rows > kMaxRows) return invalid("rows must be in [0, 2^31)");
    if (!(std::isfinite(a->epsilon) && a->epsilon >= 0.f)) return invalid("epsilon must be finite and >= 0");
    fdpp::RmsNormParams p;
    p.dtype = static_cast<fdpp::NormDtype>(a->dtype);
    p.hidden = a->hidden, p.rows = a->rows, p.epsilon = a->epsilon;
    p.x = a->x, p.weight = a->weight, p.y = a->y;
    if (a->rows == 0) return FDPP_OK;
    const int esize = a->dtype == FDPP_FLOAT32 ? 4 : 2;
    fdpp_status st;
    if ((st = check_pointer("x", a->x)) || (st = check_pointer("weight", a->weight)) || (st = check_pointer("y", a->y)))
      return st;
    if ((st = row_stride("x_row_stride", a->x_row_stride, a->hidden, esize, &p.x_row_stride)) ||
        (st = row_stride("y_row_stride", a->y_row_stride, a->hidden, esize, &p.y_row_stride)))
      return st;
    return fdpp::from_cuda(fdpp::rms_norm(p, static_cast<cudaStream_t>(stream)), "fdpp_rms_norm");
  });
}

}  // extern "C"
