"""The slot API and the step API of a paged engine (Engine forwards here when engine.paged).

Every call runs as one `step` (paged_step.py): B decode rows of any sequence rows, then P prompt chunks of other
rows, in one pass over the block pools. A step first allocates the blocks it needs (all or nothing: OutOfBlocks,
nothing run, when they are not free), uploads its ids, past lengths, table rows and logits rows into the static
buffers of its shape (B bucket, P bucket, C, KV bucket), then replays the shape's CUDA graph (captured on its
first run, when P * C <= MAX_GRAPH_PREFILL) or runs its traced Program.

    engine.step([0, 3], tokens, [(5, ids_a), (6, ids_b)])  # rows 0 and 3 decode; rows 5, 6 take prompt chunks
    engine.prefill_batch(prompts)                          # generate's prefill: rounds of batched chunks

Pool size: paged_memory.py (measured on cuda: the largest step's activation peak, the CUDA graphs' pool and a
headroom are kept back; the pool is printed in one line at load). Every step stays within that largest step: its
padded prompt tokens are at most engine.max_prefill_tokens (a longer prompt runs as several chunks).
"""

from __future__ import annotations

import torch

from fdpp_rewrite.engine.buckets import MAX_GRAPH_PREFILL, pick
from fdpp_rewrite.engine.paged.blocks import blocks_for
from fdpp_rewrite.engine.paged_cache import PagedCache
from fdpp_rewrite.engine.paged_memory import max_prefill_tokens, pool_blocks
from fdpp_rewrite.engine.paged_step import PagedLayout, StepBuffers
from fdpp_rewrite.errors import FdppError


def wanted(engine) -> bool:
    """Whether the engine runs paged: a kv_cache in its manifest or a kv_memory / kv_blocks from the caller. One
    line when asked of an engine that cannot be paged."""
    options = engine.paged_options
    if not (engine.manifest.get("kv_cache") or options["kv_memory"] is not None or options["kv_blocks"] is not None):
        return False
    reason = ("a tensor-parallel engine" if "tensor_parallel_rank" in engine.manifest or engine.leader is not None
              else engine.mixed_reason)
    if reason is not None:
        raise FdppError(f"a paged KV cache needs mixed steps, which this engine cannot run ({reason}); load it "
                        "without kv_memory or rebuild it without --kv-memory")
    return True


def setup(engine, kv_memory=None, kv_blocks: int | None = None, prefix_caching: bool = True) -> None:
    """The paged engine's cache and step state (after the weights are on the device)."""
    engine.kv = PagedCache(engine.plan["cache_inputs"], engine.max_batch, engine.max_seq, engine.plan["num_kv_heads"],
                           engine.plan["head_dim"], engine.dtype, engine.device,
                           pool_blocks(engine, kv_memory, kv_blocks), prefix_caching)
    engine.step_buffers = {}  # (B, P, C, kv bucket) -> StepBuffers
    engine.max_prefill_tokens = max_prefill_tokens(engine)
    engine.step_logits = None  # [2 max_batch, V]: every captured step's logits rows (made at the first capture)


# -- the step API -------------------------------------------------------------------------------------------------

def growths(engine, decode_slots: list[int], chunks: list) -> list:
    """(slot, length) of every row a step grows: a decode row by one token, a chunk's row by its ids."""
    lengths = engine.kv.lengths
    return [(slot, lengths[slot] + 1) for slot in decode_slots] + [(slot, lengths[slot] + len(ids))
                                                                   for slot, ids in chunks]


def blocks_needed(engine, decode_slots: list[int], chunks: list) -> int:
    return sum(engine.kv.blocks_needed(slot, length) for slot, length in growths(engine, decode_slots, chunks))


def step_budget(engine) -> tuple[int, int]:
    return engine.max_batch, MAX_GRAPH_PREFILL


def attach_prefix(engine, slot: int, prompt_ids: list[int]) -> int:
    return engine.kv.attach(slot, prompt_ids)


