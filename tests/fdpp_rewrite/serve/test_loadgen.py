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


def test_the_mix_is_fixed_by_its_seed(loadgen):
    mix = loadgen.request_mix(3, 20, 512, None)
    assert mix == loadgen.request_mix(3, 20, 512, None) and mix != loadgen.request_mix(4, 20, 512, None)
    assert all(len(prompt) <= 256 and len(prompt) + tokens <= 512 for prompt, tokens in mix)


@pytest.mark.parametrize("argv, message", [
    (["--url", "http://192.0.2.1:8000"], "not a loopback address"),
    (["--concurrency", "65"], "from 1 to 64"),
    (["--requests", "0"], "at least 1"),
])
def test_loadgen_refusals(loadgen, capsys, argv, message):
    assert loadgen.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
