"""The slot API of a contiguous engine (kv_cache.SlotCache): sequence b lives in cache slot b.

Engine forwards its slot calls here when it is not paged (paged_engine.py has the same functions for a paged
cache). A decode step feeds the graph the cache views of its bucket (buckets.py); the first step of a bucket is
traced (and is the step itself), then the bucket's Program is captured once into a CUDA graph whose static inputs
are the token and past_len buffers, and every later step of that bucket is one replay (programs.py). A prompt pass
(or chunk) of up to MAX_GRAPH_PREFILL tokens is likewise captured per (slot, prefill bucket, KV bucket) on its first
run and replayed after: replaying a traced Program from Python costs host time per layer, more than the GPU work
of a short chunk. `mixed_step` runs a decode step and one prompt chunk in one pass (mixed.py).
"""

from __future__ import annotations

import torch

from fdpp_rewrite.engine import buckets, mixed
from fdpp_rewrite.engine.buckets import MAX_GRAPH_PREFILL, pick
from fdpp_rewrite.engine.kv_cache import upload
from fdpp_rewrite.errors import FdppError


def reset(engine) -> None:
    engine.kv.reset()
    engine.step_ids.zero_()
    engine.active = 0

def prefill(engine, slot: int, ids: list[int]):
    """Run a prompt into cache slot `slot` (batch 1); returns the last prompt position's logits [V].

    The prompt is right-padded (token 0) to its prefill bucket, so every prompt length of a bucket replays one
    traced Program. Exact: attention is causal, so the padding changes no prompt position, and the cache rows
    it writes past the prompt are masked (past_len) until the decode step of each position overwrites them.
    Example: 100 tokens run as 128; logits come from position 99; rows 100..127 are rewritten by steps 1..28.
    A prompt over MAX_PREFILL_CHUNK tokens runs as consecutive chunks of that size (prefill_chunk)."""
    seq = len(ids)
    if seq > buckets.MAX_PREFILL_CHUNK:
        engine.kv.set_length(slot, 0)
        for start in range(0, seq, buckets.MAX_PREFILL_CHUNK):
            logits = engine.prefill_chunk(slot, ids[start:start + buckets.MAX_PREFILL_CHUNK])
        return logits
    padded = pick(seq, engine.prefill_buckets)
    logits = prompt_pass(engine, slot, ids, 0, padded, pick(padded, engine.kv_buckets))
    engine.kv.set_length(slot, seq)
    return logits

def prompt_pass(engine, slot: int, ids: list[int], start: int, padded: int, kv_len: int):
    """Run `ids` right-padded to `padded` into `slot` after its first `start` tokens, over the cache view
    [:kv_len]; returns the logits [V] of the last id. A CUDA-graph replay where one was captured for (slot,
    padded, kv_len), else the traced Program (captured now when graphs apply)."""
    seq = len(ids)
    padded_ids = upload(list(ids) + [0] * (padded - seq), engine.device).reshape(1, padded)
    graphs = engine.graph_prefill and padded <= MAX_GRAPH_PREFILL
    if graphs:
        input_ids = engine.prefill_ids.get(padded)
        if input_ids is None:
            input_ids = engine.prefill_ids[padded] = torch.zeros(1, padded, dtype=torch.int64, device=engine.device)
        input_ids.copy_(padded_ids)
        past = engine.prefill_past
        past.fill_(start)
        engine.prefill_last.fill_(seq - 1)
        key = (slot, padded, kv_len)
        if key in engine.prefill_graphs:
            graph, last = engine.prefill_graphs[key]
            graph.replay()
            return last[0].clone()  # the next replay of this graph rewrites `last`
    else:
        input_ids = padded_ids
        past = upload([start], engine.device)
    feeds = engine.feeds(input_ids, past, slice(slot, slot + 1), kv_len, start=start)
    # a Hugging Face graph's chunk after `start` tokens has its own past length: keep only start-0 Programs
    logits = engine.forward(feeds, cache_program=engine.hf_feeds is None or start == 0)
    if graphs:
        program = engine.programs[engine.program_key(feeds)]
        engine.prefill_graphs[key] = engine.traced.capture(program, feeds,
                                                       lambda out: out[0].index_select(0, engine.prefill_last))
    return logits[0, seq - 1]

def decode_buckets(engine, batch: int) -> tuple[int, int]:
    longest = max(engine.lengths[:batch]) + 1  # the new token's position must be inside the view
    engine.kv.check_fits(longest)
    return pick(batch, engine.batch_buckets), pick(longest, engine.kv_buckets)

def decode(engine, tokens):
    """One decode step of the active sequences with tokens [B] (device int64); returns logits [B, V]."""
    batch = engine.active
    bucket_batch, kv_len = decode_buckets(engine, batch)
    engine.step_ids[:batch, 0].copy_(tokens)
    logits = run_decode_bucket(engine, bucket_batch, kv_len)
    engine.kv.advance_first(batch)
    return logits[:batch, -1]

