// ImplB's cluster-pair kernel (loader kLoaderPair, M <= 16, sm_90): the rows kernel's cp.async streaming
// (gemm_implb_stream.cu) with each 32-row weight block split along K between the two CTAs of a cluster.
//
// Why: every CTA of the rows kernel reads all of X for its 16 rows, so at M = 8 the activations are half as many
// bytes from L2 as the weights are from HBM (16 MB against 33.5 for o). With 32 rows and half of K per CTA the same
// weight bytes come with half the activations, so M = 8 reads the activation bytes that M = 4 reads in the rows
// kernel.
//
// Work: cluster c (CTAs 2c and 2c + 1) owns rows [32c, 32c + 32) (silu_mul: 16-row blocks 2c and 2c + 1, each
// 8 gate + 8 up rows); rank r streams the 512-column units [r * half, (r + 1) * half) of K, half = ceil(units / 2).
// Each of the 8 warps owns 64 columns of every unit: it copies the 32 weight rows and the M activation rows,
// 128 bytes each, four rows per instruction, and multiplies them as two m16n8k16 row tiles by one (M <= 8) or two
// 8-row batch tiles (the K permutation of gemm_implb.cu), so the ring needs no CTA barrier. Weights come with an L2
// evict-first policy, activations from L2 without L1, as in the rows kernel.
//
// The pipeline: every stage's weights are issued before the PDL wait, the most weight bytes ahead of the release
// (fewer, or the rows1 split, lost here: docs/notes-gemm.md), then one activation group per stage, so that
// unit 0 can start when its own activations have landed.
//
// The end: warp i < 2 of each CTA adds tile i over the warps. Rank 1's two warps write their sums into rank 0's
// shared memory (distributed shared memory) and exit; rank 0's warp i adds them to its own and runs tile i's
// epilogue. So only rank 0 waits for its partner, and rank 1's SM slot is free for the next grid as soon as rank 1
// is done. Two cluster barrier phases order this: phase 0 (arrived at the top, waited for while the CTA waits for
// the previous grid anyway) says that the other CTA is running before it is written to, phase 1 that the sums have
// landed. Warps with nothing left to do exit; a cluster barrier waits only for threads that have not exited.
//
// The profile picks it per shape against the rows loaders (docs/notes-gemm.md, "ImplB pipelines").
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

constexpr int kWarps = 8;
constexpr int kRanks = 2;                                    // CTAs per cluster: one K half each
[[maybe_unused]] constexpr int kRows = 16 * kRanks;          // weight rows per cluster: one 16-row MMA tile per rank
constexpr int kUnitCols = 512;                               // columns per unit
constexpr int kWarpCols = kUnitCols / kWarps;                // 64
[[maybe_unused]] constexpr int kGroups = kWarpCols / 32;     // K groups of 32 per warp and unit: 2
constexpr int kRowBytes = kWarpCols * 2;                     // 128 bytes of a row per warp
constexpr int kPieces = kRowBytes / 16;                      // 8
[[maybe_unused]] constexpr int kRowsPerCopy = 32 / kPieces;  // row pieces one warp instruction copies: 4

// Where 16-byte piece q (0..7) of row r of a warp's slot sits: rows 128 bytes apart and piece q moved to
// q ^ (4 * (r & 1)), so that the MMA reads (rows g and g + 1 of a quarter-warp, pieces 4j .. 4j + 3) hit all 32 banks.
[[maybe_unused]] __device__ __forceinline__ uint32_t piece_offset(int r, int q) {
  return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4);
}

struct PairGemmParams : detail::KernelProblem {
  int stages;
};

// NB batch tiles of 8 activation rows (M <= 8 * NB).
template <int NB>
struct PairShared {
  // The warps' sums of both tiles. At NB = 2 they go into each warp's own ring slot instead: 8 KB more here would
  // not let two CTAs share an SM.
  float red[NB == 1 ? kWarps : 1][kRanks * 4][32];
  float other[kRanks][NB * 4][32];  // rank 0: rank 1's sums of both tiles
};
// The dynamic ring follows this struct and starts on a 128-byte line, the size of the weight row pieces it holds
// (what an offset costs: docs/notes-gemm.md).
static_assert(sizeof(PairShared<1>) % 128 == 0 && sizeof(PairShared<2>) % 128 == 0, "keep the ring 128-byte aligned");

