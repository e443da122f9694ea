// ImplB with the tensor memory accelerator (sm_90, M <= 16): the flat GEMM of gemm_implb.cu with its weight
// stream moved from per-thread 16-byte cp.async to TMA copies of whole tiles, issued by a producer warp.
//
// Why: copy-engine transfers need neither registers nor many warps to keep bytes in flight: one CTA per SM with a
// few 16-32 KB transfers in flight streams the weight, where per-thread cp.async needs many warps to do the same
// (docs/notes-gemm.md). The copy engine pays per copy, so a unit here is two 3-D tensor copies, not separate
// one-dimensional bulk copies of 1-2 KB row pieces.
//
// The math is ImplB's: Y^T = W X^T with 16 weight rows on the MMA's M side and the batch padded to 8 on its
// 8-wide side (two batch blocks up to M = 16), mma.sync m16n8k16, fp32 accumulators, the same K permutation
// (lane (g, t) holds W[row][8t .. 8t+8) of every 32-wide K group and X[batch g][same]).
//
// Work: a CTA takes a contiguous range of 16-row blocks; a unit is one block times KT columns. W is described
// to the TMA as [rows][K / 64][64] (64-column chunks of 128 bytes), so one unit is two boxes of 8 rows x KT / 64
// chunks (rows 0-7 and 8-15 of the block; with silu_mul the 8 gate rows and their 8 up rows), landing as
// [row][chunk][128 B] with the 128-byte swizzle (16-byte piece u of chunk c sits at u ^ (c % 8)).
//
// Warps: one producer thread fills a `stages`-deep ring (a full and an empty mbarrier per stage) and never
// waits for the previous grid, since it reads only the weight. Eight consumer warps take the unit's 32-wide K
// groups in turn: they copy their pieces to registers, release the stage, and multiply; X comes through L1 into
// registers two units ahead. Eight consumers, not four: with four, the MMA and load latency of one unit, not
// bandwidth, limited the kernel. At the end of a block the consumers' partial sums meet
// in shared memory (double-buffered by block parity, so no warp waits for warp 0's epilogue) and warp 0 stores.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/common/tensor_map.h"
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

using detail::Elem;

constexpr int kBulkRows = 16;  // weight rows per unit (one m16 block)
constexpr int kBulkMaxStages = 4;
constexpr int kBulkWarps = 8;                        // consumer warps
constexpr int kBulkThreads = (kBulkWarps + 1) * 32;  // and one producer warp
static_assert(kBulkRows == 16 && kBulkMaxStages == 4, "one m16 block per unit; the configs allow 2 to 4 stages");

struct BulkGemmParams : detail::KernelProblem {
  int k_tile;  // columns per unit
  int stages;
  int steps;       // units per block: ceil(k / k_tile)
  int num_blocks;  // 16-row blocks (silu: 8 gate + 8 up rows)
};

// Device helpers, compiled only where the kernel body is (sm_90+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(detail::smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(detail::smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait_again:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_again;\n}\n" ::"r"(detail::smem_u32(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(detail::smem_u32(bar)) : "memory");
}

// Box (0, chunk, row) of the 3-D tensor map -> shared memory (1024-byte aligned); its bytes complete on bar.
__device__ __forceinline__ void tma_load_box(uint32_t dst, const CUtensorMap* map, int chunk, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n"
      :
      : "r"(dst), "l"(map), "r"(0), "r"(chunk), "r"(row), "r"(detail::smem_u32(bar))
      : "memory");
}
#endif

