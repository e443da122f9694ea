// ImplB for the larger batches (loader kLoaderWgmma, sm_90a, M <= 256): the flat GEMM's swap-AB on warpgroup MMAs.
//
// Why: mma.sync ImplB (gemm_implb.cu) puts the batch on the MMA's 8-wide N side, and past M = 16-64 its issue rate
// no longer keeps up with the weight stream, so the profiles handed those M to cuBLASLt, which reads the weights of
// llama2-7b's decode GEMMs well below a streaming read (docs/notes-gemm.md). Up to M = 256 these GEMMs still read
// fewer bytes per FLOP than the H200's tensor cores can consume, so one wgmma per 64 weight rows x 16 K with the
// whole batch as its N (up to 256) keeps them fed with a fraction of the issue slots.
//
// The math: Y^T = W X^T. A consumer warpgroup's wgmma takes 64 weight rows as A (M side) and the batch rows, padded
// to bn = 32, 64, 128 or 256, as B (N side); both are K-major in shared memory with the 128-byte swizzle, exactly as
// W [N, K] and X [M, K] lie in global memory, so the tensor memory accelerator copies them without any transpose.
//
// Work: a CTA owns one tile of 128 weight rows (silu_mul: 64 gate rows and the matching 64 up rows, one warpgroup
// each) and, with split_k > 1, one of split_k contiguous K ranges; the split_k CTAs of a tile form a thread-block
// cluster. A stage is 64 columns: one TMA box of the tile's weight rows (two for silu_mul) and one of X's bn rows
// (rows past M and columns past K are zero-filled by the copy engine, so neither needs padding in memory).
//
// Warps: warpgroup 0 is the producer (one thread issues the copies into a `stages`-deep ring with a full and an
// empty mbarrier per stage; it lowers its register budget with setmaxnreg), warpgroups 1 and 2 the consumers (64 rows
// each, accumulators in registers, raised budget). One CTA per SM, or two up to bn 64 where the stages fit twice
// (launch_typed). A consumer keeps one stage's wgmma group in flight: it releases a
// stage once the group after it has been issued and the stage's own group has completed.
//
// Programmatic dependent launch: the producer issues the weights of the first `stages` stages, then waits for the
// previous grid before its first activation copy; the consumers wait before touching bias, residual or Y.
//
// The end: the consumers store their fp32 sums transposed, [batch][row], into the (now idle) ring; with split_k > 1
// the cluster synchronizes and CTA rank r adds the K ranges of batch rows [r M / split, (r + 1) M / split) across
// the cluster's shared memory (distributed shared memory); then bias, silu_mul (gate row i and up row i are staged
// 64 columns apart) and residual, and coalesced stores of Y. One kernel, no workspace, the epilogue once.
#include <cooperative_groups.h>

#include <type_traits>

#include "kernels/attention/attention_wgmma.cuh"
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

namespace cg = cooperative_groups;
using attn::keep_registers;
using attn::mbar_arrive;
using attn::mbar_init;
using attn::mbar_wait;
using attn::sw128_desc;

constexpr int kThreads = 3 * 128;  // the producer warpgroup and two consumers
[[maybe_unused]] constexpr int kConsumerThreads = 2 * 128;
[[maybe_unused]] constexpr int kWeightBytes = kWgmmaTileRows * 128;          // one stage's weight rows: 16 KB
[[maybe_unused]] constexpr int kStageRow = kWgmmaTileRows + kWgmmaStagePad;  // floats per staged batch row

struct WgmmaParams : detail::KernelProblem {
  int stages;
  int steps;    // 64-column steps along K
  int split_k;  // CTAs of a cluster along K
};

#if FDPP_WGMMA
// setmaxnreg budgets by CTAs per SM: the CTA's registers (kThreads times the launch-bound cap ptxas gives the kernel,
// 168 for one CTA per SM, 80 for two) split between the producer warpgroup and the two consumers.
template <int kCtas>
struct Regs;
template <>
struct Regs<1> {
  static constexpr int kProducer = 40, kConsumer = 232;  // 128 * 40 + 256 * 232 = 64512 = 384 * 168
};
template <>
struct Regs<2> {
  static constexpr int kProducer = 24, kConsumer = 104;  // 128 * 24 + 256 * 104 = 29696 <= 384 * 80
};

// wgmma.mma_async m64nBNk16, both operands K-major from shared memory (descriptors), fp32 accumulate (scale-d 1).
// d[i / 4][i % 4] is accumulator register i: per warp the m16n8 fragment layout repeated along N.
template <typename T, int BN>
__device__ __forceinline__ void wgmma_ss(float (&d)[BN / 8][4], uint64_t a, uint64_t b);