// Clusters, compiled only where the kernel body is (sm_90+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
#endif

template <typename T, int NB>
__global__ void __launch_bounds__(kWarps * 32) flat_gemm_pair_kernel(const PairGemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char ring[];
  __shared__ PairShared<NB> shared;
  cluster_arrive_relaxed();  // phase 0: this CTA is running
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int pair = blockIdx.x / kRanks;
  const int units = (p.k + kUnitCols - 1) / kUnitCols;
  const int half = (units + 1) / 2;
  const int u0 = int(rank) * half;
  const int total = (u0 + half < units ? u0 + half : units) - u0;
  const uint64_t weight_policy = detail::l2_evict_first_policy();
  const T* w = reinterpret_cast<const T*>(p.w);
  const T* x = reinterpret_cast<const T*>(p.x);
  // A stage: per warp, 32 weight rows then M activation rows, 128 bytes each (this warp's columns).
  const int warp_slot = (kRows + p.m) * kRowBytes;
  const int stage_bytes = kWarps * warp_slot;
  unsigned char* my_ring = ring + warp * warp_slot;
  const uint32_t my_ring_u32 = detail::smem_u32(my_ring);
  const int piece = lane % kPieces, sub_row = lane / kPieces;

  // This lane's pieces: column col0 + u * kUnitCols of unit u, in weight rows 4 i + sub_row (i = 0..7) and
  // activation rows sub_row, sub_row + 4, ..., each 512 i bytes further into the warp's slot.
  const int col0 = u0 * kUnitCols + warp * kWarpCols + piece * 8;
  const uint32_t lane_offset = piece_offset(sub_row, piece);  // (4 i + sub_row) & 1 is sub_row & 1
  const T* x_lane = x + int64_t(sub_row) * p.k + col0;
  // Weight row 4 i + sub_row of the cluster's 32 at column col0 (w itself past N, where the copy is masked). Row
  // r & 15 of 16-row block pair * 2 + r / 16: LaneRows' row0 (rows 0-7) or row1 (8-15) of lane group r % 8.
  auto weight_row = [&](int i, bool& ok) -> const T* {
    const int r = kRowsPerCopy * i + sub_row;
    const detail::LaneRows rows(p.n, p.silu, pair * kRanks + (r >> 4), r & 7);
    ok = (r & 15) < 8 ? rows.ok0 : rows.ok1;
    return ok ? w + int64_t((r & 15) < 8 ? rows.row0 : rows.row1) * p.k + col0 : w;
  };
  auto issue_w = [&](int u, uint32_t slot, auto&& row_of) {
    const int du = u * kUnitCols;
    const bool col_ok = col0 + du < p.k;
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerCopy; ++i) {
      bool ok;
      const T* row = row_of(i, ok);
      ok = ok && col_ok;
      detail::cp_async16_l2(slot + lane_offset + i * kRowsPerCopy * kRowBytes, ok ? row + du : w, ok, weight_policy);
    }
  };
  auto issue_x = [&](int u, uint32_t slot) {
    const int du = u * kUnitCols;
    const bool col_ok = col0 + du < p.k;
    const T* src = x_lane + du;
    uint32_t dst = slot + kRows * kRowBytes + lane_offset;
    for (int r = sub_row; r < p.m; r += kRowsPerCopy) {
      detail::cp_async16_l2(dst, col_ok ? src : x, col_ok);
      src += int64_t(kRowsPerCopy) * p.k;
      dst += kRowsPerCopy * kRowBytes;
    }
  };

  float acc[kRanks][NB][4] = {};
  // Groups: every stage's weights before the PDL wait (one each), then one activation group per stage, then one
  // group per unit. Unit u's group (its activations for u < stages) is the (stages + u)-th either way, so a unit is
  // complete once at most stages - 1 groups are pending.
  detail::pdl_launch_dependents();
  for (int s = 0; s < p.stages; ++s) {
    if (s < total) issue_w(s, my_ring_u32 + s * stage_bytes, weight_row);
    detail::cp_async_commit();
  }
  // The prologue works each row out as it copies it, so that its first copies leave at once (all of them first
  // would delay the first copy). The refills take the rows from registers, worked out here, where the CTA waits for
  // the previous grid anyway, so no address arithmetic sits between a unit landing and its refill.
  const T* w_rows[kRows / kRowsPerCopy];
  unsigned w_rows_ok = 0;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerCopy; ++i) {
    bool ok;
    w_rows[i] = weight_row(i, ok);
    w_rows_ok |= unsigned(ok) << i;
  }
  cluster_wait();  // phase 0, off the critical path: this CTA waits for the previous grid anyway
  detail::pdl_wait_for_previous_grid();
  for (int s = 0; s < p.stages; ++s) {
    if (s < total) issue_x(s, my_ring_u32 + s * stage_bytes);
    detail::cp_async_commit();
  }

  for (int u = 0, stage = 0; u < total; ++u, stage = stage + 1 == p.stages ? 0 : stage + 1) {
    detail::cp_async_wait_dynamic(p.stages - 1);
    __syncwarp();  // every lane's copies of this unit have landed
    const unsigned char* slot = my_ring + stage * stage_bytes;
    const int col = (u0 + u) * kUnitCols + warp * kWarpCols;
    uint4 a_lo[kRanks][kGroups], a_hi[kRanks][kGroups], b[NB][kGroups];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int tile = 0; tile < kRanks; ++tile) {
        a_lo[tile][j] = detail::lds16(slot + piece_offset(16 * tile + g, 4 * j + t));      // W[row0][8t .. 8t+8)
        a_hi[tile][j] = detail::lds16(slot + piece_offset(16 * tile + g + 8, 4 * j + t));  // W[row1][same]
      }