template <typename T, int NB, int KT>
__global__ void __launch_bounds__(kBulkThreads)
    flat_gemm_bulk_kernel(const __grid_constant__ CUtensorMap wmap, const BulkGemmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kRowBytes = KT * 2;
  constexpr int kStageBytes = kBulkRows * kRowBytes;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes: stages start on that boundary (the launcher adds the slack).
  unsigned char* ring = smem_raw + ((1024 - (detail::smem_u32(smem_raw) & 1023)) & 1023);
  __shared__ __align__(8) uint64_t full[kBulkMaxStages];   // the stage's weights have landed
  __shared__ __align__(8) uint64_t empty[kBulkMaxStages];  // every consumer warp is done with the stage
  __shared__ float red[2][kBulkWarps][NB * 4][32];         // per block parity: the warps' partial sums
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int block0 = int(int64_t(blockIdx.x) * p.num_blocks / gridDim.x);
  const int block1 = int(int64_t(blockIdx.x + 1) * p.num_blocks / gridDim.x);
  const int total = (block1 - block0) * p.steps;
  const uint32_t ring_u32 = detail::smem_u32(ring);

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kBulkWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  detail::pdl_launch_dependents();

  if (warp == kBulkWarps) {
    // The producer: one thread streams the weight, two 8-row boxes per unit (the TMA counts every byte of a
    // box, those of rows past N, zero-filled, included). It reads nothing another kernel writes, so it never
    // waits for the previous grid: with programmatic dependent launch it starts while that grid still runs.
    if (lane == 0) {
      for (int u = 0; u < total; ++u) {
        const int slot = u % p.stages;
        if (u >= p.stages) mbar_wait(&empty[slot], ((u / p.stages) - 1) & 1);
        const detail::LaneRows r(p.n, p.silu, block0 + u / p.steps, 0);
        const int chunk = (u % p.steps) * (KT / 64);
        const uint32_t dst = ring_u32 + slot * kStageBytes;
        mbar_arrive_expect_tx(&full[slot], kStageBytes);
        tma_load_box(dst, &wmap, chunk, r.row0, &full[slot]);
        tma_load_box(dst + kStageBytes / 2, &wmap, chunk, r.row1, &full[slot]);
      }
    }
    return;
  }

  // The consumers. X, bias, residual and Y only after the previous grid is done.
  detail::pdl_wait_for_previous_grid();
  const T* x = reinterpret_cast<const T*>(p.x);
  float acc[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;

  // X of a unit: this lane's 16 bytes of each of the warp's K groups, loaded two units ahead into registers (two
  // buffers) so that their L2 latency -- every CTA reads all of X, so little of it stays in L1 -- hides behind
  // a whole unit of streaming.
  constexpr int kIters = KT / 32 / kBulkWarps;
  using XRegs = uint4[kIters][NB];
  auto load_x = [&](XRegs& xr, int u) {
    const int col = (u % p.steps) * KT;
    const int groups = (p.k - col < KT ? p.k - col : KT) >> 5;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int j = warp + i * kBulkWarps;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        const int mrow = nb * 8 + g;
        xr[i][nb] = j < groups && mrow < p.m ? detail::ld_cached16(x + int64_t(mrow) * p.k + col + 32 * j + 8 * t)
                                             : make_uint4(0, 0, 0, 0);
      }
    }
  };

  auto run_unit = [&](int u, XRegs& xr) {
    const int slot = u % p.stages;
    mbar_wait(&full[slot], (u / p.stages) & 1);
    const int col = (u % p.steps) * KT;
    const int groups = (p.k - col < KT ? p.k - col : KT) >> 5;
    const unsigned char* row_lo = ring + slot * kStageBytes + g * kRowBytes;
    const unsigned char* row_hi = row_lo + 8 * kRowBytes;
    uint4 a_lo[kIters], a_hi[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      // Group j is half j % 2 of chunk j / 2: 16-byte piece 4 (j % 2) + t, swizzled by the chunk.
      const int j = warp + i * kBulkWarps;
      const int piece = (j >> 1) * 128 + (((((j & 1) << 2) | t) ^ ((j >> 1) & 7)) << 4);
      if (j < groups) {
        a_lo[i] = detail::lds16(row_lo + piece);  // W[row0][col + 32j + 8t .. + 8)
        a_hi[i] = detail::lds16(row_hi + piece);  // W[row1][same]
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);  // the stage is in registers: the producer may refill it
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (warp + i * kBulkWarps < groups) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          detail::mma_16816<T>(acc[nb], a_lo[i].x, a_hi[i].x, a_lo[i].y, a_hi[i].y, xr[i][nb].x, xr[i][nb].y);
          detail::mma_16816<T>(acc[nb], a_lo[i].z, a_hi[i].z, a_lo[i].w, a_hi[i].w, xr[i][nb].z, xr[i][nb].w);
        }
      }
    }
    if (u + 2 < total) load_x(xr, u + 2);
    if (u % p.steps == p.steps - 1) {  // the block is complete: add the warps' K shares, epilogue, store
      const int b = u / p.steps;
      detail::finish_block<T, NB, kBulkWarps>(acc, red[b & 1], warp, lane, block0 + b, p);
    }
  };

  XRegs x_even, x_odd;
  if (total > 0) load_x(x_even, 0);
  if (total > 1) load_x(x_odd, 1);
  for (int u = 0; u < total; u += 2) {
    run_unit(u, x_even);
    if (u + 1 < total) run_unit(u + 1, x_odd);
  }