// The PTX strings and operand lists below are laid out by hand:
// clang-format off
#define FDPP_GEMM_WGMMA_SS_N32(CTY, TY)                                                                                \
  template <>                                                                                                          \
  __device__ __forceinline__ void wgmma_ss<CTY, 32>(float (&d)[4][4], uint64_t a, uint64_t b) {                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." #TY "." #TY " {"                                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                \
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"                                                                    \
                 : FDPP_WGMMA_ROW(d, 0), FDPP_WGMMA_ROW(d, 1), FDPP_WGMMA_ROW(d, 2), FDPP_WGMMA_ROW(d, 3)              \
                 : "l"(a), "l"(b));                                                                                    \
  }

#define FDPP_GEMM_WGMMA_SS_N64(CTY, TY)                                                                                \
  template <>                                                                                                          \
  __device__ __forceinline__ void wgmma_ss<CTY, 64>(float (&d)[8][4], uint64_t a, uint64_t b) {                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {"                                        \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                      \
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                    \
                 : FDPP_WGMMA_ROW(d, 0), FDPP_WGMMA_ROW(d, 1), FDPP_WGMMA_ROW(d, 2), FDPP_WGMMA_ROW(d, 3),             \
                   FDPP_WGMMA_ROW(d, 4), FDPP_WGMMA_ROW(d, 5), FDPP_WGMMA_ROW(d, 6), FDPP_WGMMA_ROW(d, 7)              \
                 : "l"(a), "l"(b));                                                                                    \
  }

#define FDPP_GEMM_WGMMA_SS_N128(CTY, TY)                                                                               \
  template <>                                                                                                          \
  __device__ __forceinline__ void wgmma_ss<CTY, 128>(float (&d)[16][4], uint64_t a, uint64_t b) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TY "." #TY " {"                                       \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                     \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                     \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                      \
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                    \
                 : FDPP_WGMMA_ROW(d, 0), FDPP_WGMMA_ROW(d, 1), FDPP_WGMMA_ROW(d, 2), FDPP_WGMMA_ROW(d, 3),             \
                   FDPP_WGMMA_ROW(d, 4), FDPP_WGMMA_ROW(d, 5), FDPP_WGMMA_ROW(d, 6), FDPP_WGMMA_ROW(d, 7),             \
                   FDPP_WGMMA_ROW(d, 8), FDPP_WGMMA_ROW(d, 9), FDPP_WGMMA_ROW(d, 10), FDPP_WGMMA_ROW(d, 11),           \
                   FDPP_WGMMA_ROW(d, 12), FDPP_WGMMA_ROW(d, 13), FDPP_WGMMA_ROW(d, 14), FDPP_WGMMA_ROW(d, 15)          \
                 : "l"(a), "l"(b));                                                                                    \
  }

#define FDPP_GEMM_WGMMA_SS_N256(CTY, TY)                                                                               \
  template <>                                                                                                          \
  __device__ __forceinline__ void wgmma_ss<CTY, 256>(float (&d)[32][4], uint64_t a, uint64_t b) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                            \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." #TY "." #TY " {"                                       \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                               \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                     \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                     \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"                     \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"                     \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"                     \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"         \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"      \
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"                                                                  \
                 : FDPP_WGMMA_ROW(d, 0), FDPP_WGMMA_ROW(d, 1), FDPP_WGMMA_ROW(d, 2), FDPP_WGMMA_ROW(d, 3),             \
                   FDPP_WGMMA_ROW(d, 4), FDPP_WGMMA_ROW(d, 5), FDPP_WGMMA_ROW(d, 6), FDPP_WGMMA_ROW(d, 7),             \
                   FDPP_WGMMA_ROW(d, 8), FDPP_WGMMA_ROW(d, 9), FDPP_WGMMA_ROW(d, 10), FDPP_WGMMA_ROW(d, 11),           \
                   FDPP_WGMMA_ROW(d, 12), FDPP_WGMMA_ROW(d, 13), FDPP_WGMMA_ROW(d, 14), FDPP_WGMMA_ROW(d, 15),         \
                   FDPP_WGMMA_ROW(d, 16), FDPP_WGMMA_ROW(d, 17), FDPP_WGMMA_ROW(d, 18), FDPP_WGMMA_ROW(d, 19),         \
                   FDPP_WGMMA_ROW(d, 20), FDPP_WGMMA_ROW(d, 21), FDPP_WGMMA_ROW(d, 22), FDPP_WGMMA_ROW(d, 23),         \
                   FDPP_WGMMA_ROW(d, 24), FDPP_WGMMA_ROW(d, 25), FDPP_WGMMA_ROW(d, 26), FDPP_WGMMA_ROW(d, 27),         \
                   FDPP_WGMMA_ROW(d, 28), FDPP_WGMMA_ROW(d, 29), FDPP_WGMMA_ROW(d, 30), FDPP_WGMMA_ROW(d, 31)          \
                 : "l"(a), "l"(b));                                                                                    \
  }

FDPP_GEMM_WGMMA_SS_N32(__half, f16)
FDPP_GEMM_WGMMA_SS_N32(__nv_bfloat16, bf16)
FDPP_GEMM_WGMMA_SS_N64(__half, f16)
FDPP_GEMM_WGMMA_SS_N64(__nv_bfloat16, bf16)
FDPP_GEMM_WGMMA_SS_N128(__half, f16)
FDPP_GEMM_WGMMA_SS_N128(__nv_bfloat16, bf16)
FDPP_GEMM_WGMMA_SS_N256(__half, f16)
FDPP_GEMM_WGMMA_SS_N256(__nv_bfloat16, bf16)
// clang-format on

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Box {k0, row} of a 2-D tensor map into shared memory (1024-byte aligned); its bytes complete on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int k0, int row, uint32_t bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(map), "r"(k0), "r"(row), "r"(bar), "l"(policy)
      : "memory");
}

