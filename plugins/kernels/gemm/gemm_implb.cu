// ImplB: the flat GEMM of FlashDecoding++ (section 4) for M <= 64 on tensor cores.
//
// The GEMM is computed as Y^T = W X^T so that the weight fills the MMA's 16-row side and the batch sits on its
// 8-wide side: mma.sync m16n8k16 with 16 weight rows by 8 batch rows, M padded to 8 instead of 64.
//
// Each of a CTA's 4 warps owns RB 16-row weight blocks and a kw-wide K slice of every stage; the CTA covers
// RB * n_tile = RB * 16 * warps_n rows and k_tile = kw * warps_k columns per stage. RB = 2 when the batch has
// two or more blocks of 8: every batch fragment a warp stages and reads from shared memory then feeds two
// weight blocks' MMAs, which halves the shared-memory traffic of X per weight byte (at M > 8, one warp per
// weight block ran out of shared-memory bandwidth; docs/notes-gemm.md). Loads are 16-byte cp.async into a
// `stages`-deep ring of shared memory, so the loads of the next stages are in flight while the current one is
// multiplied (stages = 1 turns the overlap off, for the ablation).
//
// K is permuted consistently for W and X inside each 32-wide group so that every lane loads whole 16-byte
// pieces and later reads back only what it loaded itself: lane (g = lane / 4, t = lane % 4) copies
// W[row g][8t .. 8t+8), W[row g+8][8t .. 8t+8) and X[batch g][8t .. 8t+8) and feeds two MMAs from them
// (elements 0-3 to the first, 4-7 to the second). The dot product is a sum, so any permutation of K applied to
// both operands gives the same result. No lane reads another lane's data, so the pipeline needs no barrier:
// cp.async.wait_group alone orders it.
//
// Split-K: the warps of a CTA split each stage along K (reduced through shared memory); `split_k` CTAs of one
// thread-block cluster split the K range (reduced through distributed shared memory, sm_90), one launch, no
// global workspace.
//
// The grid is persistent (one wave: as many clusters as are resident, each walking an equal share of the
// tiles through one continuous pipeline), and with programmatic dependent launch the weights of the first
// stages are requested before waiting for the kernel that produces X (gemm.h: Problem::pdl).
//
// A config with k_tile >= 1024 (implb_is_bulk) selects a 16-row x 1024-column version of this kernel instead, the
// TMA one (gemm_implb_bulk.cu) or the row-streaming ones (gemm_implb_stream.cu, gemm_implb_pair.cu): at M <= 8 the
// GEMM is a weight stream, and these loaders stream it faster (the comparison: docs/notes-gemm.md).
#include <cooperative_groups.h>

#include <mutex>
#include <unordered_map>

#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

namespace cg = cooperative_groups;
using detail::cp_async16;
using detail::Elem;
using detail::lds16;

struct FlatGemmParams : detail::KernelProblem {
  int warps_n;  // 16-row blocks per CTA
  int kw;       // K elements per warp per stage (multiple of 32)
  int stages;
  int split_k;
  int steps_total;  // ceil(k / k_tile)
  int num_blocks;   // 16-row blocks in the whole matrix
  int num_tiles;    // CTA tiles (n_tile rows each)
};

