// ImplB on a row-streaming cp.async pipeline (M <= 16; a config's loader kLoaderRows or kLoaderRows1): the flat
// GEMM of gemm_implb.cu on the loader that read weights fastest on the H200 -- two CTAs per SM, each with up to three
// 32 KB stages of 16-byte cp.async in flight, ahead of the TMA tiles of gemm_implb_bulk.cu in a PDL chain
// (docs/notes-gemm.md has the measurements behind every choice below).
//
// The math is ImplB's: Y^T = W X^T with 16 weight rows on the MMA's M side and the batch padded to 8 on its
// 8-wide side (two batch blocks up to M = 16), mma.sync m16n8k16, fp32 accumulators, and the K permutation of
// gemm_implb.cu (lane (g, t) multiplies W[row][8t .. 8t+8) of every 32-wide K group with X[batch g][same]).
//
// Work: a unit is one 16-row block times 1024 columns. CTA c takes the contiguous blocks [c * per, (c + 1) * per),
// per = ceil(blocks / resident CTAs), and streams their units in order. Each of the 8 warps owns 128 columns of
// every unit, [128 w, 128 w + 128): it copies them -- the 16 weight rows and the M activation rows (8 at M = 7),
// 256 bytes each, two rows per instruction, one commit group per unit -- and multiplies them, so the ring needs no
// CTA barrier: a __syncwarp orders a warp's copies before its reads, and its reads before the copy that refills the
// slot.
//
// Why it is built this way:
// - X rides in the stage with the weights: loaded into registers a unit ahead instead, its L2 latency under the
//   weight stream held every refill back. It is copied from L2 without an L1 allocation (.cg): the stage already
//   holds it, so an L1 copy would serve only the SM's other CTA, and that did not pay off.
// - The weights are copied with an L2 evict-first policy: read once, they should not push the activations out.
// - A warp moves the unit's operands into registers and refills the slot before it multiplies.
// - No L2::256B prefetch hint on the weight copies: each byte is read once, so the hint only adds traffic.
//   1024-column units, not 512: fewer commit groups per byte.
// - 8 warps of 128 columns, not 4 of 256 (or 16 of 64): the same bytes in flight, half the work per warp and unit
//   between a slot landing and its refill.
// - How many units' weights go out before the PDL wait is the loader's choice, picked per shape by the profile: all
//   the stages (rows) or one (rows1, the rest with their activations right after the wait). rows sends more weight
//   bytes ahead; rows1 lets the activations through sooner.
// - rows1 leads with one unit in the first half of the grid and two in the second: the second half's CTAs start
//   last, as the previous grid's CTAs leave, so their first weights would still be in flight at the release with
//   their activations queued behind them; two units ahead put them a unit further along when the release comes.
#include "kernels/gemm/gemm_common.cuh"

