"""scripts/engine_job.sh's issue-39 stages on a machine where nothing was built: each one whose prerequisite is
missing fails at once, with a one-line reason in its log and FAILED in the summary; an unknown stage stops the job
before any stage runs."""

import os
import subprocess

import pytest

from fdpp_rewrite import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "engine_job.sh"


def engine_job(tmp_path, *stages, lib: bool = True, **variables):
    library = tmp_path / "libfdpp_plugins.so"
    library.write_bytes(b"")
    env = {**os.environ, "ENGINE_WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"),
           "FDPP_PLUGIN_LIB": str(library) if lib else "", **variables}
    return subprocess.run(["bash", str(SCRIPT), *stages], env=env, capture_output=True, text=True, timeout=120)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize("stage, lib, reason", [
    ("paged_peer", True, "no rewritten llama2-7b graph in"),
    ("capacity", True, "no rewritten llama2-7b graph in"),
    ("capacity_build", True, "no rewritten llama2-7b graph in"),
    ("soak_paged", True, "run the capacity stage first"),
    ("serve_paged", True, "run the paged_build stage first"),
    ("paged_build", False, "FDPP_PLUGIN_LIB (unset) is no file: build the library"),
    ("llama3", False, "FDPP_PLUGIN_LIB (unset) is no file: build the library"),
])
def test_a_stage_without_its_prerequisite_fails_in_one_line(tmp_path, stage, lib, reason):
    engine_job(tmp_path, stage, lib=lib)
    results = tmp_path / "work" / "results"
    log = (results / f"{stage}.log").read_text()
    assert log.count("\n") == 1 and reason in log
    assert f"{stage}: FAILED (rc 1)" in (results / "summary.txt").read_text()
    assert (tmp_path / "out" / "results.tgz").is_file()


def test_an_unknown_stage_runs_nothing(tmp_path):
    done = engine_job(tmp_path, "capacity", "capacty")
    assert done.returncode == 2 and "unknown stage capacty" in done.stdout
    assert not (tmp_path / "work" / "results" / "capacity.log").exists()


def test_a_stage_past_the_deadline_is_skipped(tmp_path):
    """JOB_DEADLINE_S cuts each stage's limit to what is left; with under 30 s left a stage does not start."""
    done = engine_job(tmp_path, "soak_paged", JOB_DEADLINE_S="20")
    summary = (tmp_path / "work" / "results" / "summary.txt").read_text()
    assert done.returncode == 0 and "soak_paged: SKIPPED (" in summary
    assert not (tmp_path / "work" / "results" / "soak_paged.log").exists()
