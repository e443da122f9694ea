"""The server's warm-up: run the engine's shapes on dummy tokens before the first request, so no request pays for a
trace (and, on cuda, a decode bucket's CUDA-graph capture).

    decode  every decode bucket (batch bucket x KV bucket). Slot 0 is filled with prompt chunks of the scheduler's
            --prefill-chunk size up to one row below each KV bucket (so the chunks a long prompt takes are traced
            on the way); then one step per batch bucket steps the bucket's last slot (the slots between are free,
            as in a server's step). Batch 1 steps last: it advances slot 0 itself, into the next KV bucket.
            Then, where the engine runs mixed steps, each one the scheduler can meet: a chunk of the
            --prefill-chunk bucket in each slot, with each batch bucket that holds that slot and each KV bucket
            the chunk can end in (slot lengths are set, not prefilled: only shapes matter).
    all     decode, then every prefill chunk shape: a chunk of each prefill bucket up to --prefill-chunk into
            each KV bucket (a Hugging Face graph caches only a prompt's first chunk, so that is the one it runs),
            in every slot where prompt passes replay CUDA graphs (they are captured per slot), else in slot 0.
    none    nothing: the first request of each shape traces it.

Only the engine's slot methods run (prefill_chunk, decode_slots, release, reset), so a tensor-parallel engine's
ranks follow. The walk yields after each engine call, for the caller to stop between them.

A paged engine (warm_up_paged) runs every shape as one engine.step, keyed (decode rows' bucket, chunks' bucket,
chunk length, KV bucket); the paged scheduler pads every chunk to the --prefill-chunk bucket and carries at most
--prefill-budget / that many chunks a step. Each shape is set up with assume_length (rows of junk, their blocks
allocated), run once and reset:
    decode  every decode row bucket up to the server's rows, alone, with one chunk and with the most chunks a step
            carries (steps with any other chunk count trace on first use), and every chunk-only step; each at
            every KV bucket;
    all     decode, plus every chunk count bucket with every decode row bucket;
    none    nothing.
A shape whose rows the pool cannot hold is skipped (counted in the summary line).
"""

from __future__ import annotations

import sys
import time

MODES = ("all", "decode", "none")
DUMMY_TOKEN = 0


def fill(engine, slot: int, target: int, chunk: int):
    """Prompt chunks of `chunk` dummy tokens into `slot` until it holds `target` tokens (one call per yield)."""
    while engine.lengths[slot] < target:
        engine.prefill_chunk(slot, [DUMMY_TOKEN] * min(chunk, target - engine.lengths[slot]))
        yield


def decode_walk(engine, chunk: int):
    import torch

    token = torch.full((1,), DUMMY_TOKEN, dtype=torch.int64, device=engine.device)
    for kv_len in engine.kv_buckets:
        yield from fill(engine, 0, kv_len - 1, chunk)  # the step's new row (kv_len - 1) is the bucket's last
        for bucket in reversed(engine.batch_buckets):
            last = bucket - 1
            engine.decode_slots([last], token)
            if last:
                engine.release(last)
            yield


def prefill_sizes(engine, chunk: int) -> list[int]:
    """The padded lengths a chunk of at most `chunk` tokens runs as."""
    largest = engine.chunk_bucket(chunk)
    return [size for size in engine.prefill_buckets if size <= largest]


def warm_slots(engine) -> range:
    """The slots the prefill walk runs in: each has its own prompt-pass CUDA graphs, else one traces them all."""
    return range(engine.max_batch if engine.graph_prefill else 1)


def prefill_walk(engine, chunk: int):
    """One chunk of each size per KV bucket: the slot is grown (in chunks of the largest size) to the start that
    puts the chunk's end on the bucket's last row. A Hugging Face graph caches a prompt's first chunks only."""
    sizes = prefill_sizes(engine, chunk)
    for slot in warm_slots(engine):
        for size in sizes:
            engine.reset()
            if engine.hf_feeds is not None:
                engine.prefill_chunk(slot, [DUMMY_TOKEN] * size)
                yield
                continue
            for kv_len in engine.kv_buckets:
                start = kv_len - size
                if start < engine.lengths[slot]:  # a bucket smaller than the chunk, or one the last chunk passed
                    continue
                yield from fill(engine, slot, start, sizes[-1])
                engine.prefill_chunk(slot, [DUMMY_TOKEN] * size)
                yield


def mixed_shapes(engine, chunk: int):
    """(decode slot, chunk slot, chunk start) of one mixed step per shape the scheduler can meet: every chunk slot,
    every batch bucket holding it (one decode row, the bucket's last slot or the one below the chunk's), and every
    KV bucket the chunk, padded, can end in."""
    if not engine.supports_mixed:
        return
    padded = engine.chunk_bucket(chunk)
    for slot in range(engine.max_batch):
        for bucket in engine.batch_buckets:
            decode = bucket - 1 if bucket - 1 != slot else slot - 1
            if bucket <= slot or decode < 0:
                continue
            for kv_len in engine.kv_buckets:
                if kv_len >= padded:
                    yield decode, slot, kv_len - padded


def mixed_walk(engine, chunk: int):
    import torch

    token = torch.full((1,), DUMMY_TOKEN, dtype=torch.int64, device=engine.device)
    padded = engine.chunk_bucket(chunk)
    for decode, slot, start in mixed_shapes(engine, chunk):
        engine.reset()
        engine.assume_length(decode, 1)
        engine.assume_length(slot, start)
        engine.mixed_step([decode], token, slot, [DUMMY_TOKEN] * padded, padded)
        yield


def mixed_count(engine, chunk: int) -> int:
    return sum(1 for _ in mixed_shapes(engine, chunk))


