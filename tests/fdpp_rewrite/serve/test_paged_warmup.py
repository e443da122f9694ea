"""The paged warm-up (fdpp_rewrite/serve/warmup.py, warm_up_paged) on the fake paged engine: every decode row
bucket up to the server's rows and the chunk counts the prefill budget produces, at each KV bucket, each shape
once; what the pool cannot hold is skipped; every block is free afterwards."""

import io

from fake_paged_engine import FakePagedEngine

from fdpp_rewrite.serve.paged_scheduler import PagedScheduler
from fdpp_rewrite.serve.warmup import paged_shapes, warm_up_paged


def test_paged_shapes_cover_the_rows_and_the_budgets_chunk_counts():
    engine = FakePagedEngine(max_batch=8, max_seq=256)  # batch buckets 1 2 4 8, KV buckets 64 128 256
    decode = paged_shapes(engine, "decode", chunk=32, budget=100, rows=6)  # 3 chunks of 32 a step: bucket 4
    # each bucket as its fewest rows: 1, 2, 3 (the 4-bucket), 5 (the 8-bucket, up to the server's 6 rows)
    assert {n for n, _, _ in decode} == {0, 1, 2, 3, 5}
    assert {m for n, m, _ in decode if n == 0} == {1, 2, 3}  # chunk-only steps: every chunk count bucket
    assert {m for n, m, _ in decode if n == 2} == {0, 1, 3}  # with decode rows: none, one, the most
    assert {m for n, m, _ in decode if n == 3} == {0, 1, 3}  # 3 decode rows + 3 chunks: the server's 6 rows
    assert {m for n, m, _ in decode if n == 5} == {0, 1}  # 5 + 1 rows: all there are
    assert {kv for _, _, kv in decode} == {64, 128, 256} and len(set(decode)) == len(decode)
    full = paged_shapes(engine, "all", chunk=32, budget=100, rows=6)
    assert set(decode) < set(full) and {m for n, m, _ in full if n == 2} == {0, 1, 2, 3}
    assert paged_shapes(engine, "none", chunk=32, budget=100, rows=6) == []


def test_warm_up_runs_each_shape_skips_what_the_pool_cannot_hold_and_frees_every_block():
    engine = FakePagedEngine(num_blocks=30, block_size=16, max_batch=8, max_seq=512)  # 29 blocks: 464 tokens
    shapes = paged_shapes(engine, "decode", chunk=32, budget=64, rows=8)
    progress = io.StringIO()
    ran = warm_up_paged(engine, "decode", chunk=32, budget=64, rows=8, stream=progress)
    steps = [call for call in engine.calls if call[0] == "step"]
    assert ran == len(steps) and 0 < ran < len(shapes)  # the 512-token shapes do not fit 29 blocks
    assert {(len(d), len(c)) for _, d, c, _ in steps} == {(n, m) for n, m, kv in shapes if kv < 512}
    assert all(padded == 32 for *_, padded in steps)
    assert f"{ran} step shapes run, {len(shapes) - ran} skipped" in progress.getvalue()
    assert engine.kv.used_blocks == 0 and engine.lengths == [0] * 8
    engine.check()


def test_the_paged_scheduler_warms_up_with_its_own_rows_and_budget():
    engine = FakePagedEngine(num_blocks=200, max_batch=8, max_seq=256)
    scheduler = PagedScheduler(engine, None, prefill_chunk=32, prefill_budget=64, max_batch=4, warmup="decode")
    progress = io.StringIO()
    scheduler.warm_up(progress)
    steps = [call for call in engine.calls if call[0] == "step"]
    assert not scheduler.warming and scheduler.last_error is None
    assert len(steps) == len(paged_shapes(engine, "decode", 32, 64, 4))
    assert max(len(d) + len(c) for _, d, c, _ in steps) == 4 and max(len(c) for _, _, c, _ in steps) == 2
    assert {(len(d), len(c)) for _, d, c, _ in steps} >= {(3, 1), (2, 2), (3, 0)}  # 3 rows: the 4-row bucket
    assert engine.kv.used_blocks == 0 and "rows up to 4, chunks of 32 tokens" in progress.getvalue()