#pragma unroll
      for (int bt = 0; bt < NB; ++bt)  // X[batch 8 bt + g][8t .. 8t+8)
        b[bt][j] = 8 * bt + g < p.m ? detail::lds16(slot + piece_offset(kRows + 8 * bt + g, 4 * j + t))
                                    : make_uint4(0, 0, 0, 0);
    }
    __syncwarp();  // the slot has been read: refill it with unit u + stages
    if (u + p.stages < total) {
      const uint32_t refill = my_ring_u32 + stage * stage_bytes;
      issue_w(u + p.stages, refill, [&](int i, bool& ok) {
        ok = (w_rows_ok >> i) & 1u;
        return w_rows[i];
      });
      issue_x(u + p.stages, refill);
    }
    detail::cp_async_commit();
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (col + 32 * j < p.k) {
#pragma unroll
        for (int tile = 0; tile < kRanks; ++tile) {
#pragma unroll
          for (int bt = 0; bt < NB; ++bt) {
            detail::mma_16816<T>(acc[tile][bt], a_lo[tile][j].x, a_hi[tile][j].x, a_lo[tile][j].y, a_hi[tile][j].y,
                                 b[bt][j].x, b[bt][j].y);
            detail::mma_16816<T>(acc[tile][bt], a_lo[tile][j].z, a_hi[tile][j].z, a_lo[tile][j].w, a_hi[tile][j].w,
                                 b[bt][j].z, b[bt][j].w);
          }
        }
      }
    }
  }
  detail::cp_async_wait<0>();

  // This CTA's K half of both tiles: warp i adds tile i over the warps. Sum i of a warp is (tile i / (4 NB),
  // batch tile i / 4 % NB, accumulator i % 4).
  auto red = [&](int from, int i) -> float& {
    if (NB == 1) return shared.red[from][i][lane];
    return reinterpret_cast<float*>(ring + from * warp_slot)[i * 32 + lane];  // 2 KB of the warp's 5 KB or more
  };
  if (NB > 1) __syncwarp();  // every lane's copies into this warp's slot have landed before it is overwritten
