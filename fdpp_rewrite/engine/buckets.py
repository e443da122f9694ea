"""The shapes a step runs as: batch, KV-length and prefill buckets, and the limits on prompt passes.

A step of batch B whose longest sequence needs L positions runs as (pick(B, batch buckets), pick(L, KV buckets)),
so a short context reads a short cache view and each bucket is traced (and captured) once.
"""

from __future__ import annotations

MIN_KV_BUCKET = 128
MIN_PREFILL_BUCKET = 16
# Prompts longer than this are prefilled in chunks (Engine.prefill_chunk): one pass over a 32K prompt with 32 KV
# heads would exceed the prefill attention's launch grid (kv heads x row blocks <= 65535), and chunks bound the
# activations too.
MAX_PREFILL_CHUNK = 8192
# Prompt passes up to this many (padded) tokens are replayed from CUDA graphs; a longer pass is compute-bound
# enough that the host time does not matter, and its graph would pin a large activation pool.
MAX_GRAPH_PREFILL = 2048
# Sequence rows an engine is built for by default: contiguous slots each reserve max_seq of cache; a paged row costs
# only a block-table row, so a paged build takes hundreds.
DEFAULT_MAX_BATCH = 8
PAGED_MAX_BATCH = 256


def _doubling(first: int, last: int) -> list[int]:
    sizes, size = [], first
    while size < last:
        sizes.append(size)
        size *= 2
    return sizes + [last]


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... below max_batch, then max_batch. Example: max_batch 12 -> [1, 2, 4, 8, 12]."""
    return _doubling(1, max_batch)


def kv_buckets(max_seq: int) -> list[int]:
    """128, 256, ... below max_seq, then max_seq. Example: max_seq 1000 -> [128, 256, 512, 1000]."""
    return _doubling(MIN_KV_BUCKET, max_seq)


def prefill_buckets(max_seq: int) -> list[int]:
    """Prompt lengths a prefill is padded to: 16, 32, ... below max_seq, then max_seq."""
    return _doubling(MIN_PREFILL_BUCKET, max_seq)


def pick(value: int, buckets: list[int]) -> int:
    """The smallest bucket >= value. Example: pick(100, [128, 256]) -> 128."""
    return next(b for b in buckets if b >= value)