// Persistent: a cluster of split_k CTAs walks the tiles cluster_id, cluster_id + clusters, ... and each CTA of
// it streams its K share of every tile through one continuous cp.async pipeline, so loads for the next tile
// are already in flight while the current one is reduced and stored; the launcher sizes the grid to what is
// resident at once, with the same number of tiles (+-1) per cluster.
template <typename T, int NB, int RB>
__global__ void __launch_bounds__(128) flat_gemm_kernel(const FlatGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warps_k = kImplBWarps / p.warps_n;
  const int wn = warp % p.warps_n;
  const int wk = warp / p.warps_n;
  const int z = blockIdx.x % p.split_k;
  const int cluster_id = blockIdx.x / p.split_k;
  const int clusters = gridDim.x / p.split_k;
  const int my_tiles = cluster_id < p.num_tiles ? (p.num_tiles - cluster_id + clusters - 1) / clusters : 0;

  const T* w = reinterpret_cast<const T*>(p.w);
  const T* x = reinterpret_cast<const T*>(p.x);
  const int kgroups = p.kw >> 5;
  const int k_tile = p.kw * warps_k;
  const int s_begin = int(int64_t(z) * p.steps_total / p.split_k);
  const int s_end = int(int64_t(z + 1) * p.steps_total / p.split_k);
  const int nsteps = s_end - s_begin;
  const int total = my_tiles * nsteps;

  const int slot_bytes = (2 * RB + NB) * kgroups * 512;  // one warp, one stage: RB x 2 weight rows, NB batch
  const int stage_bytes = kImplBWarps * slot_bytes;
  unsigned char* warp_smem = smem + warp * slot_bytes + lane * 16;
  const uint32_t warp_smem_u32 = detail::smem_u32(warp_smem);

  // Unit u of this CTA's stream: tile index u / nsteps of its list, K step s_begin + u % nsteps. The weight
  // part and the activation part can be issued separately (the prologue streams weights before X exists).
  auto issue_part = [&](int u, int slot, bool weights, bool activations) {
    const int tile = cluster_id + (u / nsteps) * clusters;
    const int step = s_begin + u % nsteps;
    const uint32_t base = warp_smem_u32 + slot * stage_bytes;
    const int k0 = step * k_tile + wk * p.kw + 8 * t;
    if (weights) {
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const detail::LaneRows r(p.n, p.silu, (tile * p.warps_n + wn) * RB + rb, g);
        const T* wrow0 = w + (r.ok0 ? int64_t(r.row0) * p.k : 0);
        const T* wrow1 = w + (r.ok1 ? int64_t(r.row1) * p.k : 0);
        for (int j = 0; j < kgroups; ++j) {
          const int kk = k0 + 32 * j;
          const bool kin = kk < p.k;
          cp_async16(base + (2 * rb * kgroups + j) * 512, kin && r.ok0 ? wrow0 + kk : w, kin && r.ok0);
          cp_async16(base + ((2 * rb + 1) * kgroups + j) * 512, kin && r.ok1 ? wrow1 + kk : w, kin && r.ok1);
        }
      }
    }
    if (activations) {
      for (int j = 0; j < kgroups; ++j) {
        const int kk = k0 + 32 * j;
        const bool kin = kk < p.k;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          const int mrow = nb * 8 + g;
          // Batch rows past M are never loaded; compute() feeds zeros for them. X goes through L1: every
          // warp of the SM reads the same rows.
          if (mrow < p.m)
            detail::cp_async16_ca(base + ((2 * RB + nb) * kgroups + j) * 512, kin ? x + int64_t(mrow) * p.k + kk : x,
                                  kin);
        }
      }
    }
  };
  auto issue = [&](int u, int slot) { issue_part(u, slot, true, true); };

  float acc[RB][NB][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) acc[rb][nb][0] = acc[rb][nb][1] = acc[rb][nb][2] = acc[rb][nb][3] = 0.f;
  };
  zero_acc();

  auto compute = [&](int slot) {
    const unsigned char* base = warp_smem + slot * stage_bytes;
    for (int j = 0; j < kgroups; ++j) {
      uint4 b[NB];  // X[batch nb*8 + g][8t .. 8t+8), read once for all RB weight blocks
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        b[nb] = make_uint4(0, 0, 0, 0);
        if (nb * 8 + g < p.m) b[nb] = lds16(base + ((2 * RB + nb) * kgroups + j) * 512);
      }
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const uint4 a_lo = lds16(base + (2 * rb * kgroups + j) * 512);        // W[row0][8t .. 8t+8)
        const uint4 a_hi = lds16(base + ((2 * rb + 1) * kgroups + j) * 512);  // W[row1][8t .. 8t+8)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          detail::mma_16816<T>(acc[rb][nb], a_lo.x, a_hi.x, a_lo.y, a_hi.y, b[nb].x, b[nb].y);
          detail::mma_16816<T>(acc[rb][nb], a_lo.z, a_hi.z, a_lo.w, a_hi.w, b[nb].z, b[nb].w);
        }
      }
    }
  };

  constexpr int kAcc = RB * NB * 4;                                      // accumulators per lane
  float* red = reinterpret_cast<float*>(smem + p.stages * stage_bytes);  // [warp][kAcc][32]

  // Sum the tile over the CTA's warps and the cluster's CTAs, apply the epilogue, store; zero the sums.
  auto finish_tile = [&](int tile) {
    float* flat = &acc[0][0][0];
    if (warps_k > 1) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a) red[(warp * kAcc + a) * 32 + lane] = flat[a];
      __syncthreads();
      if (wk == 0) {
        for (int other = 1; other < warps_k; ++other) {
          const int src = other * p.warps_n + wn;
#pragma unroll
          for (int a = 0; a < kAcc; ++a) flat[a] += red[(src * kAcc + a) * 32 + lane];
        }
      }
      __syncthreads();  // red is free again for the next tile
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.split_k > 1) {
      cg::cluster_group cluster = cg::this_cluster();
      if (wk == 0) {
#pragma unroll
        for (int a = 0; a < kAcc; ++a) red[(wn * kAcc + a) * 32 + lane] = flat[a];
      }
      cluster.sync();
      if (z == 0 && wk == 0) {
        for (int r = 1; r < p.split_k; ++r) {
          const float* peer = cluster.map_shared_rank(red, r);
#pragma unroll
          for (int a = 0; a < kAcc; ++a) flat[a] += peer[(wn * kAcc + a) * 32 + lane];
        }
      }
      cluster.sync();  // peers keep red untouched until rank 0 has read it
    }
