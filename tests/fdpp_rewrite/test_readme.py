"""The README and docs/ as a user meets them: the two fresh-machine commands (real make targets), no run logs under
docs/, links that resolve, and the README's main-job command run as a user would (on a scratch work folder)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_text():
    return (REPO / "README.md").read_text()


def readme_commands():
    return re.findall(r"^\s*\$ (.+)$", readme_text(), flags=re.MULTILINE)


def test_readme_names_exactly_two_fresh_machine_commands():
    assert readme_commands() == ["make demo", "make test"]


def test_readme_commands_are_make_targets_that_resolve():
    """What the README tells a user to type exists: make finds each target and every prerequisite (a dry run)."""
    for command in readme_commands():
        result = subprocess.run([*command.split(), "-n"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"`{command}` does not resolve: {result.stderr.strip()}"
        assert "fdpp_rewrite" in result.stdout or "pytest" in result.stdout, (command, result.stdout[-500:])


def is_run_log(path: Path) -> bool:
    # A file of one run: a .log, or a name that starts with "run" and a number (run77-attention/, run136.json).
    # e.g. docs/results/run77-attention/bench.log and docs/run12.json are logs; docs/benchmarks/gemm-h200.json is not.
    return any(part.endswith(".log") or re.match(r"run\d", part) for part in path.parts)


def test_run_log_rule():
    assert is_run_log(Path("results/run77-attention/results.json"))
    assert is_run_log(Path("benchmarks/bench.log"))
    assert not is_run_log(Path("benchmarks/gemm-h200.json"))
    assert not is_run_log(Path("notes-gemm.md"))


def test_docs_hold_no_run_logs():
    docs = REPO / "docs"
    logs = [str(p.relative_to(docs)) for p in docs.rglob("*") if is_run_log(p.relative_to(docs))]
    assert not logs, f"run logs under docs/ (a result lands as JSON + command in docs/benchmarks/): {logs[:10]}"


def test_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#]+)\)", readme_text())
    missing = [t for t in targets if not t.startswith("http") and not (REPO / t).exists()]
    assert targets and not missing, f"README links to missing files: {missing}"


def test_main_job_prints_verdict_and_text(tmp_path: Path, smollm2_float32):
    # `make demo` = setup + `python -m fdpp_rewrite demo`; setup is what this test suite already ran. Five tokens
    # are enough for a three-word answer; each more is a whole-model step on the CPU reference ops.
    # The work folder starts with the session's export (the demo's `export` command with a 128-token cache:
    # tests/conftest.py), which the demo reuses; the rewrite, compare and generation run here.
    smollm2_float32(tmp_path)
    result = subprocess.run([sys.executable, "-m", "fdpp_rewrite", "demo", "--workdir", str(tmp_path),
                             "--max-new-tokens", "5", "--device", "cpu"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "== export: reusing" in result.stdout and "== rewrite: ok" in result.stdout
    assert "compare verdict for smollm2-135m: PASS" in result.stdout
    answer = re.search(r"^answer: (.+)$", result.stdout, flags=re.MULTILINE)
    assert answer and len(answer.group(1).split()) >= 3, result.stdout[-2000:]