namespace fdpp {
namespace gemm {
namespace {

using detail::Elem;

constexpr int kUnitCols = 1024;                // columns per unit
constexpr int kWarps = 8;                      // warps per CTA
constexpr int kWarpCols = kUnitCols / kWarps;  // a warp's share: 128 columns
constexpr int kGroups = kWarpCols / 32;        // K groups of 32 per warp and unit
constexpr int kRowBytes = kWarpCols * 2;       // 256 bytes of a row per warp
constexpr int kPieces = kRowBytes / 16;        // 16-byte pieces of a row piece
constexpr int kRowsPerCopy = 32 / kPieces;     // row pieces one warp instruction copies: 2
static_assert(kRowsPerCopy * kPieces == 32 && 16 % kRowsPerCopy == 0, "whole rows per warp instruction");

// Where 16-byte piece q (0..15) of row r of a warp's slot sits: rows 256 bytes apart and piece q moved to
// q ^ (4 * (r & 1)), so the MMA reads (rows g and g + 1 of a quarter-warp, pieces 4j .. 4j + 3) hit all 32 banks.
__device__ __forceinline__ uint32_t piece_offset(int r, int q) { return r * kRowBytes + ((q ^ ((r & 1) << 2)) << 4); }

struct StreamGemmParams : detail::KernelProblem {
  int stages;
  int lead;        // units whose weights the first half of the grid issues before the PDL wait
  int lead_late;   // the same for the second half (implb_rows_lead_units)
  int x_rows;      // activation rows per stage: M, or M + 1 with a zero row (stream_x_rows)
  int steps;       // units per block: ceil(k / kUnitCols)
  int num_blocks;  // 16-row blocks (silu: 8 gate + 8 up rows)
  int blocks_per_cta;
};

template <int NB, int Parities>
struct StreamShared {
  float red[Parities][kWarps][NB * 4][32];  // the warps' partial sums (per block parity when there are two)
};

template <typename T, int NB, int Parities>
__global__ void __launch_bounds__(kWarps * 32) flat_gemm_stream_kernel(const StreamGemmParams p) {
  extern __shared__ __align__(16) unsigned char ring[];
  __shared__ StreamShared<NB, Parities> shared;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int block0 = blockIdx.x * p.blocks_per_cta;
  const int block1 = block0 + p.blocks_per_cta < p.num_blocks ? block0 + p.blocks_per_cta : p.num_blocks;
  const int total = (block1 - block0) * p.steps;
  const int lead = blockIdx.x < gridDim.x / 2 ? p.lead : p.lead_late;
  const uint64_t weight_policy = detail::l2_evict_first_policy();
  const T* w = reinterpret_cast<const T*>(p.w);
  const T* x = reinterpret_cast<const T*>(p.x);
  // A stage: per warp, 16 weight rows then x_rows activation rows, 256 bytes each (this warp's columns).
  const int warp_slot = (16 + p.x_rows) * kRowBytes;
  const int stage_bytes = kWarps * warp_slot;
  unsigned char* my_ring = ring + warp * warp_slot;
  const uint32_t my_ring_u32 = detail::smem_u32(my_ring);
  // An instruction copies kRowsPerCopy row pieces: this lane copies piece `piece` of the `sub_row`-th of them.
  const int piece = lane % kPieces, sub_row = lane / kPieces;

  // This lane's pieces of a unit at step `step` of its block: column lane_col + step * kUnitCols of weight rows
  // 2 i + sub_row (i = 0..7), 512 i bytes apart in the warp's slot, and of activation rows sub_row, sub_row + 2, ...
  const int lane_col = warp * kWarpCols + piece * 8;
  const uint32_t lane_offset = piece_offset(sub_row, piece);  // (2 i + sub_row) & 1 is sub_row & 1
  const T* x_lane = x + int64_t(sub_row) * p.k + lane_col;
  auto issue_x = [&](uint32_t slot, int step) {  // from L2 (.cg), like the weights; rows >= M are zero-filled
    const int du = step * kUnitCols;
    const bool col_ok = lane_col + du < p.k;
    const T* src = x_lane + du;
    uint32_t dst = slot + 16 * kRowBytes + lane_offset;
    for (int r = sub_row; r < p.x_rows; r += kRowsPerCopy) {
      const bool ok = col_ok && r < p.m;
      detail::cp_async16_l2(dst, ok ? src : x, ok);
      src += int64_t(kRowsPerCopy) * p.k;
      dst += kRowsPerCopy * kRowBytes;
    }
  };
  // Weight row 2 i + sub_row of `block` at column lane_col (w itself past N, where the copy is masked). Rows 0-7
  // and 8-15 of a block: LaneRows' row0 and row1 of lane group g = r % 8.
  auto weight_row = [&](int block, int i, bool& ok) -> const T* {
    const int r = kRowsPerCopy * i + sub_row;
    const detail::LaneRows rows(p.n, p.silu, block, r & 7);
    ok = r < 8 ? rows.ok0 : rows.ok1;
    return ok ? w + int64_t(r < 8 ? rows.row0 : rows.row1) * p.k + lane_col : w;
  };
  // The weight pieces of a unit at `step` into `slot`; row_of(i, ok) gives the row's pointer at step 0.
  auto issue_w = [&](uint32_t slot, int step, auto&& row_of) {
    const int du = step * kUnitCols;
    const bool col_ok = lane_col + du < p.k;
#pragma unroll
    for (int i = 0; i < 16 / kRowsPerCopy; ++i) {
      bool ok;
      const T* row = row_of(i, ok);
      ok = ok && col_ok;
      detail::cp_async16_l2(slot + lane_offset + i * kRowsPerCopy * kRowBytes, ok ? row + du : w, ok, weight_policy);
    }
  };
  // After the prologue's first units the copies go out in unit order, from a cursor: the next unit's step and
  // block, and the block's row pointers in registers, worked out once per block instead of once per unit, so no
  // address arithmetic sits between a unit landing and its refill.
  const T* w_rows[16 / kRowsPerCopy];
  unsigned w_rows_ok = 0;
  int next_step = 0, next_block = block0;
  auto point_rows_at = [&](int block) {
    w_rows_ok = 0;
#pragma unroll
    for (int i = 0; i < 16 / kRowsPerCopy; ++i) {
      bool ok;
      w_rows[i] = weight_row(block, i, ok);
      w_rows_ok |= unsigned(ok) << i;
    }
  };
  auto issue_next = [&](uint32_t slot, bool with_x) {
    issue_w(slot, next_step, [&](int i, bool& ok) {
      ok = (w_rows_ok >> i) & 1u;
      return w_rows[i];
    });
    if (with_x) issue_x(slot, next_step);  // in the same group: the activations land with the weights
    detail::cp_async_commit();
    if (++next_step == p.steps) {
      next_step = 0;
      if (++next_block < block1) point_rows_at(next_block);
    }
  };

  float acc[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;

  // Weights only may be read before the previous grid is done: the prologue's first `lead` units split into a
  // weight group each and one activation group after the PDL wait; units lead .. stages - 1 follow it, one group
  // each. Group accounting: unit u < lead is complete once at most stages - lead + u groups are pending (its
  // activations are in the lead's group), every later unit once at most stages - 1 are.
  detail::pdl_launch_dependents();
  const int first = lead < total ? lead : total;  // units issued before the wait, from LaneRows directly
  for (int s = 0; s < lead; ++s) {
    if (s < total)
      issue_w(my_ring_u32 + s * stage_bytes, s % p.steps,
              [&](int i, bool& ok) { return weight_row(block0 + s / p.steps, i, ok); });
    detail::cp_async_commit();
  }
  // The cursor at unit `first`, while this CTA waits for the previous grid anyway.
  next_step = first % p.steps;
  next_block = block0 + first / p.steps;
  if (next_block < block1) point_rows_at(next_block);
  detail::pdl_wait_for_previous_grid();
  for (int s = 0; s < first; ++s) issue_x(my_ring_u32 + s * stage_bytes, s % p.steps);
  detail::cp_async_commit();
  for (int s = lead; s < p.stages; ++s) {
    if (s < total) issue_next(my_ring_u32 + s * stage_bytes, true);
    else detail::cp_async_commit();
  }

  for (int u = 0, stage = 0, step = 0, blk = 0; u < total; ++u) {
    // Committed so far: the prologue's weight groups 0 .. lead-1, its activation group, its groups for units lead ..
    // stages-1, then one per iteration (unit i + stages at iteration i). Unit u < lead is complete with the
    // activation group, after which stages - lead + u groups came; a later unit u with its own group, after which
    // stages - 1 came.
    detail::cp_async_wait_dynamic(u < lead ? p.stages - lead + u : p.stages - 1);
    __syncwarp();  // every lane's copies of this unit have landed
    // The unit's operands into registers, then the slot goes straight back to the loader.
    const unsigned char* slot = my_ring + stage * stage_bytes;
    const int col = step * kUnitCols + warp * kWarpCols;
    uint4 a_lo[kGroups], a_hi[kGroups], b[kGroups][NB];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (col + 32 * j < p.k) {
        a_lo[j] = detail::lds16(slot + piece_offset(g, 4 * j + t));      // W[row0][8t .. 8t+8) of group j
        a_hi[j] = detail::lds16(slot + piece_offset(g + 8, 4 * j + t));  // W[row1][same]
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          const int mrow = nb * 8 + g;
          b[j][nb] = mrow < p.m ? detail::lds16(slot + piece_offset(16 + mrow, 4 * j + t)) : make_uint4(0, 0, 0, 0);
        }
      }
    }
    __syncwarp();  // the slot has been read: refill it with unit u + stages
    if (u + p.stages < total)
      issue_next(my_ring_u32 + stage * stage_bytes, true);  // unit u + stages, into the slot just read
    else detail::cp_async_commit();
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (col + 32 * j < p.k) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          detail::mma_16816<T>(acc[nb], a_lo[j].x, a_hi[j].x, a_lo[j].y, a_hi[j].y, b[j][nb].x, b[j][nb].y);
          detail::mma_16816<T>(acc[nb], a_lo[j].z, a_hi[j].z, a_lo[j].w, a_hi[j].w, b[j][nb].z, b[j][nb].w);
        }
      }
    }
    if (step == p.steps - 1) {  // the block is complete: add the warps' K shares, epilogue, store
      detail::finish_block<T, NB, kWarps>(acc, shared.red[blk % Parities], warp, lane, block0 + blk, p);
      // One buffer: no warp may write the next block's sums before they have been read.
      if (Parities == 1 && block0 + blk + 1 < block1) asm volatile("bar.sync 1, %0;\n" ::"n"(kWarps * 32) : "memory");
    }
    stage = stage + 1 == p.stages ? 0 : stage + 1;
    if (++step == p.steps) {
      step = 0;
      ++blk;
    }
  }
  detail::cp_async_wait<0>();
}