// L2 policies: the weights are read once (evicted first), X by every CTA (kept).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
#endif

template <typename T, int BN, int kCtas>
__global__ void __launch_bounds__(kThreads, kCtas)
    flat_gemm_wgmma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                           const WgmmaParams p) {
#if FDPP_WGMMA
  constexpr int kBatchBytes = BN * 128;  // one stage's activation rows
  constexpr int kStageBytes = kWeightBytes + kBatchBytes;
  static_assert(kBatchBytes % 1024 == 0, "every operand tile starts on a 1024-byte swizzle period");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* ring = smem_raw + ((1024 - (detail::smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t ring_u32 = detail::smem_u32(ring);
  __shared__ __align__(8) uint64_t full[kWgmmaMaxStages];   // the stage's weights and activations have landed
  __shared__ __align__(8) uint64_t empty[kWgmmaMaxStages];  // every consumer warp is done with the stage
  const int wg = threadIdx.x / 128;
  const int rank = blockIdx.x % p.split_k;
  const int tile = blockIdx.x / p.split_k;
  const int s_begin = int(int64_t(rank) * p.steps / p.split_k);
  const int count = int(int64_t(rank + 1) * p.steps / p.split_k) - s_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(detail::smem_u32(&full[s]), 1);
      mbar_init(detail::smem_u32(&empty[s]), kConsumerThreads / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  detail::pdl_launch_dependents();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs<kCtas>::kProducer));
    if (threadIdx.x != 0) return;
    // The weight rows of the tile: 128 from tile * 128, or 64 gate rows from tile * 64 and their up rows.
    const int row_a = p.silu ? tile * kWgmmaRows : tile * kWgmmaTileRows;
    const int row_b = (p.n >> 1) + row_a;
    const uint64_t w_policy = detail::l2_evict_first_policy();
    const uint64_t x_policy = l2_evict_last_policy();
    auto issue_w = [&](int u, int slot) {
      const uint32_t dst = ring_u32 + slot * kStageBytes;
      const uint32_t bar = detail::smem_u32(&full[slot]);
      const int k0 = (s_begin + u) * kWgmmaKStep;
      mbar_arrive_expect_tx(bar, kStageBytes);  // out-of-bounds rows and columns count too (zero-filled)
      tma_load_2d(dst, &wmap, k0, row_a, bar, w_policy);
      if (p.silu) tma_load_2d(dst + kWeightBytes / 2, &wmap, k0, row_b, bar, w_policy);
    };
    auto issue_x = [&](int u, int slot) {
      tma_load_2d(ring_u32 + slot * kStageBytes + kWeightBytes, &xmap, (s_begin + u) * kWgmmaKStep, 0,
                  detail::smem_u32(&full[slot]), x_policy);
    };
    const int lead = count < p.stages ? count : p.stages;
    for (int u = 0; u < lead; ++u) issue_w(u, u);  // the weights are constant: before the PDL wait
    detail::pdl_wait_for_previous_grid();
    for (int u = 0; u < lead; ++u) issue_x(u, u);
    for (int u = lead; u < count; ++u) {
      const int slot = u % p.stages;
      mbar_wait(detail::smem_u32(&empty[slot]), ((u / p.stages) - 1) & 1);
      issue_w(u, slot);
      issue_x(u, slot);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs<kCtas>::kConsumer));
  detail::pdl_wait_for_previous_grid();  // bias, residual and Y belong to the kernels around this one
  const int cw = wg - 1;                 // consumer warpgroup: weight rows [64 cw, 64 cw + 64) of the tile
  const int ctid = threadIdx.x - 128;
  const int warp = (ctid >> 5) & 3, lane = ctid & 31;
  float acc[BN / 8][4];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  keep_registers(acc);
  for (int u = 0; u < count; ++u) {
    const int slot = u % p.stages;
    mbar_wait(detail::smem_u32(&full[slot]), (u / p.stages) & 1);
    const uint32_t a = ring_u32 + slot * kStageBytes + cw * (kWeightBytes / 2);
    const uint32_t b = ring_u32 + slot * kStageBytes + kWeightBytes;
    attn::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgmmaKStep / 16; ++ks)  // k16 slice ks: 32 bytes into every 128-byte row
      wgmma_ss<T, BN>(acc, sw128_desc(a + ks * 32, 16, 1024), sw128_desc(b + ks * 32, 16, 1024));
    attn::wgmma_commit();
    attn::wgmma_wait<1>();  // the previous stage's group is done: release that stage
    keep_registers(acc);
    if (u > 0 && lane == 0) mbar_arrive(detail::smem_u32(&empty[(u - 1) % p.stages]));
  }
  attn::wgmma_wait<0>();
  keep_registers(acc);

  // Both warpgroups are done with the ring (every copy into it has landed: each was waited for): stage the sums.
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
  float* staged = reinterpret_cast<float*>(ring);  // [BN][kStageRow]: staged[b * kStageRow + r] = D[r][b]
  {
    const int r = cw * kWgmmaRows + warp * 16 + (lane >> 2);
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int b = 8 * j + 2 * t;
      staged[b * kStageRow + r] = acc[j][0];
      staged[(b + 1) * kStageRow + r] = acc[j][1];
      staged[b * kStageRow + r + 8] = acc[j][2];
      staged[(b + 1) * kStageRow + r + 8] = acc[j][3];
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  if (p.split_k > 1) cluster.sync();  // every CTA's sums are staged (the producers have exited)
  else asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");

  // This CTA's batch rows, summed over the cluster: outputs of (batch b, column c) in column order, so that
  // consecutive threads store consecutive elements of Y.
  const int m_eff = p.m < BN ? p.m : BN;
  const int b0 = int(int64_t(rank) * m_eff / p.split_k), b1 = int(int64_t(rank + 1) * m_eff / p.split_k);
  const int cols = p.silu ? kWgmmaRows : kWgmmaTileRows;  // outputs per batch row of the tile
  const int n_out = p.silu ? p.n >> 1 : p.n;
  const int col0 = tile * cols;
  for (int idx = ctid; idx < (b1 - b0) * cols; idx += kConsumerThreads) {
    const int b = b0 + idx / cols, c = idx % cols;
    const int col = col0 + c;
    if (col >= n_out) continue;
    float v0 = 0.f, v1 = 0.f;
    for (int r = 0; r < p.split_k; ++r) {
      const float* src = p.split_k > 1 ? cluster.map_shared_rank(staged, r) : staged;
      v0 += src[b * kStageRow + c];
      if (p.silu) v1 += src[b * kStageRow + kWgmmaRows + c];
    }
    float out;
    if (p.silu) {
      if (p.bias) {
        v0 += detail::load_float<T>(p.bias, col);
        v1 += detail::load_float<T>(p.bias, (p.n >> 1) + col);
      }
      out = detail::silu(v0) * v1;
    } else {
      out = v0 + (p.bias ? detail::load_float<T>(p.bias, col) : 0.f);
    }
    const int64_t at = int64_t(b) * n_out + col;
    if (p.residual) out += detail::load_float<T>(p.residual, at);
    detail::store_float<T>(p.y, at, out);
  }
  if (p.split_k > 1) cluster.sync();  // the peers have read this CTA's sums
#else
  __trap();  // never launched there: wgmma_config_problem admits this loader only where the sm_90a code runs
#endif
}

// Two CTAs per SM where the stages let two share one, up to bn 64 (whose accumulators fit the 80 registers a thread
// has then; bn 128 needs more): a shallower ring each, but one CTA streams while the other fills its pipeline or runs
// its epilogue, which a grid of several waves otherwise pays for every wave. Else one CTA with the deeper ring. So a
// profile chooses by the config's stages: 4 (two CTAs at M <= 64) against 8 (one).
template <typename T, int BN>
cudaError_t launch_typed(const CUtensorMap& wmap, const CUtensorMap& xmap, const WgmmaParams& params, int64_t tiles,
                         const DeviceInfo& dev, const detail::Launch& launch) {
  const int64_t smem = wgmma_smem_bytes(params.stages, BN);
  const unsigned grid = unsigned(tiles * params.split_k);
  if constexpr (BN <= 64) {
    auto two = flat_gemm_wgmma_kernel<T, BN, 2>;
    const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(two), dev.device, smem);
    if (err != cudaSuccess) return err;
    if (resident_ctas_per_sm(reinterpret_cast<const void*>(two), dev.device, smem, kThreads) >= 2)
      return detail::launch_kernel(two, grid, kThreads, size_t(smem), launch, params.split_k, wmap, xmap, params);
  }
  auto one = flat_gemm_wgmma_kernel<T, BN, 1>;
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(one), dev.device, smem);
  if (err != cudaSuccess) return err;
  return detail::launch_kernel(one, grid, kThreads, size_t(smem), launch, params.split_k, wmap, xmap, params);
}

