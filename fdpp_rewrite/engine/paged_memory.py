"""How big a paged engine's KV pool is: measured on cuda so that no later step, graph or caller runs out.

On cuda, after the weights are loaded, the engine runs its largest step once eagerly on a pool of two blocks
(largest_step: every row decoding plus the most padded prompt tokens a step may carry, at the longest KV length)
and records the activation peak (torch.cuda.max_memory_allocated over the run). The memory then free (the step's
first run has loaded every kernel module, library handle and workspace, so they are already taken) is the base:

    reserve = peak                        the first (eager, traced) run of each shape, in the default pool
            + GRAPH_POOL_FACTOR x peak    the CUDA graphs' one shared pool: it grows to about the largest capture's
                                          activations; the factor covers fragmentation between captures of
                                          different shapes (every shape's logits rows go to one shared buffer)
            + HEADROOM_BYTES              step buffers, the shared logits buffer, context growth
    pool    = kv_memory x (free - reserve)   for a fraction ("0.9"), or kv_memory itself ("20GiB", refused when
                                             it does not fit in free - reserve)
    blocks  = pool // (64 x KV bytes per token)

A caller that needs memory of its own allocates it before loading the engine (bench's streaming-read buffer).

Worked example (llama2-7b fp16 on a 141 GB H200, max batch 256, kv_memory 0.9; the peak is illustrative, the
load line prints the measured one): weights 12.6 GiB; free after the weights and the probe step ~125 GiB; the
largest step is 256 decode rows + 3,968 padded prompt tokens; say its peak is 1 GiB: reserve = 1 + 2 x 1 + 1 =
4 GiB; pool = 0.9 x (125 - 4) = 108.9 GiB; a token's K and V over 32 layers take 512 KiB, a block 32 MiB: 3,484
blocks, 222,912 tokens, 27 sequences of 8K. Left outside the pool: 0.1 x 121 + 4 = 16.1 GiB.

On the cpu backend a fraction is of CPU_NOMINAL_BYTES and nothing is reserved; kv_blocks (tests) sets the block
count directly on either backend.
"""

from __future__ import annotations

import sys

import torch

from fdpp_rewrite.engine.buckets import MAX_GRAPH_PREFILL, pick
from fdpp_rewrite.engine.paged import sizing
from fdpp_rewrite.engine.paged.blocks import KV_BLOCK_SIZE, blocks_for
from fdpp_rewrite.engine.paged_step import PagedLayout, StepBuffers
from fdpp_rewrite.errors import FdppError

GRAPH_POOL_FACTOR = 2
HEADROOM_BYTES = 1 << 30
CPU_NOMINAL_BYTES = 64 << 20  # what a fraction of "free memory" means on the cpu backend
PROBE_BLOCKS = 2  # the probe step's pool: the null block (every row's table is all null) and one more