#pragma unroll
  for (int i = 0; i < kRanks * NB * 4; ++i) red(warp, i) = acc[i / (4 * NB)][i / 4 % NB][i % 4];
  asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory");
  if (warp >= kRanks) return;
  float sums[NB][4];
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) {
    sums[i / 4][i % 4] = 0.f;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) sums[i / 4][i % 4] += red(from, warp * NB * 4 + i);
  }
  if (rank == 1) {  // send this K half's sums of tile `warp` to rank 0
#pragma unroll
    for (int i = 0; i < NB * 4; ++i) {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                   : "=r"(remote)
                   : "r"(detail::smem_u32(&shared.other[warp][i][lane])), "r"(0));
      asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(sums[i / 4][i % 4]) : "memory");
    }
    cluster_arrive_release();  // phase 1: the sums are in rank 0's shared memory
    return;
  }
  cluster_arrive_relaxed();
  cluster_wait();  // phase 1
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) sums[i / 4][i % 4] += shared.other[warp][i][lane];
  detail::store_block<T, NB>(sums, detail::LaneRows(p.n, p.silu, pair * kRanks + warp, g), t, p.m, p.n, p.silu, p.bias,
                             p.residual, p.y);
#endif
}

template <typename T, int NB>
cudaError_t launch_typed(const PairGemmParams& params, const DeviceInfo& dev, int64_t smem, int grid,
                         const detail::Launch& launch) {
  auto kernel = flat_gemm_pair_kernel<T, NB>;
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), dev.device, smem);
  if (err != cudaSuccess) return err;
  return detail::launch_kernel(kernel, unsigned(grid), unsigned(kWarps * 32), size_t(smem), launch, 2, params);
}

}  // namespace

cudaError_t launch_implb_pair(const Problem& p, int stages, cudaStream_t stream) {
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (p.m < 1 || p.m > 16 || stages < 2 || stages > 3 || !hopper_paths(dev.cc_major)) {
    set_detail("ImplB pair: needs M <= 16, 2 or 3 stages and a compute capability 9.x GPU");
    return cudaErrorInvalidValue;
  }
  // Two CTAs per SM, as in the rows kernel: fewer stages where M's activation rows would not let two fit
  // (228 KB per SM, 1 KB reserved per CTA).
  const bool two_batch_tiles = p.m > 8;
  const int64_t per_cta_extra = 1024 + int64_t(two_batch_tiles ? sizeof(PairShared<2>) : sizeof(PairShared<1>));
  while (stages > 2 && 2 * (implb_pair_smem_bytes(stages, p.m) + per_cta_extra) > 228 * 1024) --stages;
  const int64_t blocks = implb_row_blocks(p.n, p.silu_mul());
  const int grid = int(2 * ((blocks + 1) / 2));  // one cluster of two per pair of 16-row blocks
  int64_t smem = implb_pair_smem_bytes(stages, p.m);
  // Never three CTAs per SM for a grid that fits one wave at two: the CTAs would crowd some SMs and leave others
  // half used, so more shared memory keeps it at two. Example: o at M = 1, 2 stages: three would fit
  // (3 * (67584 + 10240) <= 228 KB), so the padding keeps them at two. (Grids of several waves would gain from a
  // third, but with the refills'
  // row pointers in registers, 110 per thread, a third never fits the register file anyway.)
  if (grid <= 2 * dev.num_sms)
    while (3 * (smem + per_cta_extra) <= 228 * 1024) smem += 1024;
  if (smem > dev.max_smem_optin) {
    set_detail("ImplB pair: two stages need more shared memory than the GPU has");
    return cudaErrorInvalidValue;
  }
  PairGemmParams params{};
  detail::fill_problem(params, p);
  params.stages = stages;
  const detail::Launch launch{stream, p.pdl};  // hopper_paths holds: checked above
  if (two_batch_tiles)
    return p.dtype == Dtype::kBFloat16 ? launch_typed<__nv_bfloat16, 2>(params, dev, smem, grid, launch)
                                       : launch_typed<__half, 2>(params, dev, smem, grid, launch);
  return p.dtype == Dtype::kBFloat16 ? launch_typed<__nv_bfloat16, 1>(params, dev, smem, grid, launch)
                                     : launch_typed<__half, 1>(params, dev, smem, grid, launch);
}

}  // namespace gemm
}  // namespace fdpp
