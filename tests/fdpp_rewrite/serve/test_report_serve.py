"""scripts/report_serve.py on synthetic result files: the slot server's bars, and issue 39's bars of the paged
server (`scale`), each verdict from figures on both sides of its threshold."""

import json
import re
from pathlib import Path

import pytest
from script_module import load_script

from fdpp_rewrite import REPO_ROOT


@pytest.fixture(scope="module")
def report_serve():
    return load_script("report_serve")


def test_report_serve_computes_the_bars(report_serve, tmp_path, capsys):
    """scripts/report_serve.py on synthetic levels: the one-client prediction comes from bench's bs1 figures for
    the very requests the level sent."""
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


def test_report_serve_scale_computes_the_paged_bars(report_serve, tmp_path, capsys):
    """scripts/report_serve.py scale on synthetic loadgen runs: each paged bar from the runs given, and the plot."""

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
        {"kernels": "fdpp", "batch": 256, "context": c, "new_tokens": 64, "tokens_per_s": tps, "ms_per_step": ms}
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
    # the mix's mean context: prompt 320 + 512 / 2 = 576; bench's: context + 64 / 2, nearest at context 512 (544)
    assert bars["decode_heavy_256_vs_bench"]["bench_context"] == 512
    assert bars["decode_heavy_256_vs_bench"]["met"] and bars["decode_heavy_256_itl_p99_ms"]["met"]  # 30 <= 40
    assert bars["prefix_cache_ttft_p50"]["met"] and bars["prefix_cache_ttft_p50"]["ratio"] == 5.0
    assert bars["prefix_cache_tokens_per_s"]["met"] and bars["prefix_cache_identical_outputs"]["met"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert report_serve.main(["scale", "--today", heavy, "-o", str(out)]) == 2  # no 64-client level
    assert "no 64-client level" in capsys.readouterr().err


def loadgen_run(folder: Path, mix: str, prompts, outputs, levels, **report) -> None:
    """A loadgen.json of `levels`: (clients, tokens/s, ttft p50 ms, itl p99 ms, extra point fields)."""
    folder.mkdir(parents=True)
    points = [{"concurrency": c, "tokens_per_s": tps, "ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft, "itl_p99_ms": itl,
               "requests": 64, "answered": 64, "cancelled": 0, "refused": 0, "failed": 0, "outputs_sha256": "ab" * 32,
               "idle_metrics": {"drained": True, "kv_slots_in_use": 0.0, "kv_blocks_used": 0.0}, **extra}
              for c, tps, ttft, itl, extra in levels]
    (folder / "loadgen.json").write_text(json.dumps({"command": f"loadgen {mix}", "mix": mix, "shared_prefix": 0,
                                                     "prompt_lengths": prompts, "output_lengths": outputs,
                                                     "cancel_fraction": 0.2, "points": points, **report}))


def bench_file(path: Path, points, read=4.1e12) -> None:
    """bench JSON: (kernels, batch, context, new tokens, tokens/s, ms a step, first token ms, roofline %)."""
    path.write_text(json.dumps({"stream_read_bytes_per_s": read, "points": [
        {"kernels": k, "batch": b, "context": c, "new_tokens": n, "tokens_per_s": tps, "ms_per_step": ms,
         "first_token_ms": first, "roofline_pct": pct, "roofline_ms": ms * pct / 100}
        for k, b, c, n, tps, ms, first, pct in points]}))


def results_folder(root: Path, *, torch_b256=8000.0, roofline_b64=81.0, admitted=27, memory_mib=(100000, 100400),
                   soak_failed=0) -> Path:
    """Every file scripts/engine_job.sh's issue-39 stages leave, with figures that meet every bar unless told."""
    from fdpp_rewrite.engine.paged_memory import pool_line, reserve_bytes

    out = root / "results"
    out.mkdir()
    bench_file(out / "paged_peer.json", [
        ("fdpp", 16, 128, 64, 3000.0, 5.3, 43.0, 60.0), ("torch", 16, 128, 64, 1350.0, 11.8, 49.0, 29.0),
        ("fdpp", 64, 512, 64, 6900.0, 9.3, 800.0, roofline_b64), ("torch", 64, 512, 64, 5000.0, 12.8, 880.0, 60.0),
        ("fdpp", 128, 512, 64, 9000.0, 14.2, 1600.0, 84.0), ("torch", 128, 512, 64, 6000.0, 21.3, 1700.0, 55.0),
        ("fdpp", 256, 512, 64, 9600.0, 26.7, 3200.0, 82.0), ("torch", 256, 512, 64, torch_b256, 32.0, 3500.0, 60.0)])
    (out / "paged_attention.json").write_text(json.dumps({"rows": [
        {"batch": b, "heads": 32, "kv_heads": 32, "context": 512, "contiguous_us": 10.0, "paged_us": 10.0 / r,
         "speed_ratio": r} for b, r in ((1, 0.98), (256, 0.99))]}))
    loadgen_run(out / "serve_today", "today", [128, 256, 512, 1024], [128],
                [(16, 2500.0, 80.0, 9.0, {}), (64, 4100.0, 90.0, 12.0, {}), (256, 5100.0, 200.0, 20.0, {})])
    loadgen_run(out / "serve_decode_heavy", "decode-heavy", [128, 256, 512], [512],
                [(16, 2400.0, 50.0, 7.0, {}), (256, 7300.0, 300.0, 60.0, {})])
    bench_file(out / "serve_bench_decode_heavy.json", [("fdpp", 256, 299, 512, 9000.0, 28.4, 3000.0, 80.0)])
    loadgen_run(out / "serve_prefix_on", "shared-prefix", [128], [128], [(64, 5000.0, 20.0, 10.0, {})])
    loadgen_run(out / "serve_prefix_off", "shared-prefix", [128], [128], [(64, 4900.0, 100.0, 10.0, {})])
    loadgen_run(out / "serve_capacity", "8k-sequences", [8128], [64],
                [(48, 900.0, 9000.0, 40.0, {"busy_metrics": {"samples": 80, "peak": {"kv_slots_in_use": admitted}}})])
    (out / "server_capacity.log").write_text("loading\n" + pool_line(3484, 524288, (125 * 2**30, 2**30,
                                                                                   reserve_bytes(2**30))) + "\nready\n")
    loadgen_run(out / "serve_soak", "soak", [128, 8192], [16, 256],
                [(128, 3000.0, 900.0, 50.0, {"requests": 2000, "answered": 1600 - soak_failed,
                                             "cancelled": 400, "failed": soak_failed})])
    (out / "soak_gpu_memory.tsv").write_text("".join(f"{1000 + 2 * i} {m} process\n" for i, m in enumerate(
        [memory_mib[0], (memory_mib[0] + memory_mib[1]) / 2, memory_mib[1]])))
    bench_file(out / "llama3_bench.json", [("fdpp", 256, 1024, 64, 11000.0, 23.3, 5000.0, 78.0)])
    loadgen_run(out / "serve_llama3", "long-prompts", [1024, 4096], [128], [(256, 4000.0, 3000.0, 40.0, {})])
    return out


def scale(report_serve, results: Path, out: Path) -> dict:
    assert report_serve.main(["scale", "--results", str(results), "-o", str(out)]) == 0
    return json.loads(out.read_text())["bars"]


def test_scale_results_computes_every_bar(report_serve, tmp_path, capsys):
    """From a results folder: every bar of issue 39, each met here; the table has one row a bar."""
    bars = scale(report_serve, results_folder(tmp_path), tmp_path / "bars.json")
    assert all(bar["met"] is True for bar in bars.values()), {k: b for k, b in bars.items() if b["met"] is not True}
    assert {"bench_roofline_b256", "bench_vs_torch_b64", "first_token_ms", "paged_attention_vs_contiguous",
            "decode_heavy_256_vs_bench", "decode_heavy_256_itl_p99_ms", "today_256_vs_16_clients",
            "prefix_cache_identical_outputs", "capacity_8k_sequences", "soak_failed", "soak_idle_blocks",
            "soak_gpu_memory", "llama3_beside_llama2"} <= set(bars)
    assert bars["decode_heavy_256_vs_bench"]["bench_context"] == 299  # 299 + 512 / 2 = 555: the mix's 298.7 + 256
    assert bars["decode_heavy_256_vs_bench"]["ratio"] == pytest.approx(7300 / 9000)
    assert bars["decode_heavy_256_itl_p99_ms"]["ratio"] == pytest.approx(60 / 28.4)
    assert bars["bench_vs_torch_b256"]["ratio"] == pytest.approx(9600 / 8000)
    capacity = bars["capacity_8k_sequences"]
    assert capacity["value"] == 27 and capacity["base"] == pytest.approx(3484 * 64 / 8192)
    assert capacity["given_sequences"] == pytest.approx(0.9 * 125 / 4)  # 0.9 x free after the weights / 4 GiB
    assert bars["soak_gpu_memory"]["value"] == pytest.approx(0.4) and bars["soak_gpu_memory"]["of"] == ["process"]
    table = (tmp_path / "bars.md").read_text()
    assert table == capsys.readouterr().out.split("wrote")[0]
    rows = table.splitlines()[2:]
    assert len(rows) == len(bars) and all(row.endswith("| met |") for row in rows)
    assert "llama2-7b: bench b256 ctx 512: 9,600.0 tok/s, 82.0%" in table  # llama3 beside llama2's figures
    assert (tmp_path / "bars.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("change, bar, field, value", [
    ({"torch_b256": 8500.0}, "bench_vs_torch_b256", "ratio", 9600 / 8500),  # 1.13x < 1.15x
    ({"roofline_b64": 79.9}, "bench_roofline_b64", "value", 79.9),
    ({"admitted": 25}, "capacity_8k_sequences", "ratio", 25 / (3484 * 64 / 8192)),  # 0.92: more than 5% short
    ({"memory_mib": (100000, 101500)}, "soak_gpu_memory", "value", 1.5),
    ({"soak_failed": 1}, "soak_failed", "value", 1),
])
def test_scale_results_a_bar_just_past_its_threshold_is_not_met(report_serve, tmp_path, change, bar, field, value):
    bars = scale(report_serve, results_folder(tmp_path, **change), tmp_path / "bars.json")
    assert bars[bar]["met"] is False and bars[bar][field] == pytest.approx(value)
    assert sum(b["met"] is False for b in bars.values()) == 1
    assert f"| {bars[bar]['title']} |" in (tmp_path / "bars.md").read_text()


