// ImplA: GEMV on CUDA cores for M <= 8 (FlashDecoding++ section 5's "ImplA", in the spirit of FastGEMV).
//
// One warp owns a pair of weight rows (silu_mul: gate row r and up row N/2 + r, so the activation needs no
// exchange). Its lanes stride along K in 16-byte chunks, loaded with an L1-bypassing streaming load into two
// register buffers (the next batch is in flight while the current one is multiplied), with fp32 FMAs against
// the matching X chunks, which stay hot in L1 because every warp of the SM reads the same X. The grid is
// persistent: as many warps as are resident, each walking several row pairs.
// After the loop a butterfly shuffle sums the lanes. When N alone cannot give every SM enough warps, the CTAs
// of one thread-block cluster split K and add their partial sums through distributed shared memory (sm_90).
#include <cooperative_groups.h>

#include <mutex>
#include <unordered_map>

#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

namespace cg = cooperative_groups;
using detail::Elem;

constexpr int kWarps = 4;

struct GemvParams : detail::KernelProblem {
  int split_k;
  int pairs;  // row pairs (warps) in the whole matrix
};

template <typename T>
__device__ __forceinline__ void dot8(const uint4& w, const float (&xf)[8], float& acc) {
  const float2 w0 = Elem<T>::to_float2(w.x), w1 = Elem<T>::to_float2(w.y);
  const float2 w2 = Elem<T>::to_float2(w.z), w3 = Elem<T>::to_float2(w.w);
  acc = fmaf(w0.x, xf[0], acc);
  acc = fmaf(w0.y, xf[1], acc);
  acc = fmaf(w1.x, xf[2], acc);
  acc = fmaf(w1.y, xf[3], acc);
  acc = fmaf(w2.x, xf[4], acc);
  acc = fmaf(w2.y, xf[5], acc);
  acc = fmaf(w3.x, xf[6], acc);
  acc = fmaf(w3.y, xf[7], acc);
}

template <typename T, int M>
struct GemvRows {
  int row0, row1;
  bool ok0, ok1;
  __device__ __forceinline__ GemvRows(const GemvParams& p, int pair) {
    if (p.silu) {
      row0 = pair;
      row1 = (p.n >> 1) + pair;
      ok0 = ok1 = pair < (p.n >> 1);
    } else {
      row0 = 2 * pair;
      row1 = row0 + 1;
      ok0 = row0 < p.n;
      ok1 = row1 < p.n;
    }
  }
};

