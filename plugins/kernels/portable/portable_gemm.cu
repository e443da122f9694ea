// The portable GEMM for M <= 16 (portable.h): a GEMV and a flat GEMM on CUDA cores / VALUs, one source for nvcc and
// hipcc. Which kernel, the row padding and the flat GEMM's tile: portable_heuristics.h.
//
// Each warp owns pairs of weight rows (silu_mul: gate row i and up row N/2 + i; else rows 2i and 2i + 1), its lanes
// stride along K in 16-byte chunks, fp32 FMAs, then a butterfly shuffle sums the lanes and lane 0 applies the
// epilogue and stores (one rounding to the output type).
//   GEMV: the activation chunks come straight from global memory (every warp reads the same X: cache hits).
//   flat: per step the block stages X[m_tile][8 x warp size] in shared memory, and each warp's rows read it there.
#include "kernels/portable/portable.h"
#include "kernels/portable/portable_heuristics.h"

namespace fdpp {
namespace portable {
namespace {

using port::kWarpSize;
constexpr int kThreads = kBlockWarps * kWarpSize;

struct GemmArgs {
  const void* x;
  const void* w;
  const void* bias;
  const void* residual;
  void* y;
  int m, n, k;
  int silu;
  int pairs;
};

struct PairRows {
  int row0, row1;
  bool ok0, ok1;
  __device__ PairRows(const GemmArgs& a, int pair) {
    if (a.silu) {
      row0 = pair, row1 = a.n / 2 + pair;
      ok0 = ok1 = pair < a.pairs;
    } else {
      row0 = 2 * pair, row1 = 2 * pair + 1;
      ok0 = row0 < a.n, ok1 = row1 < a.n;
    }
  }
};

__device__ __forceinline__ float dot8(const float (&w)[8], const float (&x)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(w[i], x[i], acc);
  return acc;
}

template <typename E>
__device__ __forceinline__ void load_row_chunk(const GemmArgs& a, int row, bool ok, int kk, float (&f)[8]) {
  if (ok) {
    port::load8<E>(static_cast<const typename E::Storage*>(a.w) + int64_t(row) * a.k + kk, f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = 0.f;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += port::shfl_xor(v, o);
  return v;
}

template <typename E>
__device__ __forceinline__ float element(const void* base, int64_t i) {
  return E::to_float(static_cast<const typename E::Storage*>(base)[i]);
}

// y for one row pair and activation row mi from the full dot products of its two weight rows.
template <typename E>
__device__ void store_pair(const GemmArgs& a, const PairRows& r, int mi, float dot0, float dot1) {
  auto* y = static_cast<typename E::Storage*>(a.y);
  if (a.silu) {
    if (!r.ok0) return;
    const int n_out = a.n / 2, col = r.row0;
    const float gate = dot0 + (a.bias ? element<E>(a.bias, r.row0) : 0.f);
    const float up = dot1 + (a.bias ? element<E>(a.bias, r.row1) : 0.f);
    float out = gate / (1.f + expf(-gate)) * up;
    if (a.residual) out += element<E>(a.residual, int64_t(mi) * n_out + col);
    y[int64_t(mi) * n_out + col] = E::from_float(out);
    return;
  }
  const int rows[2] = {r.row0, r.row1};
  const bool oks[2] = {r.ok0, r.ok1};
  const float dots[2] = {dot0, dot1};
  for (int i = 0; i < 2; ++i) {
    if (!oks[i]) continue;
    float out = dots[i] + (a.bias ? element<E>(a.bias, rows[i]) : 0.f);
    if (a.residual) out += element<E>(a.residual, int64_t(mi) * a.n + rows[i]);
    y[int64_t(mi) * a.n + rows[i]] = E::from_float(out);
  }
}

template <typename E, int MT>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemmArgs a) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int pair = blockIdx.x * kBlockWarps + warp;
  if (pair >= a.pairs) return;  // a whole warp: no barrier below
  const PairRows r(a, pair);
  const auto* x = static_cast<const typename E::Storage*>(a.x);
  float acc0[MT], acc1[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc0[i] = acc1[i] = 0.f;
  for (int kk = lane * 8; kk < a.k; kk += kWarpSize * 8) {
    float w0[8], w1[8];
    load_row_chunk<E>(a, r.row0, r.ok0, kk, w0);
    load_row_chunk<E>(a, r.row1, r.ok1, kk, w1);
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      if (mi < a.m) {  // rows past M: the padding of the tile
        float xf[8];
        port::load8<E>(x + int64_t(mi) * a.k + kk, xf);
        acc0[mi] = dot8(w0, xf, acc0[mi]);
        acc1[mi] = dot8(w1, xf, acc1[mi]);
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    const float d0 = warp_sum(acc0[mi]), d1 = warp_sum(acc1[mi]);
    if (lane == 0 && mi < a.m) store_pair<E>(a, r, mi, d0, d1);
  }
}

// P pairs per warp; X staged per step of 8 x warp-size K elements (flat_k_chunk).
template <typename E, int MT, int P>
__global__ void __launch_bounds__(kThreads) flat_kernel(const GemmArgs a) {
  using S = typename E::Storage;
  constexpr int kChunk = 8 * kWarpSize;
  __shared__ __align__(16) S xs[MT][kChunk];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int first_pair = (blockIdx.x * kBlockWarps + warp) * P;
  const auto* x = static_cast<const S*>(a.x);
  float acc[P][2][MT];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) acc[p][0][mi] = acc[p][1][mi] = 0.f;

  for (int k0 = 0; k0 < a.k; k0 += kChunk) {
    // Stage X rows [0, MT) x [k0, k0 + kChunk): one 16-byte piece per thread and pass; zeros past M and K.
    for (int i = threadIdx.x; i < MT * kWarpSize; i += kThreads) {
      const int row = i / kWarpSize, kk = k0 + (i % kWarpSize) * 8;
      uint4 piece = make_uint4(0, 0, 0, 0);
      if (row < a.m && kk < a.k) piece = *reinterpret_cast<const uint4*>(x + int64_t(row) * a.k + kk);
      *reinterpret_cast<uint4*>(&xs[row][(i % kWarpSize) * 8]) = piece;
    }
    __syncthreads();
    const int kk = k0 + lane * 8;
    if (kk < a.k) {
      float w[P][2][8];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int pair = first_pair + p;
        const PairRows r(a, pair < a.pairs ? pair : 0);
        load_row_chunk<E>(a, r.row0, r.ok0 && pair < a.pairs, kk, w[p][0]);
        load_row_chunk<E>(a, r.row1, r.ok1 && pair < a.pairs, kk, w[p][1]);
      }
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        if (mi < a.m) {
          float xf[8];
          port::load8<E>(&xs[mi][lane * 8], xf);
#pragma unroll
          for (int p = 0; p < P; ++p) {
            acc[p][0][mi] = dot8(w[p][0], xf, acc[p][0][mi]);
            acc[p][1][mi] = dot8(w[p][1], xf, acc[p][1][mi]);
          }
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int pair = first_pair + p;
    if (pair < a.pairs) {  // the same in every lane of the warp
      const PairRows r(a, pair);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const float d0 = warp_sum(acc[p][0][mi]), d1 = warp_sum(acc[p][1][mi]);
        if (lane == 0 && mi < a.m) store_pair<E>(a, r, mi, d0, d1);
      }
    }
  }
}

template <typename E>
port::Error launch_gemv(const GemmArgs& a, int m_tile, port::Stream stream) {
  const int blocks = (a.pairs + kBlockWarps - 1) / kBlockWarps;
  switch (m_tile) {
    case 1: gemv_kernel<E, 1><<<blocks, kThreads, 0, stream>>>(a); break;
    case 2: gemv_kernel<E, 2><<<blocks, kThreads, 0, stream>>>(a); break;
    case 4: gemv_kernel<E, 4><<<blocks, kThreads, 0, stream>>>(a); break;
    default: return port::kInvalidValue;
  }
  return port::last_launch_error();
}

template <typename E, int MT>
port::Error launch_flat_tile(const GemmArgs& a, int pairs_per_warp, port::Stream stream) {
  const int per_block = kBlockWarps * pairs_per_warp;
  const int blocks = (a.pairs + per_block - 1) / per_block;
  if (pairs_per_warp == 2) flat_kernel<E, MT, 2><<<blocks, kThreads, 0, stream>>>(a);
  else flat_kernel<E, MT, 1><<<blocks, kThreads, 0, stream>>>(a);
  return port::last_launch_error();
}

template <typename E>
port::Error launch_flat(const GemmArgs& a, int m_tile, port::Stream stream) {
  int cus = 0;
  if (port::Error err = port::multiprocessor_count(&cus)) return err;
  const int pairs_per_warp = flat_pairs_per_warp(a.pairs, cus);
  if (m_tile == 8) return launch_flat_tile<E, 8>(a, pairs_per_warp, stream);
  if (m_tile == 16) return launch_flat_tile<E, 16>(a, pairs_per_warp, stream);
  return port::kInvalidValue;
}

template <typename E>
port::Error launch_dtype(const GemmArgs& a, GemmKernel kernel, int m_tile, port::Stream stream) {
  return kernel == GemmKernel::kGemv ? launch_gemv<E>(a, m_tile, stream) : launch_flat<E>(a, m_tile, stream);
}

}  // namespace

const char* gemm_problem(const gemm::Problem& p) {
  if (gemm_kernel(p.m) == GemmKernel::kNone)
    return "the portable GEMM takes 1 <= M <= 16; larger M runs the vendor GEMM";
  return nullptr;
}

port::Error gemm(const gemm::Problem& p, port::Stream stream) {
  const GemmKernel kernel = gemm_kernel(p.m);
  if (kernel == GemmKernel::kNone) return port::kInvalidValue;
  GemmArgs a{p.x,
             p.w,
             p.bias,
             p.residual,
             p.y,
             static_cast<int>(p.m),
             static_cast<int>(p.n),
             static_cast<int>(p.k),
             p.silu_mul() ? 1 : 0,
             0};
  a.pairs = a.silu ? a.n / 2 : (a.n + 1) / 2;
  const int m_tile = gemm_m_tile(p.m);
  return p.dtype == gemm::Dtype::kBFloat16 ? launch_dtype<port::BF16>(a, kernel, m_tile, stream)
                                           : launch_dtype<port::F16>(a, kernel, m_tile, stream);
}

}  // namespace portable
}  // namespace fdpp
