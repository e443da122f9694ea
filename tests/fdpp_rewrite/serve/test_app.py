"""The server end to end: the real uvicorn server (cpu backend, tiny-llama with a small BPE tokenizer) driven by
the `openai` client and raw HTTP. Greedy answers equal Engine.generate alone, streamed or not, concurrent or not;
chat uses the model's template; a client that goes away frees its slot; every refusal is OpenAI's error object."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve_server import wait_for

from fdpp_rewrite.engine.runtime import Engine

PROMPTS = ["the quick brown fox", "hello there, server", "a", "tokens and more tokens: " * 6, "zz top", "1 2 3 4",
           "what comes next?", "the end"]


@pytest.fixture(scope="module")
def alone(engine_dir, tokenizer):
    """Greedy text and token count of one prompt (ids) run alone through Engine.generate, stopping at EOS."""
    engine = Engine(engine_dir)

    def run(ids, max_tokens):
        tokens = engine.generate([ids], max_tokens, stop_ids={tokenizer.eos_id}).tokens[0]
        return tokenizer.decode(tokens), len(tokens)
    return run


def idle(server):
    return wait_for(lambda: server.metrics()["fdpp_kv_slots_in_use"] == 0)


def test_models_health_and_metrics(server):
    assert [m.id for m in server.client().models.list().data] == ["tiny"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    response = httpx.get(f"{server.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = server.metrics()
    assert samples["fdpp_kv_slots_total"] == 4 and samples['fdpp_softmax_fallback_rows_total{path="reference"}'] == 0
    assert "the cpu backend runs the reference path" in response.text
    for name in ("fdpp_queue_depth", "fdpp_running_sequences", "fdpp_time_to_first_token_seconds_count",
                 "fdpp_inter_token_latency_seconds_count", 'fdpp_requests_total{outcome="refused"}'):
        assert name in samples


def test_completion_equals_generate_alone(server, tokenizer, alone):
    ids = tokenizer.encode(PROMPTS[0])
    text, count = alone(ids, 20)
    client = server.client()
    result = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0)
    assert result.choices[0].text == text
    assert result.choices[0].finish_reason == ("length" if count == 20 else "stop")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(ids), count)
    assert result.usage.total_tokens == len(ids) + count
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == text

    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == result.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == count and all(c.usage is None for c in chunks[:-1])
    with httpx.stream("POST", f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3,
                                                                    "stream": True}) as raw:
        lines = [line for line in raw.iter_lines() if line]
    assert raw.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"


def test_concurrent_requests_equal_each_alone(server, tokenizer, alone):
    """8 requests on 4 slots (4 wait): greedy results as alone, streamed or not."""
    jobs = [(prompt, 8 + 5 * i, i % 2 == 0) for i, prompt in enumerate(PROMPTS)]
    expected = [alone(tokenizer.encode(p), n)[0] for p, n, _ in jobs]
    client = server.client()

    def ask(job):
        prompt, max_tokens, stream = job
        result = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=stream)
        return "".join(c.choices[0].text for c in result) if stream else result.choices[0].text

    with ThreadPoolExecutor(len(jobs)) as pool:
        assert list(pool.map(ask, jobs)) == expected
    assert idle(server)


def test_chat_uses_the_template(server, tokenizer, alone):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a colour"}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages))
    text, count = alone(ids, 15)
    client = server.client()
    result = client.chat.completions.create(model="tiny", messages=messages, max_tokens=15, temperature=0)
    assert result.choices[0].message.role == "assistant" and result.choices[0].message.content == text
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(ids), count)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=15, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].usage.total_tokens == len(ids) + count


def test_stop_string_and_seeded_sampling(server, tokenizer, alone):
    text, _ = alone(tokenizer.encode(PROMPTS[1]), 30)
    stop = text[10:13]
    client = server.client()
    result = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                       stop=["never", stop])
    assert result.choices[0].text == text[:text.index(stop)] and result.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=12, temperature=0.9,
                                         top_p=0.95, seed=11, extra_body={"top_k": 40}).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_a_client_that_goes_away_frees_its_slot(server):
    before = server.metrics()
    stream = server.client().completions.create(model="tiny", prompt="a", max_tokens=500, temperature=0,
                                                stream=True)
    next(iter(stream))
    stream.close()
    assert idle(server)
    after = server.metrics()
    assert after['fdpp_requests_total{outcome="cancelled"}'] == before['fdpp_requests_total{outcome="cancelled"}'] + 1
    assert after["fdpp_generation_tokens_total"] - before["fdpp_generation_tokens_total"] < 500  # cut short


BAD_REQUESTS = [
    ({"model": "tiny", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "temperature": 5}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "tiny", "prompt": "x", "top_k": 100000}, 400, "top_k"),
    ({"model": "tiny", "prompt": "x", "seed": -3}, 400, "seed"),
    ({"model": "tiny", "prompt": "x", "n": 2}, 400, "n"),
    ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "tiny", "prompt": "x", "colour": "red"}, 400, "colour"),
    ({"model": "tiny"}, 400, "prompt"),
    ({"model": "tiny", "prompt": ""}, 400, "prompt"),
    ({"model": "tiny", "prompt": [1] * 600}, 400, "prompt"),
    ({"model": "tiny", "prompt": [1] * 500, "max_tokens": 100}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": [1, 99999]}, 400, "prompt"),
    ({"model": "other", "prompt": "x"}, 404, "model"),
]


@pytest.mark.parametrize("body, status, param", BAD_REQUESTS, ids=[p for _, _, p in BAD_REQUESTS])
def test_refusals_are_openai_errors_naming_the_field(server, body, status, param):
    response = httpx.post(f"{server.url}/v1/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert param in error["message"] and "\n" not in error["message"]


def test_other_refusals(server):
    malformed = httpx.post(f"{server.url}/v1/completions", content=b'{"model": "tiny", "prompt": ',
                           headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and "not valid JSON" in malformed.json()["error"]["message"]
    no_messages = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
    bad_role = httpx.post(f"{server.url}/v1/chat/completions",
                          json={"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]})
    assert bad_role.status_code == 400 and "role" in bad_role.json()["error"]["message"]
    missing = httpx.get(f"{server.url}/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        server.client().completions.create(model="tiny", prompt="x", max_tokens=0)


def test_a_full_queue_is_503_with_retry_after(server):
    """4 slots busy and 4 requests waiting (--max-queue 4): the next request is refused at once."""
    body = {"model": "tiny", "prompt": "a", "max_tokens": 480, "temperature": 0, "stream": True}
    opened, release = [], threading.Event()

    def hold():
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            opened.append(response.status_code)
            release.wait(30)

    threads = [threading.Thread(target=hold) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert wait_for(lambda: server.metrics()["fdpp_queue_depth"] == 4)
        refused = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert opened == [200] * 8 and idle(server)


def test_request_timeout(engine_dir, capfd):
    from serve_server import RunningServer

    strict = RunningServer(engine_dir, request_timeout=0.05)
    try:
        response = httpx.post(f"{strict.url}/v1/completions", json={"model": "tiny", "prompt": "a",
                                                                    "max_tokens": 480, "temperature": 0})
        assert response.status_code == 504 and response.json()["error"]["type"] == "timeout"
        body = {"model": "tiny", "prompt": "a", "max_tokens": 480, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{strict.url}/v1/completions", json=body) as streamed:
            lines = [line for line in streamed.iter_lines() if line]
        assert '"code": "request_timeout"' in lines[-2] and lines[-1] == "data: [DONE]"  # an error event, then DONE
        assert strict.metrics()['fdpp_requests_total{outcome="timed_out"}'] == 2
        assert capfd.readouterr().err.count("ran past the request timeout of 0.05 s") == 2  # in the server's log
    finally:
        strict.close()
