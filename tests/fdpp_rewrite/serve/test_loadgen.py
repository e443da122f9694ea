"""scripts/loadgen.py, briefly, against the cpu server: two concurrencies, a few requests each."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "loadgen.py"


@pytest.fixture(scope="module")
def loadgen():
    spec = importlib.util.spec_from_file_location("loadgen", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loadgen_reports_and_plots(server, loadgen, tmp_path, capsys):
    out = tmp_path / "load"
    argv = ["--url", server.url, "--concurrency", "1", "4", "--requests", "6", "--max-output", "12", "-o", str(out)]
    assert loadgen.main(argv) == 0
    report = json.loads((out / "loadgen.json").read_text())
    assert report["model"] == "tiny" and [p["concurrency"] for p in report["points"]] == [1, 4]
    for point in report["points"]:
        assert (point["requests"], point["answered"], point["refused"], point["failed"]) == (6, 6, 0, 0)
        assert point["completion_tokens"] > 0 and point["tokens_per_s"] > 0
        assert 0 < point["ttft_p50_ms"] <= point["ttft_p99_ms"] and 0 < point["itl_p50_ms"] <= point["itl_p99_ms"]
    assert (out / "loadgen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "tok/s" in capsys.readouterr().out
    assert loadgen.main(argv) == 2 and "--force" in capsys.readouterr().err  # nothing overwritten without it


def test_soak_cancels_and_stops_and_leaks_no_slot(server, loadgen, tmp_path):
    out = tmp_path / "soak"
    argv = ["--url", server.url, "--concurrency", "4", "--requests", "12", "--prompt-lengths", "8", "40",
            "--output-lengths", "12", "--cancel-fraction", "0.5", "--stop-fraction", "0.5", "-o", str(out)]
    assert loadgen.main(argv) == 0
    point = json.loads((out / "loadgen.json").read_text())["points"][0]
    assert point["failed"] == 0 and point["answered"] + point["cancelled"] == 12 and point["cancelled"] > 0
    assert point["idle_metrics"]["drained"] and point["idle_metrics"]["kv_slots_in_use"] == 0


def test_the_mix_is_fixed_by_its_seed(loadgen):
    mix = loadgen.request_mix(3, 20, 512, None)
    assert mix == loadgen.request_mix(3, 20, 512, None) and mix != loadgen.request_mix(4, 20, 512, None)
    assert all(len(r["prompt"]) <= 256 and len(r["prompt"]) + r["max_tokens"] <= 512 for r in mix)
    soak = loadgen.request_mix(3, 200, 512, None, cancel_fraction=0.3, stop_fraction=0.5)
    cancelled = [r for r in soak if r["cancel_after"] is not None]
    assert 30 <= len(cancelled) <= 90 and all(1 <= r["cancel_after"] < max(2, r["max_tokens"]) for r in cancelled)
    assert 60 <= sum(bool(r["stop"]) for r in soak) <= 140


def test_named_mixes(loadgen):
    shared = loadgen.request_mix(5, 30, 8320, None, *loadgen.MIXES["shared-prefix"][:2],
                                 shared_prefix=loadgen.SHARED_PREFIX)
    assert all(len(r["prompt"]) == 1024 + 128 and r["max_tokens"] == 128 for r in shared)
    assert len({tuple(r["prompt"][:1024]) for r in shared}) == 1  # one system prompt ...
    assert len({tuple(r["prompt"][1024:]) for r in shared}) == 30  # ... and each request's own 128 ids
    assert shared == loadgen.request_mix(5, 30, 8320, None, (128,), (128,), shared_prefix=1024)
    assert shared[0]["prompt"][:1024] != loadgen.request_mix(6, 1, 8320, None, (128,), (128,),
                                                             shared_prefix=1024)[0]["prompt"][:1024]
    heavy = loadgen.request_mix(5, 60, 8320, None, *loadgen.MIXES["decode-heavy"][:2])
    assert {len(r["prompt"]) for r in heavy} == {128, 256, 512} and {r["max_tokens"] for r in heavy} == {512}
    today = loadgen.request_mix(5, 60, 8320, None, *loadgen.MIXES["today"][:2])
    assert {len(r["prompt"]) for r in today} == {128, 256, 512, 1024} and {r["max_tokens"] for r in today} == {128}
    paged = loadgen.request_mix(5, 4, 2048, None, (128,), (128,), shared_prefix=1024)  # the 2048-token engine
    assert all(len(r["prompt"]) == 1024 + 128 and r["max_tokens"] == 128 for r in paged)  # the prefix as asked
    assert loadgen.request_mix(5, 4, 1280, None, (128,), (128,), shared_prefix=1024) == paged  # just fits
    with pytest.raises(loadgen.FdppError, match="1024-token shared prefix .* need 1280 tokens a sequence, the "
                                                "server's max is 1279: serve an engine built with --max-seq 1280"):
        loadgen.request_mix(5, 4, 1279, None, (128,), (128,), shared_prefix=1024)  # never shrunk
    assert len(loadgen.request_mix(5, 4, 1156, 4, (128,), (128,), shared_prefix=1024)[0]["prompt"]) == 1152


def test_shared_prefix_mix_records_the_prefix_it_sent(loadgen, tmp_path, monkeypatch):
    """On the 2048-token paged engine the shared-prefix mix sends 1,024 + 128-token prompts and records 1024."""
    sent = []

    async def level(url, model, mix, concurrency, requests, *rest):
        sent.extend(mix[:requests])
        return {"concurrency": concurrency, "requests": requests, "tokens_per_s": 1.0, "ttft_p50_ms": 1.0,
                "ttft_p99_ms": 1.0, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0}

    monkeypatch.setattr(loadgen, "server_model", lambda url, model: ("m", 2048))
    monkeypatch.setattr(loadgen, "run_level", level)
    monkeypatch.setattr(loadgen, "print_table", lambda points: None)
    out = tmp_path / "prefix"
    assert loadgen.main(["--clients", "64", "--mix", "shared-prefix", "--requests", "8", "-o", str(out)]) == 0
    report = json.loads((out / "loadgen.json").read_text())
    assert (report["shared_prefix"], report["max_len"]) == (1024, 2048)
    assert len(sent) == 8 and {len(r["prompt"]) for r in sent} == {1024 + 128}
    assert len({tuple(r["prompt"][:1024]) for r in sent}) == 1


def test_loadgen_shared_prefix_mix_refuses_a_short_server(server, loadgen, tmp_path, capsys):
    """The test server's 512 tokens cannot hold the 1,024-token prefix: one line, nothing written or sent."""
    out = tmp_path / "shared"
    argv = ["--url", server.url, "--clients", "2", "--mix", "shared-prefix", "--requests", "4", "--max-output", "4",
            "-o", str(out)]
    assert loadgen.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need 1156 tokens a sequence, the server's max is 512" in err
    assert not (out / "loadgen.json").exists()


