// ImplB's cluster-pair kernel (loader kLoaderPair, M <= 8, sm_90): the rows kernel's cp.async streaming
// (gemm_implb_stream.cu) with each 32-row weight block split along K between the two CTAs of a cluster.
//
// Why: every CTA of the rows kernel reads all of X for its 16 rows, so at M = 8 the activations are half as many
// bytes from L2 as the weights are from HBM (16 MB against 33.5 for o). With 32 rows and half of K per CTA the same
// weight bytes come with half the activations. Same run (run 89, o, us, M = 1 / 2 / 4 / 8): rows1 9.18 / 9.32 /
// 9.30 / 9.59, this kernel 8.77 / 8.86 / 8.90 / 8.92; and copying only 4 of M = 8 activation rows (a wrong-output
// diagnostic, run 88) took o from 9.58 to 8.99 us, the M = 4 time.
//
// Work: cluster c (CTAs 2c and 2c + 1) owns rows [32c, 32c + 32) (silu_mul: 16-row blocks 2c and 2c + 1, each
// 8 gate + 8 up rows); rank r streams the 512-column units [r * half, (r + 1) * half) of K, half = ceil(units / 2).
// Each of the 8 warps owns 64 columns of every unit: it copies the 32 weight rows and the M activation rows,
// 128 bytes each, four rows per instruction, one commit group per unit, and multiplies them as two m16n8k16 row
// tiles (the K permutation of gemm_implb.cu), so the ring needs no CTA barrier. Every stage's weights are issued
// before the PDL wait (one unit ahead was slower here: run 90, o M = 1 9.42 against 8.98 us).
//
// The end: the warps' sums meet in shared memory (warp 0 adds them), rank 1's warp 0 writes its K half's sums into
// rank 0's shared memory (distributed shared memory), and rank 0's warp 0 adds them and runs the epilogue. Two
// cluster barrier phases order this: phase 0 (arrived at the top) says that rank 0 is running before rank 1 writes
// to it; phase 1 that the sums have landed. Warps that have nothing left to do exit; a cluster barrier waits only
// for threads that have not exited.
#include "kernels/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 32;                      // weight rows per cluster (two 16-row MMA tiles)
constexpr int kUnitCols = 512;                 // columns per unit
constexpr int kWarpCols = kUnitCols / kWarps;  // 64
constexpr int kGroups = kWarpCols / 32;        // K groups of 32 per warp and unit: 2
constexpr int kRowBytes = kWarpCols * 2;       // 128 bytes of a row per warp
constexpr int kPieces = kRowBytes / 16;        // 8
constexpr int kRowsPerCopy = 32 / kPieces;     // row pieces one warp instruction copies: 4
constexpr int kSums = 2 * 4;                   // accumulators per lane: two row tiles x 4 (one batch block)

// Where 16-byte piece q (0..7) of row r of a warp's slot sits: rows 128 bytes apart and piece q moved to
// q ^ (4 * (r & 1)), so that the MMA reads (rows g and g + 1 of a quarter-warp, pieces 4j .. 4j + 3) hit all 32 banks.
__device__ __forceinline__ uint32_t piece_offset(int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); }

struct PairGemmParams {
  const void* x;
  const void* w;
  const void* bias;
  const void* residual;
  void* y;
  int m, n, k;
  int silu;
  int stages;
};

struct PairShared {
  float red[kWarps][kSums][32];  // the warps' sums
  float other[kSums][32];        // rank 1's sums (rank 0 only)
};

