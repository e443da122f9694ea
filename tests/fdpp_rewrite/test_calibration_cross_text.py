"""scripts/calibration_cross_text.py on the CPU with a tiny token budget: the per-layer cross-text fallback table,
its JSON, and a FAIL where one text's phi cannot hold the other's rows (tiny-opt-wide's layer 1)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("rdata")  # reads the Austen default

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "calibration_cross_text.py"
BUDGET = ["--device", "cpu", "--calibration-tokens", "256", "--heldout-tokens", "128", "--chunk", "128"]


def _script():
    spec = importlib.util.spec_from_file_location("calibration_cross_text", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path(_script().AUSTEN).is_dir(), reason="needs Debian's r-cran-janeaustenr")
def test_cross_text_table_on_kjv_and_austen(tmp_path, capsys):
    assert _script().main(["--model", "tiny-smollm2", *BUDGET, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cross_text.json").read_text())
    assert report["passed"] and len(report["layers"]) == 3
    assert report["texts"]["A"]["name"].startswith("KJV") and "janeaustenr" in report["texts"]["B"]["name"]
    assert report["tokens"]["A calibration"] == 256 and report["tokens"]["B held-out"] == 128
    for row in report["layers"]:
        assert row["B_heldout_fallback_rate_at_phi_A"] < report["bar"]
        assert row["A_heldout_fallback_rate_at_phi_B"] < report["bar"]
    assert "PASS" in capsys.readouterr().out


@pytest.mark.skipif(not Path(_script().AUSTEN).is_dir(), reason="needs Debian's r-cran-janeaustenr")
def test_a_layer_no_phi_holds_is_reported_over_the_bar(tmp_path, capsys):
    assert _script().main(["--model", "tiny-opt-wide", *BUDGET, "--out", str(tmp_path)]) == 1
    layers = json.loads((tmp_path / "cross_text.json").read_text())["layers"]
    assert [row["B_heldout_under_bar"] for row in layers] == [True, False]
    assert "OVER" in capsys.readouterr().out
