"""The HTTP side over the paged scheduler (the fake paged engine, no model): /health and /metrics show the KV
blocks, a prompt that cannot fit the whole pool is refused at submission with a one-line 400, and serve's
paged-only options are refused on an engine with KV slots."""

import argparse
from types import SimpleNamespace

import pytest
from fake_paged_engine import FakePagedEngine, greedy
from starlette.testclient import TestClient

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.serve import server


@pytest.fixture()
def client():
    engine = FakePagedEngine(num_blocks=11, block_size=16, max_batch=4)  # 10 blocks: 160 tokens
    app, scheduler = server.build_app(engine, model_name="fake", prefill_budget=64, max_batch=3)
    with TestClient(app) as http:
        yield http, scheduler


def test_health_metrics_and_a_completion(client):
    http, scheduler = client
    assert http.get("/health").json() == {"status": "ok", "last_engine_error": None,
                                          "kv_blocks": {"used": 0, "free": 10, "total": 10}}
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    answer = http.post("/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 6,
                                                "temperature": 0})
    expected = ",".join(map(str, greedy(prompt, 6, 50)))
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == expected
    assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 160
    metrics = http.get("/metrics").text
    assert "fdpp_kv_blocks_total 10" in metrics and "fdpp_kv_slots_total 3" in metrics
    assert "# TYPE fdpp_kv_blocks_total gauge" in metrics and "# TYPE fdpp_preemptions_total counter" in metrics
    assert "fdpp_preemptions_total 0" in metrics and "fdpp_prefill_tokens_per_step_sum 8.000000" in metrics
    assert "fdpp_prefill_tokens_per_step_count 6" in metrics  # the chunk step, then 5 decode steps


@pytest.mark.parametrize("prompt_len, max_tokens, message", [
    (160, 1, "the prompt has 160 tokens; this server takes at most 159 (this server's KV cache of 10 blocks of 16 "
              "tokens, sized by serve --kv-memory: 160 tokens)"),
    (100, 61, "exceed this server's KV cache of 10 blocks of 16 tokens, sized by serve --kv-memory (160 tokens); "
              "lower max_tokens to 60 or less"),
])
def test_what_cannot_fit_the_pool_is_refused_in_one_line(client, prompt_len, max_tokens, message):
    http, scheduler = client
    answer = http.post("/v1/completions", json={"model": "fake", "prompt": [1] * prompt_len,
                                                "max_tokens": max_tokens})
    error = answer.json()["error"]
    assert answer.status_code == 400 and message in error["message"] and "\n" not in error["message"]
    assert scheduler.submitted == 0


def test_paged_options_need_a_paged_engine(monkeypatch):
    from fdpp_rewrite.engine.runtime import Engine

    loaded = {}

    def load(folder, **options):
        loaded.clear()
        loaded.update(options)
        return SimpleNamespace(paged=False, max_batch=16)

    monkeypatch.setattr(Engine, "load", staticmethod(load))
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    args = parser.parse_args(["engine", "--kv-memory", "0.5", "--no-prefix-cache"])
    with pytest.raises(FdppError, match="--no-prefix-cache applies to a paged KV cache; this engine has 16 KV slots"):
        server.load_engine(args)
    assert loaded == {"backend": args.backend, "kv_memory": "0.5", "prefix_caching": False}
    plain = server.load_engine(parser.parse_args(["engine"]))
    assert not plain.paged and loaded == {"backend": args.backend}
    for bad, message in ((["--prefill-budget", "0"], "--prefill-budget must be at least 1"),
                         (["--max-batch", "0"], "--max-batch must be at least 1"),
                         (["--kv-memory", "2.5"], "--kv-memory 2.5"), (["--kv-memory", " "], "--kv-memory")):
        with pytest.raises(FdppError, match=message):
            server.check_options(parser.parse_args(["engine", *bad]))
    server.check_options(parser.parse_args(["engine", "--kv-memory", "20GiB", "--max-batch", "64"]))