template <typename T, int NB, int Parities>
cudaError_t launch_typed(StreamGemmParams params, const DeviceInfo& dev, int64_t smem, const detail::Launch& launch) {
  auto kernel = flat_gemm_stream_kernel<T, NB, Parities>;
  const cudaError_t err = ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), dev.device, smem);
  if (err != cudaSuccess) return err;
  // Equal contiguous block ranges over the CTAs resident at once (two per SM at three stages).
  const int64_t resident =
      int64_t(resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), dev.device, smem, kWarps * 32)) * dev.num_sms;
  params.blocks_per_cta = int((params.num_blocks + resident - 1) / resident);
  const int grid = (params.num_blocks + params.blocks_per_cta - 1) / params.blocks_per_cta;
  return detail::launch_kernel(kernel, unsigned(grid), unsigned(kWarps * 32), size_t(smem), launch, 1, params);
}

template <typename T>
cudaError_t launch_for(const StreamGemmParams& params, const DeviceInfo& dev, int64_t smem,
                       const detail::Launch& launch, int batch_blocks, int parities) {
  if (batch_blocks == 1)
    return parities == 1 ? launch_typed<T, 1, 1>(params, dev, smem, launch)
                         : launch_typed<T, 1, 2>(params, dev, smem, launch);
  return parities == 1 ? launch_typed<T, 2, 1>(params, dev, smem, launch)
                       : launch_typed<T, 2, 2>(params, dev, smem, launch);
}