// Persistent: warp slot s of the grid handles the row pairs s, s + slots, ... ("rounds"). Its work is one
// stream of units (round, batch of U chunks per lane); the loads of unit u + 1 are issued before unit u is
// multiplied (two register buffers), so the stream never drains between batches or rounds.
template <typename T, int M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvParams p) {
  constexpr int U = M <= 2 ? 4 : 2;  // 16-byte chunks per row per lane per buffer
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int z = blockIdx.x % p.split_k;
  const int cluster_id = blockIdx.x / p.split_k;
  const int slots = (gridDim.x / p.split_k) * kWarps;
  const int slot = cluster_id * kWarps + warp;
  const int rounds = (p.pairs + slots - 1) / slots;  // the same for every warp: cluster barriers line up

  const T* w = reinterpret_cast<const T*>(p.w);
  const T* x = reinterpret_cast<const T*>(p.x);
  const int chunks = p.k >> 3;
  const int c_begin = int(int64_t(z) * chunks / p.split_k);
  const int c_end = int(int64_t(z + 1) * chunks / p.split_k);
  const int batches = (c_end - c_begin + 32 * U - 1) / (32 * U);
  const int total = rounds * batches;

  float acc0[M], acc1[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = 0.f;

  auto load = [&](int u, uint4(&wa)[U], uint4(&wb)[U]) {
    const GemvRows<T, M> r(p, (u / batches) * slots + slot);
    const int c = c_begin + lane + 32 * U * (u % batches);
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int cc = c + 32 * i;
      const bool in = cc < c_end;
      wa[i] = in && r.ok0 ? detail::ld_stream16(w + int64_t(r.row0) * p.k + int64_t(cc) * 8) : make_uint4(0, 0, 0, 0);
      wb[i] = in && r.ok1 ? detail::ld_stream16(w + int64_t(r.row1) * p.k + int64_t(cc) * 8) : make_uint4(0, 0, 0, 0);
    }
  };

  auto compute = [&](int u, const uint4(&wa)[U], const uint4(&wb)[U]) {
    const int c = c_begin + lane + 32 * U * (u % batches);
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int cc = c + 32 * i;
      if (cc < c_end) {
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
          const uint4 xv = detail::ld_cached16(x + int64_t(mi) * p.k + int64_t(cc) * 8);
          float xf[8];
          const float2 x0 = Elem<T>::to_float2(xv.x), x1 = Elem<T>::to_float2(xv.y);
          const float2 x2 = Elem<T>::to_float2(xv.z), x3 = Elem<T>::to_float2(xv.w);
          xf[0] = x0.x;
          xf[1] = x0.y;
          xf[2] = x1.x;
          xf[3] = x1.y;
          xf[4] = x2.x;
          xf[5] = x2.y;
          xf[6] = x3.x;
          xf[7] = x3.y;
          dot8<T>(wa[i], xf, acc0[mi]);
          dot8<T>(wb[i], xf, acc1[mi]);
        }
      }
    }
  };

  // After the last batch of a round: sum the lanes (and the cluster's K shares), apply the epilogue, store.
  auto finish_round = [&](int round) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        acc0[i] += __shfl_xor_sync(0xffffffffu, acc0[i], off);
        acc1[i] += __shfl_xor_sync(0xffffffffu, acc1[i], off);
      }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.split_k > 1) {
      __shared__ float red[kWarps][2 * M];
      cg::cluster_group cluster = cg::this_cluster();
      if (lane == 0) {
#pragma unroll
        for (int i = 0; i < M; ++i) {
          red[warp][i] = acc0[i];
          red[warp][M + i] = acc1[i];
        }
      }
      cluster.sync();
      if (z == 0) {
        for (int r = 1; r < p.split_k; ++r) {
          const float* peer = cluster.map_shared_rank(&red[0][0], r);
#pragma unroll
          for (int i = 0; i < M; ++i) {
            acc0[i] += peer[warp * 2 * M + i];
            acc1[i] += peer[warp * 2 * M + M + i];
          }
        }
      }
      cluster.sync();  // peers keep red untouched until rank 0 has read it
    }
