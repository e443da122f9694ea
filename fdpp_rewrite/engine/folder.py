"""Writing an engine folder in place of another: the checks before a build and the atomic swap after it.

    check_output(output, force)          # before any work: refuse what --force may not replace; remove leftovers
    tmp = temp_folder(output)            # .<name>.building-<pid> beside it
    ... write the engine into tmp ...
    replace_folder(tmp, output, force)   # rename into place; the old engine is removed only after

--force replaces only an engine folder (a manifest.json of fdpp's and nothing but the files a build writes) or an
empty folder: never a folder of the user's files (one holding the build's own input model, say), a file, or the
current folder. Temporary folders carry the pid of the build that made them (`.<name>.building-<pid>`, and
`.<name>.replaced-<pid>` for the old engine during the swap), so the next build of the same output recognizes
those of a killed build and removes them, with a warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from fdpp_rewrite.atomic import PARTIAL, existing_folder, leftovers, temp_name
from fdpp_rewrite.engine.manifest import MANIFEST, PLAN, STAMP, TOKENIZER, WEIGHTS
from fdpp_rewrite.errors import FdppError

BUILDING, REPLACED = ".building-", ".replaced-"  # the new engine while written; the old one while swapped out
# What a build writes in an engine folder (rank_N: a tensor-parallel engine's rank folders, each an engine folder)
ENGINE_ENTRY = re.compile("|".join(re.escape(name) for name in (MANIFEST, PLAN, WEIGHTS, TOKENIZER))
                          + "|" + re.escape(STAMP) + f"({re.escape(PARTIAL)}\\d+)?")
RANK_FOLDER = re.compile(r"rank_\d+")
CHOOSE = "choose another -o"


def _absolute(output: Path) -> Path:
    """`output` made absolute with `.` and `..` resolved by name (a symbolic link stays a link)."""
    return Path(os.path.abspath(output))


def _hidden(output: Path) -> Path:
    """The stem of our temporary names: engines/m -> engines/.m"""
    output = _absolute(output)
    return output.with_name(f".{output.name}")


def _foreign_entry(folder: Path) -> Path | None:
    """The first file or folder in `folder` that a build did not write, or None."""
    for entry in sorted(folder.iterdir()):
        if RANK_FOLDER.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            inner = _foreign_entry(entry)
            if inner is not None:
                return inner
        elif not ENGINE_ENTRY.fullmatch(entry.name) or not entry.is_file() or entry.is_symlink():
            return entry
    return None


def _is_engine_manifest(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("format") == "fdpp-engine"
    except (OSError, ValueError, AttributeError):
        return False


def _refusal(output: Path) -> str | None:
    """Why --force may not replace the existing `output`, or None when it may (an engine folder, an empty one)."""
    absolute = _absolute(output)
    if absolute == _absolute(Path.cwd()) or absolute in _absolute(Path.cwd()).parents:
        return f"{output} is the current folder or holds it; {CHOOSE}, e.g. -o engines/NAME"
    if output.is_symlink():
        return f"{output} is a symbolic link; {CHOOSE} (or the folder it points to)"
    if not output.is_dir():
        return f"{output} is a file, not an engine folder; {CHOOSE} (--force replaces only an engine folder)"
    if not any(output.iterdir()):
        return None
    if not _is_engine_manifest(output / MANIFEST):
        return (f"{output} is not an engine folder (no fdpp manifest.json in it) and not empty; {CHOOSE} "
                "(--force replaces only an engine folder or an empty one)")
    foreign = _foreign_entry(output)
    if foreign is not None:
        return (f"{output} holds {foreign.relative_to(output)}, which is not part of an engine; {CHOOSE} or move it "
                "out (--force replaces only an engine folder or an empty one)")
    return None


def _check_replaceable(output: Path, force: bool) -> None:
    if not os.path.lexists(output):
        return
    refusal = _refusal(output)
    if refusal:
        raise FdppError(refusal)
    if not force:
        raise FdppError(f"{output} exists; pass --force to replace it")


def check_output(output: Path, force: bool) -> None:
    """Refuse an output the build may not write or replace (without --force: any that exists); then remove the
    temporary folders that killed builds of this output left beside it."""
    output = Path(output)
    _check_replaceable(output, force)
    parent = existing_folder(_absolute(output).parent)
    if not parent.is_dir():
        raise FdppError(f"{parent} is a file, not a folder; {CHOOSE}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FdppError(f"cannot write to {parent}: the folder is read-only or not yours; {CHOOSE}")
    for marker in (BUILDING, REPLACED):
        for leftover in leftovers(_hidden(output), marker):
            shutil.rmtree(leftover, ignore_errors=True)
            print(f"warning: removed {leftover}, a temporary folder left by an interrupted build", file=sys.stderr)


def temp_folder(output: Path) -> Path:
    """A fresh temporary folder beside the output (same file system, so the final rename is atomic), named after
    this process: .<name>.building-<pid>."""
    tmp = temp_name(_hidden(output), marker=BUILDING)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():  # ours by its pid, from an earlier failed build of this process
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def replace_folder(tmp: Path, output: Path, force: bool) -> None:
    """Move a finished temporary folder into place (the old engine, with --force, is removed only after)."""
    output = Path(output)
    _check_replaceable(output, force)  # again: the output may have changed during the build
    if not os.path.lexists(output) or not any(output.iterdir()):
        os.replace(tmp, output)  # a rename onto an empty folder replaces it
        return
    old = temp_name(_hidden(output), marker=REPLACED)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(output, old)
    os.replace(tmp, output)
    shutil.rmtree(old, ignore_errors=True)