template <typename T>
cudaError_t launch_cols(int bn, const CUtensorMap& wmap, const CUtensorMap& xmap, const WgmmaParams& params,
                        int64_t tiles, const DeviceInfo& dev, const detail::Launch& launch) {
  switch (bn) {
    case 32: return launch_typed<T, 32>(wmap, xmap, params, tiles, dev, launch);
    case 64: return launch_typed<T, 64>(wmap, xmap, params, tiles, dev, launch);
    case 128: return launch_typed<T, 128>(wmap, xmap, params, tiles, dev, launch);
    case 256: return launch_typed<T, 256>(wmap, xmap, params, tiles, dev, launch);
    default: set_detail("ImplB wgmma: internal error, unsupported batch width"); return cudaErrorInvalidValue;
  }
}

// A [rows, k] row-major matrix of 16-bit elements as a 2-D tensor map with boxes of 64 columns x box_rows rows.
cudaError_t encode_rows_map(const void* base, Dtype dtype, int64_t rows, int64_t k, int box_rows, const char* what,
                            CUtensorMap* map) {
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kWgmmaKStep), cuuint32_t(box_rows)};
  const cudaError_t err = detail::encode_tile_map(map, dtype, 2, base, dims, strides, box);
  if (err == cudaErrorInvalidValue) set_detail(what);
  return err;
}

}  // namespace

