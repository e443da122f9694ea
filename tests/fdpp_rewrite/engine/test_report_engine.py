"""scripts/report_engine.py: merging `bench --out` and bench_hf.py JSONs into one result file (CPU)."""

import json
import subprocess
import sys

from fdpp_rewrite import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "report_engine.py"


def point(batch, context, tokens_per_s, first_token_ms, **system):
    return {"batch": batch, "context": context, "tokens_per_s": tokens_per_s, "first_token_ms": first_token_ms,
            **system}


def test_merges_inputs_first_file_wins_and_creates_the_output_folder(tmp_path):
    bench = {"command": "fdpp bench", "gpu": "H200",
             "points": [point(1, 128, 200.0, 5.0, kernels="fdpp"), point(1, 128, 100.0, 10.0, kernels="torch")]}
    hf_new = {"commands": ["bench_hf new"], "points": [point(1, 128, 50.0, 20.0, system="hf-compile")]}
    hf_old = {"commands": ["bench_hf old"], "points": [point(1, 128, 25.0, 40.0, system="hf-compile"),
                                                       point(1, 128, 10.0, 50.0, system="hf-eager")]}
    inputs = []
    for name, report in (("bench", bench), ("hf_new", hf_new), ("hf_old", hf_old)):
        inputs.append(tmp_path / f"{name}.json")
        inputs[-1].write_text(json.dumps(report))
    out = tmp_path / "new" / "folder" / "engine.json"
    result = subprocess.run([sys.executable, str(SCRIPT), *map(str, inputs), "-o", str(out), "--note", "a note"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert report["commands"] == ["fdpp bench", "bench_hf new", "bench_hf old"] and report["notes"] == ["a note"]
    (row,) = report["ratios"]
    assert row["speedup_vs_torch"] == 2.0
    assert row["speedup_vs_hf-compile"] == 4.0  # the first input's hf-compile point, not the older one
    assert row["speedup_vs_hf-eager"] == 20.0 and row["first_token_ratio_hf-eager"] == 0.1


def test_a_missing_input_is_a_one_line_error(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent.json"), "-o",
                             str(tmp_path / "out.json")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "absent.json" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out.json").exists()