def test_scale_results_says_what_was_not_measured(report_serve, tmp_path):
    """Missing results are rows 'not measured' naming the stage to run, and so is an unreadable one (a capacity
    server that died before its pool line); a bench far from the decode-heavy mix's mean context is not used."""
    out = results_folder(tmp_path, admitted=48)
    for name in ("serve_soak", "serve_llama3"):  # llama3's bench is there, its serving is not
        for file in (out / name).iterdir():
            file.unlink()
        (out / name).rmdir()
    bench_file(out / "serve_bench_decode_heavy.json", [("fdpp", 256, 1024, 64, 9000.0, 28.4, 3000.0, 80.0)])
    (out / "server_capacity.log").write_text("Traceback: the server died before its pool was sized\n")
    bars = scale(report_serve, out, tmp_path / "bars.json")
    assert bars["soak"] == {"title": bars["soak"]["title"], "met": None,
                            "note": "no results: run scripts/engine_job.sh soak_paged"}
    llama3 = bars["llama3_beside_llama2"]
    assert llama3["met"] is None and llama3["note"] == ("no llama3 serving (serve_llama3): run "
                                                        "scripts/engine_job.sh llama3")
    assert bars["capacity"]["met"] is None and "has no 'KV pool: ...' line" in bars["capacity"]["note"]
    assert bars["capacity"]["note"].endswith("(scripts/engine_job.sh capacity)")
    assert bars["today_16_clients_tokens_per_s"]["met"]  # the other rows are computed all the same
    heavy = bars["decode_heavy_256_vs_bench"]  # bench's 1024 + 64 / 2 is 90% over the mix's mean context 555
    assert heavy["met"] is None and "--batch 256 --context 523 --new-tokens 64" in heavy["note"]  # fits the pool
    table = (tmp_path / "bars.md").read_text()
    assert table.count("not measured") == sum(b["met"] is None for b in bars.values())