#else
  __trap();  // never launched there: implb_config_problem admits TMA configs only where the sm_90a code runs
#endif
}

template <typename T, int NB, int KT>
cudaError_t launch_typed(const CUtensorMap& wmap, const BulkGemmParams& params, const DeviceInfo& dev, int64_t smem,
                         const detail::Launch& launch) {
  auto kernel = flat_gemm_bulk_kernel<T, NB, KT>;
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), dev.device, smem);
  if (err != cudaSuccess) return err;
  // One CTA per SM at most, each with an equal share (+-1) of the 16-row blocks.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(params.num_blocks < dev.num_sms ? params.num_blocks : dev.num_sms));
  cfg.blockDim = dim3(kBulkThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = launch.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = launch.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, wmap, params);
}

// W [n][k] as the TMA sees it: [rows][k / 64][64] with boxes of 8 rows x KT / 64 chunks, 128-byte swizzle.
cudaError_t encode_weight_map(const Problem& p, int k_tile, CUtensorMap* map) {
  const cuuint64_t dims[3] = {64, cuuint64_t(p.k / 64), cuuint64_t(p.n)};
  const cuuint64_t strides[2] = {128, cuuint64_t(p.k) * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(k_tile / 64), 8};
  const cudaError_t err = detail::encode_tile_map(map, p.dtype, 3, p.w, dims, strides, box);
  // a driver without the encoder keeps its own message and cudaErrorNotSupported
  if (err == cudaErrorInvalidValue)
    set_detail("ImplB TMA: cuTensorMapEncodeTiled refused the weight (it must be 16-byte aligned)");
  return err;
}

template <typename T>
cudaError_t launch_dtype(const CUtensorMap& wmap, const BulkGemmParams& params, int batch_blocks, const DeviceInfo& dev,
                         int64_t smem, const detail::Launch& launch) {
  return batch_blocks == 1 ? launch_typed<T, 1, 1024>(wmap, params, dev, smem, launch)
                           : launch_typed<T, 2, 1024>(wmap, params, dev, smem, launch);
}

}  // namespace

namespace detail {

// Encoding is host work only (the driver function: kernels/common/tensor_map.h).
cudaError_t encode_tile_map(CUtensorMap* map, Dtype dtype, int rank, const void* base, const cuuint64_t* dims,
                            const cuuint64_t* strides, const cuuint32_t* box) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    set_detail("ImplB TMA: the driver has no cuTensorMapEncodeTiled");
    return cudaErrorNotSupported;
  }
  const cuuint32_t steps[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      dtype == Dtype::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult res = encode(map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides, box, steps,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace detail

cudaError_t launch_implb_bulk(const Problem& p, const ImplBConfig& config, int batch_blocks, cudaStream_t stream) {
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (const char* why = implb_config_problem(config, p.k, batch_blocks, dev.max_smem_optin, dev.cc_major)) {
    set_detail(why);
    return cudaErrorInvalidValue;
  }
  BulkGemmParams params{};
  detail::fill_problem(params, p);
  params.k_tile = config.k_tile;
  params.stages = config.stages;
  params.steps = int((p.k + config.k_tile - 1) / config.k_tile);
  params.num_blocks = int(implb_row_blocks(p.n, p.silu_mul()));
  CUtensorMap wmap;
  err = encode_weight_map(p, config.k_tile, &wmap);
  if (err != cudaSuccess) return err;
  const int64_t smem = implb_smem_bytes(config, batch_blocks);  // includes the 1024 bytes of alignment slack
  const detail::Launch launch{stream, p.pdl};  // hopper_paths holds: implb_config_problem admits TMA only there
  if (p.dtype == Dtype::kBFloat16) return launch_dtype<__nv_bfloat16>(wmap, params, batch_blocks, dev, smem, launch);
  return launch_dtype<__half>(wmap, params, batch_blocks, dev, smem, launch);
}

}  // namespace gemm
}  // namespace fdpp
