"""The README's main-job command, run as a user would (on a scratch work folder)."""

import re
import subprocess
import sys
from pathlib import Path

from fdpp_rewrite import REPO_ROOT


def readme_commands():
    text = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"^\s*\$ (.+)$", text, flags=re.MULTILINE)


def test_readme_names_exactly_two_fresh_machine_commands():
    assert readme_commands() == ["make demo", "make test"]


def test_main_job_prints_verdict_and_text(tmp_path: Path):
    # `make demo` = setup + `python -m fdpp_rewrite demo`; setup is what this test suite already ran.
    result = subprocess.run([sys.executable, "-m", "fdpp_rewrite", "demo", "--workdir", str(tmp_path),
                             "--max-new-tokens", "12"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "compare verdict for smollm2-135m: PASS" in result.stdout
    answer = re.search(r"^answer: (.+)$", result.stdout, flags=re.MULTILINE)
    assert answer and len(answer.group(1).split()) >= 3, result.stdout[-2000:]
