"""What the CLI's stderr may hold: progress lines (fdpp_rewrite.progress.Stage.summary, e.g.
"export layers: 30 layers in 4.2 s") and at most one last line, the error."""

import re

PROGRESS_LINE = re.compile(r"^[^\s:][^:]*: (\d+ \S+ in )?\d+\.\d s$")


def progress_lines(stderr: str) -> list[str]:
    """The lines of a successful run's stderr, each checked to be a progress line (no bar frames, no warnings)."""
    assert "\r" not in stderr, "carriage-return frames in a log"
    lines = stderr.splitlines()
    bad = [line for line in lines if not PROGRESS_LINE.match(line)]
    assert not bad, f"not progress lines: {bad}"
    return lines


def error_line(stderr: str, prefix: str = "error: ") -> str:
    """The one error line that ends stderr; everything before it must be progress lines."""
    lines = stderr.strip("\n").splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith(prefix), f"last line is not `{prefix}...`: {stderr!r}"
    progress_lines("\n".join(lines[:-1]))
    return lines[-1]
