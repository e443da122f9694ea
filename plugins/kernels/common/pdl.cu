#include <atomic>

#include "kernels/common/pdl.cuh"

namespace fdpp {
namespace pdl {

cudaError_t runs_sm90a_code(bool* yes) {
  static std::atomic<int> majors[64] = {};  // compute capability major + 1 per device; 0: not asked yet
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::atomic<int>& slot = majors[device & 63];
  if (slot.load(std::memory_order_relaxed) == 0) {
    int major = 0;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return err;
    slot.store(major + 1, std::memory_order_relaxed);
  }
  *yes = slot.load(std::memory_order_relaxed) - 1 == 9;
  return cudaSuccess;
}

}  // namespace pdl
}  // namespace fdpp
