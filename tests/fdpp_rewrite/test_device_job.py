"""scripts/device_job.sh on a machine without a GPU, past its deadline: JOB_DEADLINE_S (less JOB_MARGIN_S) leaves
no stage 30 s, so none runs (nor the library's build); the summary says SKIPPED and the results are packed into
device_results.tgz, whole (no temporary file left)."""

import os
import subprocess
import tarfile

from fdpp_rewrite import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "device_job.sh"


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_stages_past_the_deadline_are_skipped_and_packed(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "JOB_DEADLINE_S": "55"}  # 55 - 30 s of margin: under 30 s left
    done = subprocess.run(["bash", str(SCRIPT), "wgmma_probe", "gemm_bench"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no time left for the library's build" in done.stdout
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(" (")[0] for line in summary] == ["wgmma_probe: SKIPPED", "gemm_bench: SKIPPED"]
    assert sorted(path.name for path in out.iterdir()) == ["device_results.tgz", "summary.txt"]
    with tarfile.open(out / "device_results.tgz") as archive:
        assert "results/summary.txt" in archive.getnames()