def run_decode_bucket(engine, bucket_batch: int, kv_len: int):
    """One step of slots [0, bucket_batch) from step_ids and past_len: a graph replay, or the bucket's first
    step traced eagerly (and captured). Returns the bucket's logits [bucket_batch, 1, V]."""
    key = (bucket_batch, kv_len)
    if key in engine.graphs:
        graph, logits = engine.graphs[key]
        if engine.hf_feeds is not None:  # the mask is a graph input the step's lengths decide
            engine.hf_feeds.refresh_decode_mask(engine.past_len[:bucket_batch], bucket_batch, kv_len)
        graph.replay()
        return logits
    feeds = engine.feeds(engine.step_ids[:bucket_batch], engine.past_len[:bucket_batch], slice(0, bucket_batch), kv_len)
    logits = engine.forward(feeds, cache_program=True)
    if engine.use_graphs:
        capture(engine, key, feeds)
    return logits

def capture(engine, key, feeds) -> None:
    """Record the bucket's Program into a CUDA graph (recording runs nothing: the step already ran)."""
    engine.graphs[key] = engine.traced.capture(engine.programs[engine.program_key(feeds)], feeds)

# -- slot-level work (the server's scheduler) ----------------------------------------------------------------

def prefill_chunk(engine, slot: int, ids: list[int]):
    """Run the next `ids` of a prompt into `slot`, after the lengths[slot] tokens already there (batch 1,
    past_len = those tokens); returns the chunk's last position's logits [V]. A whole prompt in one chunk is
    exactly Engine.prefill. Padding as in Engine.prefill, capped at max_seq: its rows past the chunk are
    masked until the next chunk or decode step rewrites them.
    Example: a 300-token prompt in chunks of 128: past_len 0, 128, 256; the last chunk (44) runs as 64."""
    start, seq = engine.lengths[slot], len(ids)
    if not ids or start + seq > engine.max_seq:
        raise FdppError(f"slot {slot} holds {start} tokens; a chunk of {seq} must be non-empty and end within "
                        f"the engine's max sequence {engine.max_seq}")
    padded = min(pick(seq, engine.prefill_buckets), engine.max_seq - start)
    logits = prompt_pass(engine, slot, ids, start, padded, pick(start + padded, engine.kv_buckets))
    engine.kv.set_length(slot, start + seq)
    return logits

def slot_buckets(engine, slots: list[int]) -> tuple[int, int]:
    """(batch bucket, KV bucket) of a decode step of `slots`: the batch bucket covers slots [0, max(slots)],
    the KV bucket the longest length among all of them (decoding or not: every slot of the bucket writes a row
    at its length, which must lie inside the view)."""
    bucket_batch = pick(max(slots) + 1, engine.batch_buckets)
    longest = max(engine.lengths[:bucket_batch]) + 1
    engine.kv.check_fits(longest)
    return bucket_batch, pick(longest, engine.kv_buckets)

def decode_slots(engine, slots: list[int], tokens):
    """One decode step of the sequences in `slots` (distinct) with tokens [len(slots)] (device int64);
    returns their logits [len(slots), V] in that order. Only these slots advance.

    The step runs every slot of the bucket, and each writes a K/V row at its own past_len: a free slot (length
    0) writes row 0, which its next prefill rewrites; a slot mid-prefill writes row lengths[slot], the first
    row its next chunk writes. Neither is advanced, so neither is corrupted."""
    bucket_batch, kv_len = slot_buckets(engine, slots)
    index = upload(slots, engine.device)
    engine.step_ids[index, 0] = tokens
    logits = run_decode_bucket(engine, bucket_batch, kv_len)
    engine.kv.advance(slots, bucket_batch)
    return logits[index, -1]

