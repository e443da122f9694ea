"""The server's warm-up: run the engine's shapes on dummy tokens before the first request, so no request pays for a
trace (and, on cuda, a decode bucket's CUDA-graph capture).

    decode  every decode bucket (batch bucket x KV bucket). Slot 0 is filled with prompt chunks of the scheduler's
            --prefill-chunk size up to one row below each KV bucket (so the chunks a long prompt takes are traced
            on the way); then one step per batch bucket steps the bucket's last slot (the slots between are free,
            as in a server's step). Batch 1 steps last: it advances slot 0 itself, into the next KV bucket.
    all     decode, then every prefill chunk shape: a chunk of each prefill bucket up to --prefill-chunk into
            each KV bucket (a Hugging Face graph caches only a prompt's first chunk, so that is the one it runs),
            in every slot where prompt passes replay CUDA graphs (they are captured per slot), else in slot 0.
    none    nothing: the first request of each shape traces it.

Only the engine's slot methods run (prefill_chunk, decode_slots, release, reset), so a tensor-parallel engine's
ranks follow. The walk yields after each engine call, for the caller to stop between them.
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
    from fdpp_rewrite.engine.runtime import pick  # torch: imported when the warm-up runs, not for --help

    largest = pick(min(chunk, engine.max_seq), engine.prefill_buckets)
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


def walk(engine, mode: str, chunk: int):
    if mode not in MODES:
        raise ValueError(f"unknown warm-up mode {mode!r}")
    if mode != "none":
        yield from decode_walk(engine, chunk)
    if mode == "all":
        yield from prefill_walk(engine, chunk)


def warm_up(engine, mode: str, chunk: int, stopping=lambda: False, stream=None) -> int:
    """Run the walk of `mode` (stopping() is asked between engine calls), then free every slot. Prints what it
    traced and how long it took; returns the number of shapes traced."""
    stream = stream or sys.stderr
    decode_shapes = len(engine.batch_buckets) * len(engine.kv_buckets)
    print(f"warming up ({mode}): {decode_shapes} decode buckets ({len(engine.batch_buckets)} batch x "
          f"{len(engine.kv_buckets)} KV)" + (f" and the prefill chunks of {prefill_sizes(engine, chunk)} tokens in "
                                             f"{len(warm_slots(engine))} slot(s)" if mode == "all" else "")
          + "; /health answers 503 meanwhile",
          file=stream, flush=True)
    started, before = time.perf_counter(), len(engine.programs)
    try:
        for _ in walk(engine, mode, chunk):
            if stopping():
                break
    finally:
        engine.reset()
    traced = len(engine.programs) - before
    captured = f", {len(engine.prefill_graphs)} prompt-pass graphs" if engine.prefill_graphs else ""
    print(f"warm-up done: {traced} shapes traced{captured} in {time.perf_counter() - started:.1f} s", file=stream,
          flush=True)
    return traced