#endif
    const GemvRows<T, M> r(p, round * slots + slot);
    if (z == 0 && r.ok0) {
      // Lane i writes batch row i (register arrays are indexed with constants only).
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (lane != i) continue;
        float v0 = acc0[i], v1 = acc1[i];
        if (p.silu) {
          if (p.bias) {
            v0 += detail::load_float<T>(p.bias, r.row0);
            v1 += detail::load_float<T>(p.bias, r.row1);
          }
          float out = detail::silu(v0) * v1;
          const int64_t idx = int64_t(i) * (p.n >> 1) + r.row0;
          if (p.residual) out += detail::load_float<T>(p.residual, idx);
          detail::store_float<T>(p.y, idx, out);
        } else {
          const int64_t idx0 = int64_t(i) * p.n + r.row0;
          if (p.bias) v0 += detail::load_float<T>(p.bias, r.row0);
          if (p.residual) v0 += detail::load_float<T>(p.residual, idx0);
          detail::store_float<T>(p.y, idx0, v0);
          if (r.ok1) {
            const int64_t idx1 = int64_t(i) * p.n + r.row1;
            if (p.bias) v1 += detail::load_float<T>(p.bias, r.row1);
            if (p.residual) v1 += detail::load_float<T>(p.residual, idx1);
            detail::store_float<T>(p.y, idx1, v1);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = 0.f;
  };

  uint4 a0[U], b0[U], a1[U], b1[U];
  detail::pdl_launch_dependents();
  if (total > 0) load(0, a0, b0);  // weights only: they do not depend on the previous kernel
  detail::pdl_wait_for_previous_grid();
  for (int u = 0; u < total; u += 2) {
    if (u + 1 < total) load(u + 1, a1, b1);
    compute(u, a0, b0);
    if ((u + 1) % batches == 0) finish_round(u / batches);
    if (u + 1 >= total) break;
    if (u + 2 < total) load(u + 2, a0, b0);
    compute(u + 1, a1, b1);
    if ((u + 2) % batches == 0) finish_round((u + 1) / batches);
  }
}

template <typename T, int M>
cudaError_t launch_typed(const GemvParams& params, const DeviceInfo& dev, const detail::Launch& launch) {
  const void* kernel = reinterpret_cast<const void*>(&gemv_kernel<T, M>);
  // As many clusters as are resident at once (the occupancy query is host-only and cached), each with the
  // same number of warp rounds.
  static std::mutex mu;
  static std::unordered_map<const void*, int> resident_cache[64];
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    int& cached = resident_cache[dev.device & 63][kernel];
    if (cached == 0) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached, kernel, kWarps * 32, 0) != cudaSuccess) {
        cudaGetLastError();
        cached = 1;
      }
      if (cached < 1) cached = 1;
    }
    per_sm = cached;
  }
  const int64_t resident = int64_t(per_sm) * dev.num_sms / params.split_k;
  const int64_t needed = (params.pairs + kWarps - 1) / kWarps;  // clusters if every warp had one pair
  const int64_t rounds = (needed + resident - 1) / resident;
  const int64_t clusters = (needed + rounds - 1) / rounds;
  return detail::launch_kernel(gemv_kernel<T, M>, unsigned(clusters * params.split_k), unsigned(kWarps * 32), 0, launch,
                               params.split_k, params);
}

template <typename T>
cudaError_t launch_m(const GemvParams& params, const DeviceInfo& dev, const detail::Launch& launch) {
  switch (params.m) {
    case 1: return launch_typed<T, 1>(params, dev, launch);
    case 2: return launch_typed<T, 2>(params, dev, launch);
    case 3: return launch_typed<T, 3>(params, dev, launch);
    case 4: return launch_typed<T, 4>(params, dev, launch);
    case 5: return launch_typed<T, 5>(params, dev, launch);
    case 6: return launch_typed<T, 6>(params, dev, launch);
    case 7: return launch_typed<T, 7>(params, dev, launch);
    case 8: return launch_typed<T, 8>(params, dev, launch);
    default: set_detail("ImplA handles 1 <= M <= 8"); return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_impla(const Problem& p, int split_k, cudaStream_t stream) {
  if (p.m < 1 || p.m > kImplAMaxM) {
    set_detail("ImplA handles 1 <= M <= 8");
    return cudaErrorInvalidValue;
  }
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (split_k <= 0) split_k = impla_split_k(p.n, p.k, p.silu_mul(), dev.num_sms, dev.cc_major);
  if (split_k > kMaxSplitK || (split_k > 1 && !hopper_paths(dev.cc_major))) {
    set_detail("ImplA split_k must be 1..8, and 1 on GPUs other than compute capability 9.x");
    return cudaErrorInvalidValue;
  }
  GemvParams params{};
  detail::fill_problem(params, p);
  params.split_k = split_k;
  params.pairs = int(p.silu_mul() ? p.n / 2 : (p.n + 1) / 2);
  const detail::Launch launch{stream, p.pdl && hopper_paths(dev.cc_major)};
  if (p.dtype == Dtype::kBFloat16) return launch_m<__nv_bfloat16>(params, dev, launch);
  return launch_m<__half>(params, dev, launch);
}

}  // namespace gemm
}  // namespace fdpp