def test_loadgen_lengths_mix_digest_is_repeatable(server, loadgen, tmp_path):
    """Greedy: the same mix twice gives the same texts, the same digest; a server with KV slots has no blocks."""
    out = tmp_path / "lengths"
    argv = ["--url", server.url, "--clients", "2", "--requests", "4", "--prompt-lengths", "64",
            "--output-lengths", "4", "-o", str(out)]
    assert loadgen.main(argv) == 0
    report = json.loads((out / "loadgen.json").read_text())
    assert report["command"] == "python scripts/loadgen.py " + " ".join(argv) and report["shared_prefix"] == 0
    point = report["points"][0]
    assert point["answered"] == 4 and point["idle_metrics"]["kv_slots_in_use"] == 0
    assert point["idle_metrics"]["kv_blocks_used"] is None
    assert loadgen.main(argv[:-1] + [str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "loadgen.json").read_text())["points"][0]
    assert again["outputs_sha256"] == point["outputs_sha256"]
    assert sorted(point["output_digests"]) == ["0", "1", "2", "3"]
    assert again["output_digests"] == point["output_digests"]
    assert point["failure_reasons"] == {}


def test_failed_requests_say_why(loadgen):
    """A failed request's reason (HTTP status and the server's message, a stream error, or a broken connection)
    is counted per level and printed, so a lost request in a 1,000-request run can be explained."""
    results = [{"outcome": "failed", "reason": "stream error: the engine failed"},
               {"outcome": "failed", "reason": "stream error: the engine failed"},
               {"outcome": "refused", "reason": "HTTP 429: the queue is full"},
               {"outcome": "answered", "index": 3, "text": "hi", "tokens": 1, "ttft": 0.1, "itl": []}]
    point = loadgen.summarize(4, results, 1.0)
    assert point["failure_reasons"] == {"stream error: the engine failed": 2, "HTTP 429: the queue is full": 1}
    assert (point["failed"], point["refused"]) == (2, 1) and list(point["output_digests"]) == ["3"]
    assert loadgen.error_message(b'{"error": {"message": "too long"}}') == "too long"
    assert loadgen.error_message(b"<html>bad gateway") == "<html>bad gateway"