def mixed_step(engine, slots: list[int], tokens, chunk_slot: int, ids: list[int], padded: int | None = None):
    """One pass that is a decode step of `slots` (as decode_slots) and the next `ids` of the prompt in
    `chunk_slot` (as prefill_chunk), reading the weights once (mixed.py). `padded`: the length the chunk runs
    as (default its prefill bucket; a server passes one size for every chunk, so fewer shapes are captured).
    Returns (the slots' logits [len(slots), V] in their order, the logits [V] of the chunk's last id).
    Example: slots [0, 2] decoding, slot 1 prefilling its next 100 tokens padded to 128: one pass of
    input_ids [1, 4 + 128] over the batch bucket of 4."""
    if engine.mixed_reason is not None:
        raise FdppError(f"this engine cannot run mixed steps ({engine.mixed_reason}); run prefill_chunk and "
                        "decode_slots separately")
    start, seq = engine.lengths[chunk_slot], len(ids)
    padded = padded or pick(max(seq, 1), engine.prefill_buckets)
    if not ids or not slots or chunk_slot in slots or seq > padded or start + padded > engine.max_seq:
        raise FdppError(f"a mixed step needs decode slots other than the chunk's slot {chunk_slot} and a "
                        f"non-empty chunk of at most {padded} tokens that ends, padded, within the engine's max "
                        f"sequence {engine.max_seq} (slot {chunk_slot} holds {start} tokens, chunk {seq})")
    bucket_batch = pick(max(max(slots), chunk_slot) + 1, engine.batch_buckets)
    longest = max(max(engine.lengths[:bucket_batch]) + 1, start + padded)
    engine.kv.check_fits(longest)
    kv_len = pick(longest, engine.kv_buckets)
    index = upload(slots, engine.device)
    engine.step_ids[index, 0] = tokens
    input_ids, past, rows = mixed_inputs(engine, bucket_batch, padded)
    input_ids[0, :bucket_batch].copy_(engine.step_ids[:bucket_batch, 0])
    input_ids[0, bucket_batch:].copy_(upload(list(ids) + [0] * (padded - seq), engine.device))
    past[:bucket_batch].copy_(engine.past_len[:bucket_batch])
    past[bucket_batch:].fill_(start)
    rows[bucket_batch:].fill_(bucket_batch + seq - 1)  # the chunk's last real id
    key = (bucket_batch, padded, chunk_slot, kv_len)
    if key in engine.mixed_steps:
        runner, out = engine.mixed_steps[key]
        if engine.use_graphs:
            runner.replay()
        else:
            out = runner.run(mixed_feeds(engine, input_ids, past, kv_len))["logits"][0].index_select(0, rows)
    else:
        out = trace_mixed(engine, key, input_ids, past, rows)
    engine.lengths[chunk_slot] = start + seq
    engine.kv.advance(slots, bucket_batch)
    return out[index], out[bucket_batch].clone()  # a replay rewrites `out`

def mixed_inputs(engine, bucket_batch: int, padded: int):
    key = (bucket_batch, padded)
    if key not in engine.mixed_inputs:
        engine.mixed_inputs[key] = (torch.zeros(1, bucket_batch + padded, dtype=torch.int64, device=engine.device),
                                  torch.zeros(bucket_batch + 1, dtype=torch.int64, device=engine.device),
                                  torch.arange(bucket_batch + 1, dtype=torch.int64, device=engine.device))
    return engine.mixed_inputs[key]

def mixed_feeds(engine, input_ids, past, kv_len: int) -> dict:
    # every slot: the mixed step's ops slice the decode rows and the chunk's
    return {"input_ids": input_ids, "past_len": past, **engine.kv.views(slice(None), kv_len)}

def trace_mixed(engine, key, input_ids, past, rows):
    """Trace the mixed step of `key` (it runs now), then keep it: captured as a CUDA graph, else its Program.
    Returns the output rows [B + 1, V]: the decode rows of the bucket, then the chunk's last id."""
    bucket_batch, padded, slot, kv_len = key
    feeds = mixed_feeds(engine, input_ids, past, kv_len)
    layout = mixed.MixedLayout(batch=bucket_batch, slot=slot, chunk=padded)
    outputs, program = engine.traced.trace(feeds, engine.backend, layout=layout)
    out = outputs["logits"][0].index_select(0, rows)
    if not engine.use_graphs:
        engine.mixed_steps[key] = (program, None)
        return out
    engine.mixed_steps[key] = engine.traced.capture(program, feeds, lambda logits: logits[0].index_select(0, rows))
    return out

def assume_length(engine, slot: int, length: int) -> None:
    """Warm-up only: mark `slot` as holding `length` tokens, whatever its cache rows hold, so a warm-up walk
    reaches a KV bucket without prefilling up to it (the rows are junk: only shapes are being traced)."""
    if not 0 <= length < engine.max_seq:
        raise FdppError(f"a slot holds 0 to {engine.max_seq - 1} tokens, not {length}")
    engine.kv.set_length(slot, length)

def release(engine, slot: int) -> None:
    """Free a slot: length 0, so the decode steps of other slots write only its row 0 and the KV bucket is
    not held up by a finished sequence."""
    engine.kv.set_length(slot, 0)

# -- batch generation (generation.py) -------------------------------------------------------------------------


def prefill_batch(engine, prompts: list):
    """Prefill prompt b into slot b, one prompt at a time; returns the last positions' logits [len(prompts), V]."""
    return torch.stack([engine.prefill(slot, list(ids)) for slot, ids in enumerate(prompts)])


def not_paged(engine, *args):
    raise FdppError("this engine keeps contiguous slots: step, blocks_needed, attach_prefix and step_budget need a "
                    "paged engine (build --kv-memory 0.9, or load with kv_memory=)")


step = blocks_needed = attach_prefix = step_budget = not_paged
