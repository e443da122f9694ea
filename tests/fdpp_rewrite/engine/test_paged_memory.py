"""paged_memory.py on the CPU: the largest step a paged engine runs (the one its pool is sized around), the
reserve formula and the one-line pool summary."""

from types import SimpleNamespace

import pytest
import torch

from fdpp_rewrite.engine import buckets, paged_memory
from fdpp_rewrite.engine.buckets import MAX_GRAPH_PREFILL
from fdpp_rewrite.errors import FdppError

GIB = 2 ** 30


def _engine(max_batch):
    return SimpleNamespace(max_batch=max_batch, batch_buckets=buckets.batch_buckets(max_batch))


def test_chunks_a_step_carries_round_up_to_a_batch_bucket():
    engine = _engine(256)
    assert paged_memory.chunk_count(engine, 128) == 16  # 16 prompts of 128: one pass of 2,048
    assert paged_memory.chunk_count(engine, 4096) == 1  # a chunk past the budget still runs, alone
    assert paged_memory.chunk_count(engine, 682) == 4  # 3 chunks fit 2,048; they run as the bucket of 4
    assert paged_memory.chunk_count(_engine(2), 16) == 2  # never more chunks than rows


def test_the_largest_step_bounds_every_chunk_length():
    engine = _engine(256)
    bound = paged_memory.max_prefill_tokens(engine)
    assert MAX_GRAPH_PREFILL <= bound < 2 * MAX_GRAPH_PREFILL
    assert all(paged_memory.chunk_count(engine, c) * c <= bound for c in range(1, MAX_GRAPH_PREFILL + 1))
    batch, count, chunk = paged_memory.largest_step(engine)
    assert batch == 256 and count * chunk == bound and count in engine.batch_buckets
    small = _engine(1)  # one row: one chunk a step, so the longest chunk is the largest
    assert paged_memory.largest_step(small) == (1, 1, MAX_GRAPH_PREFILL)


def test_the_reserve_is_the_peak_its_graph_pool_and_a_headroom():
    peak = 3 * GIB
    assert paged_memory.reserve_bytes(peak) == peak * (1 + paged_memory.GRAPH_POOL_FACTOR) + paged_memory.HEADROOM_BYTES
    assert paged_memory.reserve_bytes(0) == paged_memory.HEADROOM_BYTES


def test_the_pool_line_says_what_the_capacity_check_needs():
    per_token = 2 * 32 * 32 * 128 * 2  # llama2-7b fp16: 512 KiB a token
    line = paged_memory.pool_line(3484, per_token, (125 * GIB, GIB, paged_memory.reserve_bytes(GIB)))
    assert "\n" not in line
    assert "3484 blocks of 64 tokens" in line and "108.88 GiB" in line and "222,912 tokens" in line
    assert "524,288 bytes a token" in line and "27 sequences of 8K" in line
    assert "125.00 GiB free" in line and "4.00 GiB kept back (step peak 1.00 GiB x 3 + 1 GiB)" in line


def test_kv_blocks_skip_the_measurement_and_are_checked():
    engine = SimpleNamespace(backend=SimpleNamespace(name="cuda"), dtype=torch.float16, num_layers=2,
                             plan={"num_kv_heads": 2, "head_dim": 8})  # no probe runs on cuda
    assert paged_memory.pool_blocks(engine, None, 5) == 5
    assert paged_memory.pool_line(5, 128).endswith("(128 bytes a token; 0 sequences of 8K); kv_blocks given")
    with pytest.raises(FdppError, match="kv_blocks must be at least 2"):
        paged_memory.pool_blocks(engine, None, 1)