@pytest.mark.parametrize("argv, message", [
    (["--url", "http://192.0.2.1:8000"], "not a loopback address"),
    (["--clients", "257"], "from 1 to 256"),
    (["--concurrency", "0"], "from 1 to 256"),
    (["--mix", "today", "--prompt-lengths", "5"], "--mix today fixes the lengths"),
    (["--requests", "0"], "at least 1"),
    (["--clients", "16", "64", "--requests", "1", "2", "3"], "one count or one per --clients value (2)"),
    (["--sample-interval", "0"], "--sample-interval takes a positive number of seconds"),
])
def test_loadgen_refusals(loadgen, capsys, argv, message):
    assert loadgen.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_requests_per_level_and_busy_peaks(server, loadgen, tmp_path, capsys):
    """--requests per client count, and --sample-interval: the peaks of the server's gauges while a level ran."""
    out = tmp_path / "levels"
    argv = ["--url", server.url, "--clients", "1", "3", "--requests", "2", "5", "--max-output", "8",
            "--sample-interval", "0.02", "-o", str(out)]
    assert loadgen.main(argv) == 0
    report = json.loads((out / "loadgen.json").read_text())
    assert report["requests"] == [2, 5] and [p["requests"] for p in report["points"]] == [2, 5]
    for point, clients in zip(report["points"], (1, 3)):
        busy = point["busy_metrics"]
        assert busy["interval_s"] == 0.02 and busy["samples"] >= 1
        assert 1 <= busy["peak"]["kv_slots_in_use"] <= clients  # never more sequences than clients
    assert capsys.readouterr().out.count("peaks over") == 2


def test_the_report_is_written_after_every_level(loadgen, tmp_path, monkeypatch, capsys):
    """A run cut short (here the second level fails) keeps the levels it finished in loadgen.json."""
    async def level(url, model, mix, concurrency, requests, *rest):
        if concurrency == 8:
            raise loadgen.FdppError("the server went away")
        return {"concurrency": concurrency, "requests": requests, "tokens_per_s": 1.0, "ttft_p50_ms": 1.0,
                "ttft_p99_ms": 1.0, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0}

    monkeypatch.setattr(loadgen, "server_model", lambda url, model: ("m", 2048))
    monkeypatch.setattr(loadgen, "run_level", level)
    out = tmp_path / "cut"
    assert loadgen.main(["--clients", "2", "8", "--requests", "3", "-o", str(out)]) == 2
    assert "the server went away" in capsys.readouterr().err
    report = json.loads((out / "loadgen.json").read_text())
    assert [(p["concurrency"], p["requests"]) for p in report["points"]] == [(2, 3)]


def test_long_mixes(loadgen):
    """The capacity mix ends every request at 8,192 tokens; the soak spans 128-8K prompts; llama3's 1K-4K."""
    capacity = loadgen.request_mix(1, 20, 16448, None, *loadgen.MIXES["8k-sequences"][:2])
    assert {len(r["prompt"]) + r["max_tokens"] for r in capacity} == {8192}
    soak = loadgen.request_mix(1, 300, 16448, None, *loadgen.MIXES["soak"][:2], cancel_fraction=0.2)
    assert {len(r["prompt"]) for r in soak} == {128, 256, 512, 1024, 2048, 4096, 8192}
    assert all(len(r["prompt"]) + r["max_tokens"] <= 16448 for r in soak)
    long = loadgen.request_mix(1, 100, 8320, None, *loadgen.MIXES["long-prompts"][:2])
    assert {len(r["prompt"]) for r in long} == {1024, 2048, 3072, 4096}
    short = loadgen.request_mix(1, 20, 8320, None, *loadgen.MIXES["8k-sequences"][:2])  # half of 8320: capped
    assert {len(r["prompt"]) for r in short} == {4160}