def test_engine_job_writes_what_report_serve_reads(report_serve):
    """scripts/engine_job.sh writes every file of SCALE_RESULTS under its name (loadgen folders as serve_<name>,
    server logs as server_<name>.log)."""
    script = (REPO_ROOT / "scripts" / "engine_job.sh").read_text()
    for key, name in report_serve.SCALE_RESULTS.items():
        written = (name in script or (name.startswith("serve_") and f"paged_loadgen {name[6:]} " in script)
                   or re.search(rf'server_start "\$\w+" {name[7:-4]} ', script) is not None)
        assert written, f"engine_job.sh writes no {name} ({key})"


def test_scale_refusals(report_serve, tmp_path, capsys):
    assert report_serve.main(["scale", "--results", str(tmp_path / "none"), "-o", str(tmp_path / "x.json")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    log = tmp_path / "server.log"
    log.write_text("a contiguous server\n")
    assert report_serve.main(["scale", "--capacity-log", str(log), "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no 'KV pool: ...' line" in err


def test_scale_capacity_saturated_measures_nothing(report_serve, tmp_path):
    """An 8K capacity run whose every client was admitted at once says nothing of the pool's limit."""
    bars = scale(report_serve, results_folder(tmp_path, admitted=48), tmp_path / "bars.json")
    capacity = bars["capacity_8k_sequences"]
    assert capacity["met"] is None and "raise --clients" in capacity["note"]


def test_scale_attention_leaves_out_untimed_points(report_serve, tmp_path):
    """bench_paged_attention.py's points that did not fit (a skip note, no speed_ratio) are left out of the worst
    point and counted; with none timed the bar is not measured, with the reason, and every other bar still is."""
    out = results_folder(tmp_path)
    path = out / "paged_attention.json"
    rows = json.loads(path.read_text())["rows"]
    skipped = {"batch": 256, "heads": 32, "kv_heads": 32, "context": 32768,
               "note": "skipped: 2 x 16.0 GiB of K/V does not fit in 10.0 GiB free"}
    path.write_text(json.dumps({"rows": [*rows, skipped]}))
    bar = scale(report_serve, out, tmp_path / "bars.json")["paged_attention_vs_contiguous"]
    assert bar["met"] is True and bar["points"] == 2 and bar["points_untimed"] == 1
    assert bar["value"] == pytest.approx(0.98) and "1 not timed (skipped)" in bar["ours"]
    path.write_text(json.dumps({"rows": [skipped]}))
    bars = scale(report_serve, out, tmp_path / "bars2.json")
    bar = bars["paged_attention_vs_contiguous"]
    assert bar["met"] is None and "paged_attention.json has no timed point (1 rows untimed: skipped: 2 x" in bar["note"]
    assert bars["bench_roofline_b256"]["met"] is True
    assert bar["title"] in (tmp_path / "bars2.md").read_text()
