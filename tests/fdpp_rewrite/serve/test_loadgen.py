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
    small = loadgen.request_mix(5, 4, 512, None, (128,), (128,), shared_prefix=1024)  # a 512-token model
    assert all(len(r["prompt"]) == 256 and len(r["prompt"]) + r["max_tokens"] <= 512 for r in small)


def test_loadgen_shared_prefix_mix_records_it(server, loadgen, tmp_path):
    out = tmp_path / "shared"
    argv = ["--url", server.url, "--clients", "2", "--mix", "shared-prefix", "--requests", "4", "--max-output", "4",
            "-o", str(out)]
    assert loadgen.main(argv) == 0
    report = json.loads((out / "loadgen.json").read_text())
    assert (report["mix"], report["shared_prefix"], report["prompt_lengths"]) == ("shared-prefix", 1024, [128])
    assert report["command"] == "python scripts/loadgen.py " + " ".join(argv)
    point = report["points"][0]
    assert point["answered"] == 4 and point["idle_metrics"]["kv_slots_in_use"] == 0
    assert point["idle_metrics"]["kv_blocks_used"] is None  # a server with KV slots has no blocks
    assert loadgen.main(argv[:-1] + [str(tmp_path / "again")]) == 0  # greedy: the same texts, the same digest
    again = json.loads((tmp_path / "again" / "loadgen.json").read_text())["points"][0]
    assert again["outputs_sha256"] == point["outputs_sha256"]