def check_step(engine, decode_slots: list[int], chunks: list, padded: int | None) -> None:
    kv, rows = engine.kv, list(decode_slots) + [slot for slot, _ in chunks]
    if not rows:
        raise FdppError("a step needs decode slots or prompt chunks; pass at least one")
    if len(set(rows)) != len(rows) or not all(0 <= slot < engine.max_batch for slot in rows):
        raise FdppError(f"a step's slots must be distinct and in [0, {engine.max_batch}); got decode {decode_slots} "
                        f"and chunks of {[slot for slot, _ in chunks]}")
    longest = max([kv.lengths[slot] + 1 for slot in decode_slots]
                  + [kv.lengths[slot] + len(ids) for slot, ids in chunks])
    if any(not ids for _, ids in chunks) or (padded and any(len(ids) > padded for _, ids in chunks)):
        raise FdppError(f"every chunk must be non-empty and at most {padded or 'its padded length'} tokens")
    kv.check_fits(longest)


def kv_bucket(engine, longest: int) -> int:
    """The KV length a step runs as: its KV bucket, or (a chunk's padding reaching past max_seq) the longest row
    rounded up to a whole block, so the attention never reads past its table rows."""
    if longest <= engine.max_seq:
        return pick(longest, engine.kv_buckets)
    return blocks_for(longest) * engine.kv.block_size


def step(engine, decode_slots: list[int], tokens, chunks: list, padded: int | None = None):
    """engine.step (runtime.py); `padded`: the length every chunk runs as (default the longest chunk's prefill
    bucket)."""
    check_step(engine, decode_slots, chunks, padded)
    kv = engine.kv
    n, m = len(decode_slots), len(chunks)
    batch = pick(n, engine.batch_buckets) if n else 0
    count = pick(m, engine.batch_buckets) if m else 0
    chunk = (padded or pick(max(len(ids) for _, ids in chunks), engine.prefill_buckets)) if m else 0
    if count * chunk > engine.max_prefill_tokens:  # past the largest step the pool was sized around
        raise FdppError(f"a step carries at most {engine.max_prefill_tokens} padded prompt tokens, not {m} chunks "
                        f"run as {count} of {chunk}; split the chunks over several steps")
    kv.grow(growths(engine, decode_slots, chunks))
    starts = [kv.lengths[slot] for slot, _ in chunks]
    kv_len = kv_bucket(engine, max([kv.lengths[slot] + 1 for slot in decode_slots] + [s + chunk for s in starts]))
    key = (batch, count, chunk, kv_len)
    buffers = engine.step_buffers.get(key)
    if buffers is None:
        buffers = engine.step_buffers[key] = StepBuffers(batch, count, chunk, blocks_for(kv_len), engine.device)
    fill(engine, buffers, key, decode_slots, tokens, chunks)
    out = run(engine, key, buffers)
    kv.decoded(decode_slots)
    for (slot, ids), start in zip(chunks, starts):
        kv.wrote_prompt(slot, ids, start + len(ids))
    return out[:n].clone(), out[batch:batch + m].clone()  # a replay rewrites `out`


def fill(engine, buffers: StepBuffers, key: tuple, decode_slots: list[int], tokens, chunks: list) -> None:
    """Write a step's inputs into its static buffers: one upload of the ids, past lengths, table rows and logits
    rows from the host, then the decode tokens from the device (stream-ordered, no host synchronization)."""
    batch, count, chunk, _ = key
    kv, n = engine.kv, len(decode_slots)
    host, fields = buffers.staging()
    used = min(fields["table"].shape[1], kv.width)
    chunk_slots = [slot for slot, _ in chunks]
    fields["table"][:n, :used] = kv.rows(decode_slots)[:, :used]
    fields["table"][batch:batch + len(chunks), :used] = kv.rows(chunk_slots)[:, :used]
    fields["past"][:n] = [kv.lengths[slot] for slot in decode_slots]
    fields["past"][batch:batch + len(chunks)] = [kv.lengths[slot] for slot in chunk_slots]
    fields["rows"][:] = (list(range(batch)) + [batch + p * chunk + len(ids) - 1 for p, (_, ids) in enumerate(chunks)]
                         + [batch + p * chunk for p in range(len(chunks), count)])
    for p, (_, ids) in enumerate(chunks):
        fields["ids"][0, batch + p * chunk:batch + p * chunk + len(ids)] = ids
    buffers.upload(host)
    if n:
        buffers.ids[0, :n].copy_(tokens.reshape(-1))