// Clusters, compiled only where the kernel body is (sm_90+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
#endif

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) flat_gemm_pair_kernel(const PairGemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char ring[];
  __shared__ PairShared shared;
  cluster_arrive_relaxed();  // phase 0: this CTA is running
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int pair = blockIdx.x >> 1;
  const int units = (p.k + kUnitCols - 1) / kUnitCols;
  const int half = (units + 1) / 2;
  const int u0 = int(rank) * half;
  const int total = (u0 + half < units ? u0 + half : units) - u0;
  const T* w = reinterpret_cast<const T*>(p.w);
  const T* x = reinterpret_cast<const T*>(p.x);
  // A stage: per warp, 32 weight rows then M activation rows, 128 bytes each (this warp's columns).
  const int warp_slot = (kRows + p.m) * kRowBytes;
  const int stage_bytes = kWarps * warp_slot;
  unsigned char* my_ring = ring + warp * warp_slot;
  const uint32_t my_ring_u32 = detail::smem_u32(my_ring);
  const int piece = lane % kPieces, sub_row = lane / kPieces;

  auto col_of = [&](int u) { return (u0 + u) * kUnitCols + warp * kWarpCols + piece * 8; };
  auto slot_of = [&](int u) { return my_ring_u32 + (u % p.stages) * stage_bytes; };
  auto issue_x = [&](int u) {  // through L1: both CTAs of an SM read the same rows
    const int col = col_of(u);
    for (int r = sub_row; r < p.m; r += kRowsPerCopy)
      detail::cp_async16_ca(slot_of(u) + piece_offset(kRows + r, piece), col < p.k ? x + int64_t(r) * p.k + col : x,
                            col < p.k);
  };
  auto issue_w = [&](int u) {
    const int col = col_of(u);
    const uint32_t slot = slot_of(u);
#pragma unroll
    for (int r0 = 0; r0 < kRows; r0 += kRowsPerCopy) {
      const int r = r0 + sub_row;
      // Row r & 15 of 16-row block pair * 2 + r / 16: LaneRows' row0 (rows 0-7) or row1 (8-15) of lane group r % 8.
      const detail::LaneRows rows(p.n, p.silu, pair * 2 + (r >> 4), r & 7);
      const int row = (r & 15) < 8 ? rows.row0 : rows.row1;
      const bool ok = ((r & 15) < 8 ? rows.ok0 : rows.ok1) && col < p.k;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(slot + piece_offset(r, piece)),
                   "l"(ok ? w + int64_t(row) * p.k + col : w), "r"(ok ? 16 : 0)
                   : "memory");
    }
  };

  float acc[2][4] = {};
  // Every stage's weights before the PDL wait (one group each), their activations in one group after it, then
  // one group per unit. Unit u < stages is complete once at most u groups are pending, every later unit once at
  // most stages - 1 are.
  detail::pdl_launch_dependents();
  for (int s = 0; s < p.stages; ++s) {
    if (s < total) issue_w(s);
    detail::cp_async_commit();
  }
  detail::pdl_wait_for_previous_grid();
  for (int s = 0; s < p.stages && s < total; ++s) issue_x(s);
  detail::cp_async_commit();

  for (int u = 0; u < total; ++u) {
    detail::cp_async_wait_dynamic(u < p.stages ? u : p.stages - 1);
    __syncwarp();  // every lane's copies of this unit have landed
    const unsigned char* slot = my_ring + (u % p.stages) * stage_bytes;
    const int col = (u0 + u) * kUnitCols + warp * kWarpCols;
    uint4 a_lo[2][kGroups], a_hi[2][kGroups], b[kGroups];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        a_lo[tile][j] = detail::lds16(slot + piece_offset(16 * tile + g, 4 * j + t));      // W[row0][8t .. 8t+8)
        a_hi[tile][j] = detail::lds16(slot + piece_offset(16 * tile + g + 8, 4 * j + t));  // W[row1][same]
      }
      b[j] = g < p.m ? detail::lds16(slot + piece_offset(kRows + g, 4 * j + t)) : make_uint4(0, 0, 0, 0);
    }
    __syncwarp();  // the slot has been read: refill it with unit u + stages
    if (u + p.stages < total) {
      issue_w(u + p.stages);
      issue_x(u + p.stages);
    }
    detail::cp_async_commit();
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (col + 32 * j < p.k) {
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          detail::mma_16816<T>(acc[tile], a_lo[tile][j].x, a_hi[tile][j].x, a_lo[tile][j].y, a_hi[tile][j].y, b[j].x,
                               b[j].y);
          detail::mma_16816<T>(acc[tile], a_lo[tile][j].z, a_hi[tile][j].z, a_lo[tile][j].w, a_hi[tile][j].w, b[j].z,
                               b[j].w);
        }
      }
    }
  }
  detail::cp_async_wait<0>();

  // This CTA's K half: the warps' sums into warp 0.
