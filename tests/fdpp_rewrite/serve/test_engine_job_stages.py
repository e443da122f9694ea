"""scripts/engine_job.sh's issue-39 stages on a machine where nothing was built: each one whose prerequisite is
missing fails at once, with a one-line reason in its log and FAILED in the summary; an unknown stage stops the job
before any stage runs."""

import os
import re
import subprocess
import tarfile

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
    ("hf_llama", False, "FDPP_PLUGIN_LIB (unset) is no file: build the library"),
    ("hf_llama", True, "run the grid stage first"),
])
def test_a_stage_without_its_prerequisite_fails_in_one_line(tmp_path, stage, lib, reason):
    engine_job(tmp_path, stage, lib=lib)
    results = tmp_path / "work" / "results"
    log = (results / f"{stage}.log").read_text()
    assert log.count("\n") == 1 and reason in log
    assert f"{stage}: FAILED (rc 1)" in (results / "summary.txt").read_text()
    assert (tmp_path / "out" / f"engine_results-{stage}.tgz").is_file()


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


def test_hf_llama_needs_the_rewritten_graph(tmp_path):
    """hf_llama builds and benches only: without hf_llama_graph's graph it fails at once, naming that stage."""
    (tmp_path / "work" / "llama2-grid" / "engine").mkdir(parents=True)
    (tmp_path / "work" / "llama2-grid" / "engine" / "manifest.json").write_text("{}")
    engine_job(tmp_path, "hf_llama")
    log = (tmp_path / "work" / "results" / "hf_llama.log").read_text()
    assert log.count("\n") == 1 and "run the hf_llama_graph stage" in log


def test_hf_llama_graph_resumes_from_its_rewritten_graph(tmp_path):
    """A rerun of hf_llama_graph once its rewritten graph is there does nothing (no export, no disk check)."""
    folder = tmp_path / "work" / "hf_llama"
    folder.mkdir(parents=True)
    (folder / "hf.fdpp.onnx").write_bytes(b"")
    (folder / "hf.fdpp.onnx.data").write_bytes(b"")
    engine_job(tmp_path, "hf_llama_graph", lib=False)
    results = tmp_path / "work" / "results"
    assert "has the rewritten graph" in (results / "hf_llama_graph.log").read_text()
    assert "hf_llama_graph: ok" in (results / "summary.txt").read_text()


def test_archives_are_per_job_and_whole(tmp_path):
    """Each job packs into its own archive (the stages in its name, or ENGINE_ARCHIVE), no temporary file left."""
    engine_job(tmp_path, "soak_paged", "capacity")
    engine_job(tmp_path, "serve_paged", ENGINE_ARCHIVE="mine.tgz")
    names = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert names == ["engine_results-soak_paged-capacity.tgz", "mine.tgz"]
    with tarfile.open(tmp_path / "out" / "mine.tgz") as archive:
        assert "results/serve_paged.log" in archive.getnames()


def test_the_deadline_counts_from_the_start_with_a_margin(tmp_path):
    """JOB_DEADLINE_S less JOB_MARGIN_S (default 30): 55 s leaves under 30 for a stage, 60 s with no margin does not."""
    engine_job(tmp_path, "soak_paged", JOB_DEADLINE_S="55")
    assert "soak_paged: SKIPPED (" in (tmp_path / "work" / "results" / "summary.txt").read_text()
    engine_job(tmp_path, "soak_paged", JOB_DEADLINE_S="60", JOB_MARGIN_S="0")
    assert "soak_paged: FAILED (rc 1)" in (tmp_path / "work" / "results" / "summary.txt").read_text()


def shell_functions(*names: str) -> str:
    """The named functions' definitions, cut from the script (it runs its stages when sourced)."""
    script = SCRIPT.read_text()
    return "\n".join(re.search(rf"^{name}\(\) {{.*?^}}$|^{name}\(\) {{.*?}}$", script, re.M | re.S).group(0)
                     for name in names)


@pytest.mark.parametrize("apps, expected", [
    ("123, 5000\n", "5000 process"),
    ("123, [N/A]\n", "70000 device"),  # a reading that is no number: the device's
    ("999, 5000\n", "70000 device"),  # the pid is not listed (another namespace)
])
def test_process_memory_reads_numbers_only(tmp_path, apps, expected):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
case "$*" in *query-compute-apps*) printf '{apps}' ;; *) echo 70000 ;; esac
""")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", shell_functions("gpu_mib", "process_mib") + "\nprocess_mib 123"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == expected, done.stderr