#endif
    if (z == 0 && wk == 0) {
#pragma unroll
      for (int rb = 0; rb < RB; ++rb)
        detail::store_block<T, NB>(acc[rb], detail::LaneRows(p.n, p.silu, (tile * p.warps_n + wn) * RB + rb, g), t, p.m,
                                   p.n, p.silu, p.bias, p.residual, p.y);
    }
    zero_acc();
  };

  // The multistage pipeline: stages - 1 units in flight ahead of the one being multiplied, across tiles.
  // Prologue: the first units' weights (one commit group each), then -- once the kernel that produced X is
  // done -- their activations (one more group).
  detail::pdl_launch_dependents();
  for (int s = 0; s < p.stages - 1; ++s) {
    if (s < total) issue_part(s, s, true, false);
    detail::cp_async_commit();
  }
  detail::pdl_wait_for_previous_grid();
  for (int s = 0; s < p.stages - 1; ++s)
    if (s < total) issue_part(s, s, false, true);
  detail::cp_async_commit();
  for (int it = 0; it < total; ++it) {
    const int ahead = it + p.stages - 1;
    if (ahead < total) issue(ahead, ahead % p.stages);
    detail::cp_async_commit();
    // Groups after the prologue's activation group: it + 1. Unit it is complete once at most
    // min(it + 1, stages - 1) newer groups are pending (the activation group counts as older than all of them).
    detail::cp_async_wait_dynamic(it + 1 < p.stages - 1 ? it + 1 : p.stages - 1);
    compute(it % p.stages);
    if ((it + 1) % nsteps == 0) finish_tile(cluster_id + (it / nsteps) * clusters);
  }
  detail::cp_async_wait<0>();
}

template <typename T, int NB, int RB>
cudaError_t launch_typed(FlatGemmParams params, const DeviceInfo& dev, int64_t smem, const detail::Launch& launch) {
  const void* kernel = reinterpret_cast<const void*>(&flat_gemm_kernel<T, NB, RB>);
  cudaError_t err = ensure_dynamic_smem(kernel, dev.device, smem);
  if (err != cudaSuccess) return err;
  // As many clusters as are resident at once, each with ceil(tiles / clusters) tiles or one fewer.
  const int64_t resident = int64_t(resident_ctas_per_sm(kernel, dev.device, smem)) * dev.num_sms / params.split_k;
  const int64_t tiles = params.num_tiles;
  const int64_t per_cluster = (tiles + resident - 1) / (resident > 0 ? resident : 1);
  const int64_t clusters = (tiles + per_cluster - 1) / per_cluster;
  return detail::launch_kernel(flat_gemm_kernel<T, NB, RB>, unsigned(clusters * params.split_k), 128u, size_t(smem),
                               launch, params.split_k, params);
}

template <typename T>
cudaError_t launch_nb(int nb, int rb, const FlatGemmParams& params, const DeviceInfo& dev, int64_t smem,
                      const detail::Launch& launch) {
  if (rb == 2) {
    switch (nb) {
      case 2: return launch_typed<T, 2, 2>(params, dev, smem, launch);
      case 3: return launch_typed<T, 3, 2>(params, dev, smem, launch);
      case 4: return launch_typed<T, 4, 2>(params, dev, smem, launch);
      case 6: return launch_typed<T, 6, 2>(params, dev, smem, launch);
      case 8: return launch_typed<T, 8, 2>(params, dev, smem, launch);
      default: break;
    }
  } else {
    switch (nb) {
      case 1: return launch_typed<T, 1, 1>(params, dev, smem, launch);
      case 2: return launch_typed<T, 2, 1>(params, dev, smem, launch);
      case 3: return launch_typed<T, 3, 1>(params, dev, smem, launch);
      case 4: return launch_typed<T, 4, 1>(params, dev, smem, launch);
      case 6: return launch_typed<T, 6, 1>(params, dev, smem, launch);
      case 8: return launch_typed<T, 8, 1>(params, dev, smem, launch);
      default: break;
    }
  }
  set_detail("ImplB: internal error, unsupported batch block count");
  return cudaErrorInvalidValue;
}

}  // namespace