def chunk_count(engine, chunk: int) -> int:
    """P, the chunks of `chunk` padded tokens a step carries at most: as many as MAX_GRAPH_PREFILL holds (at least
    one), as the batch bucket the step runs them as."""
    return pick(min(max(1, MAX_GRAPH_PREFILL // chunk), engine.max_batch), engine.batch_buckets)


def max_prefill_tokens(engine) -> int:
    """The most padded prompt tokens one step carries: P x C over every chunk length C up to MAX_GRAPH_PREFILL
    (P rounds up to a batch bucket, so this can reach nearly twice MAX_GRAPH_PREFILL)."""
    return max(chunk_count(engine, chunk) * chunk for chunk in range(1, MAX_GRAPH_PREFILL + 1))


def largest_step(engine) -> tuple[int, int, int]:
    """(B, P, C) of the step with the most tokens the engine runs: every row decoding and the chunk length whose
    padded chunks hold the most tokens (the longest such chunk)."""
    tokens = max_prefill_tokens(engine)
    chunk = max(c for c in range(1, MAX_GRAPH_PREFILL + 1) if chunk_count(engine, c) * c == tokens)
    return engine.max_batch, chunk_count(engine, chunk), chunk


def step_peak_bytes(engine) -> int:
    """Bytes the largest step allocates beyond what is live before it (one eager run on a two-block pool, every
    table row null: its K/V writes land in the null block)."""
    batch, count, chunk = largest_step(engine)
    width = blocks_for(max(engine.max_seq, chunk))  # a chunk's padding may reach past max_seq (kv_bucket)
    plan = engine.plan
    shape = (PROBE_BLOCKS, plan["num_kv_heads"], KV_BLOCK_SIZE, plan["head_dim"])
    pools = {name: torch.zeros(shape, dtype=engine.dtype, device=engine.device) for name in plan["cache_inputs"]}
    buffers = StepBuffers(batch, count, chunk, width, engine.device)
    rows = list(range(batch)) + [batch + p * chunk + chunk - 1 for p in range(count)]
    buffers.rows.copy_(torch.tensor(rows, dtype=torch.int64))
    feeds = {"input_ids": buffers.ids, "past_len": buffers.past, **pools}
    layout = PagedLayout(batch, count, chunk, width * KV_BLOCK_SIZE, buffers.table)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    outputs, _ = engine.traced.trace(feeds, engine.backend, layout=layout)
    outputs["logits"][0].index_select(0, buffers.rows)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del outputs, pools, buffers, feeds
    torch.cuda.empty_cache()
    return peak


def pool_blocks(engine, kv_memory, kv_blocks: int | None) -> int:
    """Blocks of the pool, the null block included (the module docstring); prints the pool in one line."""
    per_token = bytes_per_token(engine)
    if kv_blocks is not None:
        if kv_blocks < 2:
            raise FdppError(f"kv_blocks must be at least 2 (block 0 is the null block), got {kv_blocks}")
        print(pool_line(int(kv_blocks), per_token), file=sys.stderr)
        return int(kv_blocks)
    if kv_memory is None:
        kv_memory = engine.manifest["kv_cache"]["kv_memory"]
    amount = sizing.parse_kv_memory(str(kv_memory))
    peak = reserve = 0
    if engine.backend.name == "cuda":
        peak = step_peak_bytes(engine)
        reserve = reserve_bytes(peak)
        free = torch.cuda.mem_get_info()[0]
    else:
        free = CPU_NOMINAL_BYTES
    blocks = sizing.pool_blocks(amount, free, per_token, reserve)
    print(pool_line(blocks, per_token, (free, peak, reserve)), file=sys.stderr)
    return blocks


def reserve_bytes(peak: int) -> int:
    return peak * (1 + GRAPH_POOL_FACTOR) + HEADROOM_BYTES


def bytes_per_token(engine) -> int:
    element = torch.finfo(engine.dtype).bits // 8
    return sizing.kv_bytes_per_token(engine.num_layers, engine.plan["num_kv_heads"], engine.plan["head_dim"], element)


def pool_line(blocks: int, per_token: int, sized: tuple | None = None) -> str:
    """The pool in one line: what the capacity check (sequences of a length that fit) is computed from. `sized`:
    (free bytes, step peak, reserve) when kv_memory sized it, None for kv_blocks."""
    gib = 2 ** 30
    tokens = (blocks - 1) * KV_BLOCK_SIZE  # the null block holds nothing
    line = (f"KV pool: {blocks} blocks of {KV_BLOCK_SIZE} tokens, {blocks * per_token * KV_BLOCK_SIZE / gib:.2f} GiB, "
            f"{tokens:,} tokens ({per_token:,} bytes a token; {sizing.capacity_sequences(blocks, 8192)} sequences of "
            "8K)")
    if sized is None:
        return line + "; kv_blocks given"
    free, peak, reserve = sized
    return (f"{line}; {free / gib:.2f} GiB free after the weights, {reserve / gib:.2f} GiB kept back (step peak "
            f"{peak / gib:.2f} GiB x {1 + GRAPH_POOL_FACTOR} + {HEADROOM_BYTES / gib:.0f} GiB)")