#pragma unroll
  for (int i = 0; i < kSums; ++i) shared.red[warp][i][lane] = acc[i / 4][i % 4];
  asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory");
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < kSums; ++i)
#pragma unroll
    for (int other = 1; other < kWarps; ++other) acc[i / 4][i % 4] += shared.red[other][i][lane];
  cluster_wait();  // phase 0: both CTAs are running
  if (rank == 1) {
#pragma unroll
    for (int i = 0; i < kSums; ++i) {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(remote) : "r"(detail::smem_u32(&shared.other[i][lane])));
      asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(acc[i / 4][i % 4]) : "memory");
    }
    cluster_arrive_release();  // phase 1: the sums are in rank 0's shared memory
    return;
  }
  cluster_arrive_relaxed();
  cluster_wait();  // phase 1
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    float sums[1][4];
#pragma unroll
    for (int q = 0; q < 4; ++q) sums[0][q] = acc[tile][q] + shared.other[tile * 4 + q][lane];
    detail::store_block<T, 1>(sums, detail::LaneRows(p.n, p.silu, pair * 2 + tile, g), t, p.m, p.n, p.silu, p.bias,
                              p.residual, p.y);
  }
#endif
}

template <typename T>
cudaError_t launch_typed(const PairGemmParams& params, const DeviceInfo& dev, int64_t smem, int grid,
                         cudaStream_t stream) {
  auto kernel = flat_gemm_pair_kernel<T>;
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), dev.device, smem);
  if (err != cudaSuccess) return err;
  return detail::launch_kernel(kernel, unsigned(grid), unsigned(kWarps * 32), size_t(smem), stream, 2, params);
}

}  // namespace

cudaError_t launch_implb_pair(const Problem& p, int stages, cudaStream_t stream) {
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (p.m < 1 || p.m > 8 || stages < 2 || stages > 3 || !hopper_paths(dev.cc_major)) {
    set_detail("ImplB pair: needs M <= 8, 2 or 3 stages and a compute capability 9.x GPU");
    return cudaErrorInvalidValue;
  }
  // Two CTAs per SM, as in the rows kernel: fewer stages where M's activation rows would not let two fit
  // (228 KB per SM, 1 KB reserved per CTA).
  const int64_t per_cta_extra = 1024 + int64_t(sizeof(PairShared));
  while (stages > 2 && 2 * (implb_pair_smem_bytes(stages, p.m) + per_cta_extra) > 228 * 1024) --stages;
  const int64_t smem = implb_pair_smem_bytes(stages, p.m);
  if (smem > dev.max_smem_optin) {
    set_detail("ImplB pair: two stages need more shared memory than the GPU has");
    return cudaErrorInvalidValue;
  }
  PairGemmParams params{};
  detail::fill_problem(params, p);
  params.stages = stages;
  const int64_t blocks = implb_row_blocks(p.n, p.silu_mul());
  const int grid = int(2 * ((blocks + 1) / 2));  // one cluster of two per pair of 16-row blocks
  if (p.dtype == Dtype::kBFloat16) return launch_typed<__nv_bfloat16>(params, dev, smem, grid, stream);
  return launch_typed<__half>(params, dev, smem, grid, stream);
}

}  // namespace gemm
}  // namespace fdpp