cudaError_t launch_implb_wgmma(const Problem& p, const ImplBConfig& config, cudaStream_t stream) {
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (p.m < 1 || p.m > kImplBWgmmaMaxM) {
    set_detail("ImplB wgmma handles 1 <= M <= 256");
    return cudaErrorInvalidValue;
  }
  if (const char* why = wgmma_config_problem(config, p.k, dev.max_smem_optin, dev.cc_major)) {
    set_detail(why);
    return cudaErrorInvalidValue;
  }
  const int bn = wgmma_batch_cols(p.m);
  WgmmaParams params{};
  detail::fill_problem(params, p);
  params.stages = wgmma_fit_stages(config.stages, bn, dev.max_smem_optin);
  params.steps = int((p.k + kWgmmaKStep - 1) / kWgmmaKStep);
  params.split_k = config.split_k;
  CUtensorMap wmap, xmap;
  err = encode_rows_map(p.w, p.dtype, p.n, p.k, p.silu_mul() ? kWgmmaRows : kWgmmaTileRows,
                        "ImplB wgmma: cuTensorMapEncodeTiled refused the weight (it must be 16-byte aligned)", &wmap);
  if (err != cudaSuccess) return err;
  err = encode_rows_map(p.x, p.dtype, p.m, p.k, bn,
                        "ImplB wgmma: cuTensorMapEncodeTiled refused X (it must be 16-byte aligned)", &xmap);
  if (err != cudaSuccess) return err;
  const int64_t tiles = wgmma_tiles(p.n, p.silu_mul());
  const detail::Launch launch{stream, p.pdl};  // hopper_paths holds: wgmma_config_problem admits it only there
  if (p.dtype == Dtype::kBFloat16) return launch_cols<__nv_bfloat16>(bn, wmap, xmap, params, tiles, dev, launch);
  return launch_cols<__half>(bn, wmap, xmap, params, tiles, dev, launch);
}

}  // namespace gemm
}  // namespace fdpp