def run(engine, key: tuple, buffers: StepBuffers):
    """The step's logits rows [B + P, V]: a graph replay, the kept Program, or the shape's first run traced (then
    captured as a CUDA graph when graphs apply and P * C <= MAX_GRAPH_PREFILL, else its Program kept)."""
    feeds = {"input_ids": buffers.ids, "past_len": buffers.past, **engine.kv.views()}
    kept = engine.paged_steps.get(key)
    if kept is not None:
        runner, out = kept
        if out is not None:
            runner.replay()
            return out
        return runner.run(feeds)["logits"][0].index_select(0, buffers.rows)
    batch, count, chunk, kv_len = key
    layout = PagedLayout(batch, count, chunk, kv_len, buffers.table)
    outputs, program = engine.traced.trace(feeds, engine.backend, layout=layout)
    out = outputs["logits"][0].index_select(0, buffers.rows)
    engine.programs[key] = program  # what bench counts a step's eager launches with
    if engine.use_graphs and count * chunk <= MAX_GRAPH_PREFILL:
        if engine.step_logits is None:  # outside the graphs' pool: one buffer instead of one per captured shape
            engine.step_logits = out.new_empty(2 * engine.max_batch, out.shape[1])
        rows = engine.step_logits[:batch + count]
        engine.paged_steps[key] = engine.traced.capture(
            program, feeds, lambda logits: torch.index_select(logits[0], 0, buffers.rows, out=rows))
    else:
        engine.paged_steps[key] = (program, None)
    return out


# -- the slot API through step --------------------------------------------------------------------------------------

def reset(engine) -> None:
    engine.kv.reset()
    engine.step_ids.zero_()
    engine.active = 0


def release(engine, slot: int) -> None:
    engine.kv.release(slot)


def prefill(engine, slot: int, ids: list[int]):
    """The prompt into a fresh `slot` (its blocks given back first), in chunks of up to MAX_GRAPH_PREFILL."""
    if not ids:
        raise FdppError(f"an empty prompt for slot {slot}; pass at least one token id")
    engine.kv.release(slot)
    return prefill_chunk(engine, slot, ids)


def prefill_chunk(engine, slot: int, ids: list[int]):
    """`ids` after the tokens in `slot`, one step per MAX_GRAPH_PREFILL of them; the last position's logits."""
    for start in range(0, max(len(ids), 1), MAX_GRAPH_PREFILL):  # no ids: one step, which refuses them
        logits = step(engine, [], None, [(slot, list(ids[start:start + MAX_GRAPH_PREFILL]))])[1][0]
    return logits


def decode(engine, tokens):
    return step(engine, list(range(engine.active)), tokens, [])[0]


def decode_slots(engine, slots: list[int], tokens):
    return step(engine, list(slots), tokens, [])[0]


def mixed_step(engine, slots: list[int], tokens, chunk_slot: int, ids: list[int], padded: int | None = None):
    decoded, chunk = step(engine, list(slots), tokens, [(chunk_slot, list(ids))], padded)
    return decoded, chunk[0]


def assume_length(engine, slot: int, length: int) -> None:
    """Warm-up only: slot `slot` holds `length` tokens of junk (its blocks allocated)."""
    if not 0 <= length < engine.max_seq:
        raise FdppError(f"a slot holds 0 to {engine.max_seq - 1} tokens, not {length}")
    engine.kv.assume(slot, length)


def prefill_batch(engine, prompts: list):
    """Prompt b into slot b, as rounds of batched chunks: each round one step of the next chunk of as many
    unfinished prompts as MAX_GRAPH_PREFILL tokens hold (16 prompts of 128 tokens: one pass of 2,048 tokens; 256
    of 512: 64 passes of 4). Returns the last positions' logits [len(prompts), V]."""
    done = [0] * len(prompts)
    logits = [None] * len(prompts)
    for slot in range(len(prompts)):
        engine.kv.release(slot)
    while any(done[b] < len(ids) for b, ids in enumerate(prompts)):
        waiting = [b for b, ids in enumerate(prompts) if done[b] < len(ids)]
        longest = max(len(prompts[b]) - done[b] for b in waiting)
        chunk = min(MAX_GRAPH_PREFILL, pick(min(longest, engine.max_seq), engine.prefill_buckets))
        group = waiting[:max(1, MAX_GRAPH_PREFILL // chunk)]
        chunks = [(b, list(prompts[b][done[b]:done[b] + chunk])) for b in group]
        out = step(engine, [], None, chunks)[1]
        for row, (b, ids) in enumerate(chunks):
            done[b] += len(ids)
            logits[b] = out[row]
    return torch.stack(logits)