@pytest.mark.parametrize("argv, message", [
    (["--url", "http://192.0.2.1:8000"], "not a loopback address"),
    (["--clients", "257"], "from 1 to 256"),
    (["--concurrency", "0"], "from 1 to 256"),
    (["--mix", "today", "--prompt-lengths", "5"], "--mix today fixes the lengths"),
    (["--requests", "0"], "at least 1"),
])
def test_loadgen_refusals(loadgen, capsys, argv, message):
    assert loadgen.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_report_serve_computes_the_bars(loadgen, tmp_path, capsys):
    """scripts/report_serve.py on synthetic levels: the one-client prediction comes from bench's bs1 figures for
    the very requests the level sent."""
    spec = importlib.util.spec_from_file_location("report_serve", SCRIPT.parent / "report_serve.py")
    report_serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_serve)
    idle = {"drained": True, "kv_slots_in_use": 0.0}
    levels = ((1, 190.0, 4.0), (16, 2500.0, 9.0), (64, 2400.0, 12.0), (65, 2000.0, 10.0), (17, 2300.0, 11.0))
    for concurrency, tps, itl in levels:  # 65: the soak at 64; 17: a sustained run at 16
        folder = tmp_path / f"c{concurrency}"
        folder.mkdir()
        point = {"concurrency": {65: 64, 17: 16}.get(concurrency, concurrency), "tokens_per_s": tps,
                 "itl_p99_ms": itl, "requests": 10,
                 "answered": 8, "cancelled": 2, "refused": 0, "failed": 0, "idle_metrics": idle,
                 "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0, "itl_p50_ms": 1.0}
        (folder / "loadgen.json").write_text(json.dumps({
            "seed": 0, "requests": 4, "max_output": None, "prompt_lengths": [128, 256], "output_lengths": [100],
            "command": "loadgen", "points": [point]}))
    bench = tmp_path / "bench.json"
    def bench_point(batch, context, first_ms, step_ms, tps):
        return {"kernels": "fdpp", "batch": batch, "context": context, "first_token_ms": first_ms,
                "ms_per_step": step_ms, "tokens_per_s": tps}
    points = [bench_point(1, 128, 10.0, 4.0, 250.0), bench_point(1, 256, 10.0, 4.0, 250.0),
              bench_point(16, 256, 90.0, 5.0, 3000.0)]
    bench.write_text(json.dumps({"points": points}))
    out = tmp_path / "serve.json"
    argv = ["--levels", *(str(tmp_path / f"c{c}") for c in (1, 16, 64)), "--soak", str(tmp_path / "c65"),
            "--bench-bs1", str(bench), "--bench-bs16", str(bench), "--memory-mib", "1000", "1010", "-o", str(out)]
    assert report_serve.main(argv) == 0
    bars = json.loads(out.read_text())["bars"]
    predicted = 100 / (0.010 + 99 * 0.004)  # every request: 100 tokens, a 10 ms first token, 99 steps of 4 ms
    assert abs(bars["one_client_tokens_per_s"]["bench_bs1_predicted"] - predicted) < 1e-6
    assert not bars["one_client_tokens_per_s"]["met"]  # 190 < 0.95 x 246
    assert bars["sixteen_clients_tokens_per_s"]["met"] and bars["sixteen_clients_itl_p99_ms"]["met"]  # 2500 >= 2400
    assert bars["soak"]["met"] and abs(bars["soak"]["gpu_memory_growth_pct"] - 1.0) < 1e-9
    assert (out.with_suffix(".png")).read_bytes()[:4] == b"\x89PNG"
    assert report_serve.main(argv[:-2] + ["-o", str(tmp_path / "x.json"), "--bench-bs16", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # --sustained: the 16-client bars come from the longer run, the short one is kept beside them
    assert report_serve.main(argv + ["--sustained", str(tmp_path / "c17")]) == 0
    sixteen = json.loads(out.read_text())["bars"]["sixteen_clients_tokens_per_s"]
    assert (sixteen["server"], sixteen["short_run_server"], sixteen["met"]) == (2300.0, 2500.0, False)
    assert report_serve.main(argv + ["--sustained", str(tmp_path / "c64")]) == 2  # not a 16-client run


def test_report_serve_scale_computes_the_paged_bars(tmp_path, capsys):
    """scripts/report_serve.py scale on synthetic loadgen runs: each paged bar from the runs given, and the plot."""
    spec = importlib.util.spec_from_file_location("report_serve", SCRIPT.parent / "report_serve.py")
    report_serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report_serve)

    def run(name, prompts, outputs, levels):
        folder = tmp_path / name
        folder.mkdir()
        points = [{"concurrency": c, "tokens_per_s": tps, "ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft,
                   "itl_p99_ms": itl, "requests": 64, "answered": 64, "outputs_sha256": digest}
                  for c, tps, ttft, itl, digest in levels]
        (folder / "loadgen.json").write_text(json.dumps({"command": f"loadgen {name}", "prompt_lengths": prompts,
                                                         "output_lengths": outputs, "points": points}))
        return str(folder)

    today = run("today", [128, 1024], [128], [(16, 2500.0, 80.0, 9.0, "a"), (64, 4100.0, 90.0, 12.0, "a"),
                                              (256, 4900.0, 200.0, 20.0, "a")])
    heavy = run("heavy", [128, 512], [512], [(16, 2400.0, 50.0, 7.0, "a"), (256, 6500.0, 300.0, 30.0, "a")])
    on = run("on", [128], [128], [(64, 5000.0, 20.0, 10.0, "x")])
    off = run("off", [128], [128], [(64, 4900.0, 100.0, 10.0, "x")])
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"points": [
        {"kernels": "fdpp", "batch": 256, "context": c, "tokens_per_s": tps, "ms_per_step": ms}
        for c, tps, ms in ((256, 12000.0, 10.0), (512, 8000.0, 16.0), (1024, 6000.0, 20.0))]}))
    out = tmp_path / "scale.json"
    argv = ["scale", "--today", today, "--decode-heavy", heavy, "--prefix-on", on, "--prefix-off", off,
            "--bench", str(bench), "-o", str(out)]
    assert report_serve.main(argv) == 0
    bars = json.loads(out.read_text())["bars"]
    assert bars["today_16_clients_tokens_per_s"]["met"] and bars["today_64_vs_16_clients"]["met"]  # 4100 >= 4000
    assert not bars["today_256_vs_16_clients"]["met"]  # 4900 < 2 x 2500
    assert bars["today_ttft_ms"]["256"] == {"p50": 200.0, "p99": 400.0}
    assert bars["decode_heavy_256_vs_16_clients"]["met"]  # 6500 >= 2.5 x 2400
    assert bars["decode_heavy_256_vs_bench"]["bench_context"] == 512  # mean prompt 320 + 512 / 2 = 576
    assert bars["decode_heavy_256_vs_bench"]["met"] and bars["decode_heavy_256_itl_p99_ms"]["met"]  # 30 <= 40
    assert bars["prefix_cache_ttft_p50"]["met"] and bars["prefix_cache_ttft_p50"]["ratio"] == 5.0
    assert bars["prefix_cache_tokens_per_s"]["met"] and bars["prefix_cache_identical_outputs"]["met"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert report_serve.main(["scale", "--today", heavy, "-o", str(out)]) == 2  # no 64-client level
    assert "no 64-client level" in capsys.readouterr().err
