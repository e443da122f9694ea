"""Writing an engine folder in place of another: the checks before a build and the atomic swap after it.

    check_output(output, force)          # before any work: refuse what --force may not replace
    tmp = temp_folder(output)            # .<name>.<random> beside it
    ... write the engine into tmp ...
    replace_folder(tmp, output, force)   # rename into place; the old engine is removed only after
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fdpp_rewrite.errors import FdppError


def check_output(output: Path, force: bool) -> None:
    """Refuse an existing output unless --force was given."""
    if output.exists() and not force:
        raise FdppError(f"{output} exists; pass --force to replace it")


def temp_folder(output: Path) -> Path:
    """A fresh temporary folder beside the output (same file system, so the final rename is atomic)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))


def replace_folder(tmp: Path, output: Path, force: bool) -> None:
    """Move a finished temporary folder into place (the old engine, with --force, is removed only after)."""
    if output.exists():
        if not force:
            raise FdppError(f"{output} exists; pass --force to replace it")
        old = output.with_name(f".{output.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(output, old)
        os.replace(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, output)
