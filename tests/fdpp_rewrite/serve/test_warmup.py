"""The server's warm-up (fdpp_rewrite/serve/warmup.py) on the cpu backend: it traces every decode bucket (and with
`all` every prefill chunk shape), leaves every slot free, and the first request then gets what Engine.generate
gives alone; until it has run, /health and the completions answer 503."""

import io

import pytest
from fastapi.testclient import TestClient

from fdpp_rewrite.engine.runtime import Engine, Sampler
from fdpp_rewrite.serve.requests import Request
from fdpp_rewrite.serve.scheduler import Scheduler
from fdpp_rewrite.serve.server import build_app
from fdpp_rewrite.serve.warmup import mixed_count

CHUNK = 32
PROMPT = [(7 * i + 3) % 390 for i in range(45)]


def decode_keys(engine):
    return {((batch, 1), kv_len) for batch in engine.batch_buckets for kv_len in engine.kv_buckets}


def run_alone(scheduler, prompt, max_tokens):
    request = Request(prompt=prompt, max_tokens=max_tokens, sampler=Sampler(), emit=lambda event: None)
    scheduler.submit(request)
    for _ in range(200):
        if all(r is None for r in scheduler.slots) and not scheduler.waiting:
            return request.tokens
        scheduler.run_once()
    raise AssertionError("the scheduler did not drain")


def test_decode_warm_up_traces_every_decode_bucket_and_frees_the_slots(engine_dir, tokenizer):
    engine = Engine(engine_dir)
    scheduler = Scheduler(engine, tokenizer, prefill_chunk=CHUNK, warmup="decode")
    assert scheduler.warming and not engine.programs
    progress = io.StringIO()
    scheduler.warm_up(progress)
    assert not scheduler.warming and scheduler.last_error is None
    assert decode_keys(engine) <= set(engine.programs)
    assert ((1, CHUNK), 128) in engine.programs  # slot 0 was filled with --prefill-chunk chunks on the way
    assert engine.lengths == [0] * engine.max_batch and engine.past_len.tolist() == [0] * engine.max_batch
    assert scheduler.gauges()["kv_slots_in_use"][1] == 0
    text = progress.getvalue()
    assert f"{len(decode_keys(engine))} decode buckets" in text and f"{len(engine.programs)} shapes traced" in text
    traced = set(engine.programs)
    tokens = run_alone(scheduler, PROMPT, 10)
    assert tokens == Engine(engine_dir).generate([PROMPT], 10).tokens[0]
    assert all(seq > 1 for (_, seq), _ in set(engine.programs) - traced)  # its decode steps traced nothing


def test_all_warm_up_adds_every_prefill_chunk_shape(engine_dir, tokenizer):
    engine = Engine(engine_dir)
    scheduler = Scheduler(engine, tokenizer, prefill_chunk=CHUNK, warmup="all")
    scheduler.warm_up(io.StringIO())
    prefill_keys = {((1, size), kv_len) for size in (16, 32) for kv_len in engine.kv_buckets}
    assert (decode_keys(engine) | prefill_keys) <= set(engine.programs)
    assert engine.lengths == [0] * engine.max_batch
    traced = len(engine.programs)
    tokens = run_alone(scheduler, PROMPT, 10)  # chunks of 32 and 13 (run as 16), then decode steps
    assert tokens == Engine(engine_dir).generate([PROMPT], 10).tokens[0] and len(engine.programs) == traced


def test_all_warm_up_adds_every_mixed_step_shape(engine_dir, tokenizer):
    """Every (batch bucket, chunk, chunk slot, KV bucket) the scheduler can meet is traced: requests that join
    while others decode then trace nothing, and get their tokens alone."""
    engine = Engine(engine_dir)
    scheduler = Scheduler(engine, tokenizer, prefill_chunk=CHUNK, warmup="all")
    scheduler.warm_up(io.StringIO())
    shapes = set(engine.mixed_steps)
    assert len(shapes) == mixed_count(engine, CHUNK) > 0
    assert {(batch, CHUNK, slot, kv) for batch, _, slot, kv in shapes} == shapes  # one chunk size
    assert {slot for _, _, slot, _ in shapes} == set(range(engine.max_batch))
    assert engine.lengths == [0] * engine.max_batch
    first = Request(prompt=PROMPT, max_tokens=12, sampler=Sampler(), emit=lambda event: None)
    scheduler.submit(first)
    scheduler.run_once()
    second = Request(prompt=PROMPT[:40], max_tokens=5, sampler=Sampler(), emit=lambda event: None)
    scheduler.submit(second)
    while any(r is not None for r in scheduler.slots):
        scheduler.run_once()
    alone = Engine(engine_dir)
    assert first.tokens == alone.generate([PROMPT], 12).tokens[0]
    assert second.tokens == alone.generate([PROMPT[:40]], 5).tokens[0]
    assert scheduler.mixed_steps and set(engine.mixed_steps) == shapes


def test_no_warm_up_traces_nothing(engine_dir, tokenizer):
    engine = Engine(engine_dir)
    scheduler = Scheduler(engine, tokenizer, warmup="none")
    assert not scheduler.warming
    scheduler.warm_up(io.StringIO())
    assert not engine.programs


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_health_and_completions_are_503_while_warming_up(engine_dir):
    app, scheduler = build_app(Engine(engine_dir), model_name="tiny", prefill_chunk=CHUNK, warmup="decode")
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    client = TestClient(app)  # outside `with`: the lifespan (the scheduler thread) has not started
    health = client.get("/health")
    assert health.status_code == 503 and health.json() == {"status": "warming up"}
    refused = client.post("/v1/completions", json=body)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "warming_up"
    with TestClient(app) as running:  # the scheduler thread warms up, then serves
        for _ in range(600):
            if running.get("/health").status_code == 200:
                break
            scheduler.thread.join(0.05)
        assert running.get("/health").json()["status"] == "ok"
        answer = running.post("/v1/completions", json=body)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
        assert decode_keys(scheduler.engine) <= set(scheduler.engine.programs)