def walk(engine, mode: str, chunk: int):
    if mode not in MODES:
        raise ValueError(f"unknown warm-up mode {mode!r}")
    if mode != "none":
        yield from decode_walk(engine, chunk)
        yield from mixed_walk(engine, chunk)  # under load most steps are mixed
    if mode == "all":
        yield from prefill_walk(engine, chunk)


def warm_up(engine, mode: str, chunk: int, stopping=lambda: False, stream=None) -> int:
    """Run the walk of `mode` (stopping() is asked between engine calls), then free every slot. Prints what it
    traced and how long it took; returns the number of shapes traced."""
    stream = stream or sys.stderr
    decode_shapes = len(engine.batch_buckets) * len(engine.kv_buckets)
    plan = (f"{decode_shapes} decode buckets ({len(engine.batch_buckets)} batch x {len(engine.kv_buckets)} KV), "
            f"{mixed_count(engine, chunk)} mixed step shapes")
    if mode == "all":
        plan += f" and the prefill chunks of {prefill_sizes(engine, chunk)} tokens in {len(warm_slots(engine))} slot(s)"
    print(f"warming up ({mode}): {plan}; /health answers 503 meanwhile", file=stream, flush=True)
    started, before = time.perf_counter(), len(engine.programs)
    try:
        for _ in walk(engine, mode, chunk):
            if stopping():
                break
    finally:
        engine.reset()
    traced = len(engine.programs) - before
    captured = f", {len(engine.prefill_graphs)} prompt-pass graphs" if engine.prefill_graphs else ""
    captured += f", {len(engine.mixed_steps)} mixed steps" if engine.mixed_steps else ""
    print(f"warm-up done: {traced} shapes traced{captured} in {time.perf_counter() - started:.1f} s", file=stream,
          flush=True)
    return traced


# -- paged engines ----------------------------------------------------------------------------------------------------

def buckets_up_to(engine, count: int) -> list[int]:
    """The batch buckets a count of 1..count rows runs as."""
    return [b for b in engine.batch_buckets if b < count] + [next(b for b in engine.batch_buckets if b >= count)]


def fewest(engine, bucket: int) -> int:
    """The fewest rows that run as `bucket` (0 for 0): the shape's key is the bucket, and fewer rows leave room
    for the other kind in the server's rows (3 decode rows + 1 chunk run as the 4-row bucket with a chunk)."""
    smaller = [b for b in engine.batch_buckets if b < bucket]
    return min(bucket, (smaller[-1] if smaller else 0) + 1)


def paged_shapes(engine, mode: str, chunk: int, budget: int, rows: int) -> list[tuple[int, int, int]]:
    """(decode rows, chunks, KV bucket) of each step shape the paged walk runs: a bucket of decode rows and one of
    chunks, each as its fewest rows, that fit the server's rows together."""
    if mode == "none":
        return []
    padded = engine.chunk_bucket(chunk)
    most_chunks = min(max(1, budget // padded), rows)
    chunk_buckets = buckets_up_to(engine, most_chunks)
    counts = chunk_buckets if mode == "all" else sorted({chunk_buckets[0], chunk_buckets[-1]})
    shapes = []
    for kv_len in engine.kv_buckets:
        for batch in [0] + buckets_up_to(engine, rows):
            for count in [0] + (counts if batch else chunk_buckets):
                n, m = fewest(engine, batch), fewest(engine, count)
                if (n or m) and n + m <= rows and (not m or kv_len >= padded):
                    shapes.append((n, m, kv_len))
    return shapes


def run_paged_shape(engine, rows: int, chunks: int, kv_len: int, padded: int) -> bool:
    """One step of the shape from a reset engine: the longest row (a chunk's, else decode row 0's) ends at kv_len;
    the others hold one token. False where the pool cannot hold it."""
    import torch

    from fdpp_rewrite.engine.paged.blocks import OutOfBlocks

    engine.reset()
    try:
        for slot in range(rows):
            engine.assume_length(slot, kv_len - 1 if slot == 0 and not chunks else 1)
        for index in range(chunks):
            engine.assume_length(rows + index, kv_len - padded if index == 0 else 0)
        tokens = torch.full((rows,), DUMMY_TOKEN, dtype=torch.int64, device=engine.device)
        engine.step(list(range(rows)), tokens, [(rows + i, [DUMMY_TOKEN] * padded) for i in range(chunks)],
                    padded=padded)
    except OutOfBlocks:
        return False
    return True


def warm_up_paged(engine, mode: str, chunk: int, budget: int, rows: int, stopping=lambda: False,
                  stream=None) -> int:
    """The paged walk of `mode` (module docstring); returns the number of shapes run."""
    if mode not in MODES:
        raise ValueError(f"unknown warm-up mode {mode!r}")
    stream = stream or sys.stderr
    shapes = paged_shapes(engine, mode, chunk, budget, rows)
    print(f"warming up ({mode}): {len(shapes)} paged step shapes (rows up to {rows}, chunks of "
          f"{engine.chunk_bucket(chunk)} tokens); /health answers 503 meanwhile", file=stream, flush=True)
    started, ran, skipped = time.perf_counter(), 0, 0
    try:
        for shape in shapes:
            if stopping():
                break
            if run_paged_shape(engine, *shape, engine.chunk_bucket(chunk)):
                ran += 1
            else:
                skipped += 1
    finally:
        engine.reset()
    print(f"warm-up done: {ran} step shapes run, {skipped} skipped (more blocks than the pool holds) in "
          f"{time.perf_counter() - started:.1f} s", file=stream, flush=True)
    return ran