// Activation rows a stage holds: M, except at M = 7 one more, zero-filled: copying 7 rows (two per instruction) cost
// more than copying 8, and a slot sized for 8 without the eighth copy stayed slow, so M = 7 costs what M = 8 does.
// Other odd M show no such step, and above 8 the batch takes a second MMA block (docs/notes-gemm.md).
int stream_x_rows(int m) { return m == 7 ? 8 : m; }

}  // namespace

cudaError_t launch_implb_stream(const Problem& p, int stages, int lead_first, int lead_second, int batch_blocks,
                                cudaStream_t stream) {
  DeviceInfo dev;
  cudaError_t err = current_device_info(&dev);
  if (err != cudaSuccess) return err;
  if (batch_blocks < 1 || batch_blocks > 2 || p.m > 16 || stages < 2 || stages > kMaxStages) {
    set_detail("ImplB rows: needs M <= 16 and 2 to 8 stages");
    return cudaErrorInvalidValue;
  }
  // Two CTAs per SM is the point of this loader: with more activation rows per stage the ring gets shallower
  // (never below 2 stages) until two fit (228 KB per SM, 1 KB reserved per CTA, the reduction buffers). One
  // reduction buffer instead of two where that saves a stage: a deeper ring keeps more weight bytes in flight.
  // Example: at M = 2 one buffer leaves room for 3 stages instead of 2.
  const int x_rows = stream_x_rows(p.m);
  auto fitting = [&](int parities) {
    const int64_t per_cta_extra = 1024 + int64_t(sizeof(StreamShared<1, 1>)) * parities * batch_blocks;
    int s = stages;
    while (s > 2 && 2 * (implb_rows_smem_bytes(s, x_rows) + per_cta_extra) > 228 * 1024) --s;
    return s;
  };
  const int parities = fitting(1) > fitting(2) ? 1 : 2;
  stages = fitting(parities);
  const int64_t smem = implb_rows_smem_bytes(stages, x_rows);
  if (smem > dev.max_smem_optin) {
    set_detail("ImplB rows: two stages need more shared memory than the GPU has");
    return cudaErrorInvalidValue;
  }
  StreamGemmParams params{};
  detail::fill_problem(params, p);
  params.stages = stages;
  params.x_rows = x_rows;
  auto clamp_lead = [&](int units) { return units < 1 ? 1 : units < stages ? units : stages; };
  params.lead = clamp_lead(lead_first);
  params.lead_late = clamp_lead(lead_second);
  params.steps = int((p.k + kUnitCols - 1) / kUnitCols);
  params.num_blocks = int(implb_row_blocks(p.n, p.silu_mul()));
  const detail::Launch launch{stream, p.pdl && hopper_paths(dev.cc_major)};
  if (p.dtype == Dtype::kBFloat16) return launch_for<__nv_bfloat16>(params, dev, smem, launch, batch_blocks, parities);
  return launch_for<__half>(params, dev, smem, launch, batch_blocks, parities);
}

}  // namespace gemm
}  // namespace fdpp