// Raises a kernel's dynamic shared memory limit once per (kernel, device) and size.
cudaError_t ensure_dynamic_smem(const void* kernel, int device, int64_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  static std::mutex mu;
  static std::unordered_map<const void*, int64_t> done[64];
  std::lock_guard<std::mutex> lock(mu);
  int64_t& have = done[device & 63][kernel];
  if (have >= bytes) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err == cudaSuccess) have = bytes;
  return err;
}

// CTAs of a kernel of `threads` threads resident per SM at this shared memory size (host query, cached).
int resident_ctas_per_sm(const void* kernel, int device, int64_t smem, int threads) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::unordered_map<int64_t, int>> cache[64];
  std::lock_guard<std::mutex> lock(mu);
  auto& per_kernel = cache[device & 63][kernel];
  auto found = per_kernel.find(smem);
  if (found != per_kernel.end()) return found->second;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, size_t(smem)) != cudaSuccess) {
    cudaGetLastError();
    blocks = 1;
  }
  if (blocks < 1) blocks = 1;
  per_kernel[smem] = blocks;
  return blocks;
}

cudaError_t launch_implb(const Problem& p, const ImplBConfig& requested, int pad_m, cudaStream_t stream) {
  if (implb_is_wgmma(requested)) {  // its own batch padding (to 32 .. 256): no padding ablation
    if (pad_m != 8) {
      set_detail("ImplB wgmma (loader 4) pads M itself: pad_m must be 8");
      return cudaErrorInvalidValue;
    }
    return launch_implb_wgmma(p, requested, stream);
  }
  if (p.m < 1 || p.m > kImplBMaxM) {
    set_detail("ImplB handles 1 <= M <= 64 (up to 256 with the wgmma loader, 4)");
    return cudaErrorInvalidValue;
  }
  if (pad_m != 8) {
#ifdef FDPP_BENCH_ABLATIONS
    if (pad_m != 16 && pad_m != 64) {
      set_detail("ImplB pad_m must be 8, 16 or 64");
      return cudaErrorInvalidValue;
    }
#else
    set_detail("ImplB pad_m 16 and 64 are the padding ablation: build with -DFDPP_BENCH_ABLATIONS=ON to run them");
    return cudaErrorNotSupported;
#endif
  }
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  const int nb = implb_batch_blocks(p.m, pad_m);
  if (implb_is_bulk(requested)) {  // a 1024-column pipeline runs as given, or not at all
    if (const char* why = implb_config_problem(requested, p.k, nb, dev.max_smem_optin, dev.cc_major)) {
      set_detail(why);
      return cudaErrorInvalidValue;
    }
    if (implb_is_pair(requested)) return launch_implb_pair(p, requested.stages, stream);
    if (implb_is_rows(requested))
      return launch_implb_stream(p, requested.stages, implb_rows_lead_units(requested, false),
                                 implb_rows_lead_units(requested, true), nb, stream);
    return launch_implb_bulk(p, requested, nb, stream);
  }
  // The profile's one config per shape serves every M, and at larger M each stage also holds more batch rows: its
  // stages are the deepest pipeline, shallower (never below 2) where that depth no longer fits in shared memory.
  //   n16 k512 s4 at M = 64 (8 batch blocks) on 227 KB: 4 stages need 344064 bytes, 3 262144 -> 2 (180224)
  ImplBConfig config = requested;
  while (config.stages > 2 && implb_smem_bytes(config, nb) > dev.max_smem_optin) --config.stages;
  if (const char* why = implb_config_problem(config, p.k, nb, dev.max_smem_optin, dev.cc_major)) {
    set_detail(why);
    return cudaErrorInvalidValue;
  }
  const int rb = implb_row_blocks_per_warp(config, nb, dev.max_smem_optin);
  FlatGemmParams params{};
  detail::fill_problem(params, p);
  params.warps_n = implb_warps_n(config);
  params.kw = implb_kw(config);
  params.stages = config.stages;
  params.split_k = config.split_k;
  params.steps_total = int((p.k + config.k_tile - 1) / config.k_tile);
  params.num_blocks = int(implb_row_blocks(p.n, p.silu_mul()));
  const int64_t blocks_per_tile = int64_t(params.warps_n) * rb;
  params.num_tiles = int((params.num_blocks + blocks_per_tile - 1) / blocks_per_tile);
  const int64_t smem = implb_smem_bytes(config, nb, rb);
  const detail::Launch launch{stream, p.pdl && hopper_paths(dev.cc_major)};
  if (p.dtype == Dtype::kBFloat16) return launch_nb<__nv_bfloat16>(nb, rb, params, dev, smem, launch);
  return launch_nb<__half>(nb, rb, params, dev, smem, launch);
}

}  // namespace gemm
}  // namespace fdpp
