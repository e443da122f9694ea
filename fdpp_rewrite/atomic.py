"""Outputs written atomically: a file gets its final name only once it is complete.

Every file of one output (an ONNX model, its .data file, its metadata) is written under a temporary name in its
own folder, `<name>.partial-<pid>`, and renamed to its final name only when all of them are complete, the main
file last. A run that fails, is interrupted or is killed leaves no file with a final name; a killed run's
temporary files are removed, with a warning, by the next run that writes the same output.

    outputs = AtomicOutputs([data_path, model_path], force=args.force)
    outputs.check()                              # before any work: folders, existing files, leftovers
    with outputs:                                # renamed on success, deleted on any exception
        writer = open(outputs.temp(data_path), "wb")
        ...
"""

from __future__ import annotations

import glob
import os
import re
import sys
from pathlib import Path

from fdpp_rewrite.errors import FdppError

PARTIAL = ".partial-"


def temp_name(path: Path, pid: int | None = None, marker: str = PARTIAL) -> Path:
    """e.g. engines/m/model.onnx.data -> engines/m/model.onnx.data.partial-4242 (`marker` tells what kind of
    temporary it is; engine folders use their own, engine/folder.py)"""
    return path.with_name(f"{path.name}{marker}{os.getpid() if pid is None else pid}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def leftovers(path: Path, marker: str = PARTIAL) -> list[Path]:
    """Temporaries of `path` (temp_name with `marker`) whose writer is gone (killed or crashed)."""
    if not path.parent.is_dir():
        return []
    found = []
    pattern = re.compile(re.escape(path.name + marker) + r"(\d+)$")
    for candidate in path.parent.glob(glob.escape(path.name + marker) + "*"):
        match = pattern.match(candidate.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            found.append(candidate)
    return sorted(found)


def existing_folder(folder: Path) -> Path:
    """`folder`, or its nearest ancestor that exists (where a new folder would be made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


class AtomicOutputs:
    """The files of one output; `paths` in commit order, the main file (the one users open) last."""

    def __init__(self, paths, force: bool = False, option: str = "-o", example: str = "model.onnx"):
        self.paths = [Path(p) for p in paths]
        self.force = force
        self.option = option  # how the user names the output, for the messages
        self.example = example  # a file name to suggest when the user named a folder
        self._temps: dict[Path, Path] = {}

    @property
    def main(self) -> Path:
        return self.paths[-1]

    def check(self, stream=None) -> None:
        """Refuse, with a one-line error, what would fail or overwrite the user's files; remove leftovers."""
        for path in self.paths:
            if path.is_dir():
                example = path / self.example if path == self.main else None
                fix = (f"name a file, e.g. {self.option} {example}" if example
                       else f"remove it or choose another {self.option}")
                raise FdppError(f"{path} is a folder, not a file; {fix}")
        folder = existing_folder(self.main.parent)
        if not folder.is_dir():
            raise FdppError(f"{folder} is a file, not a folder; choose another {self.option}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise FdppError(f"cannot write to {folder}: the folder is read-only or not yours; "
                            f"choose another {self.option}")
        existing = [p for p in self.paths if p.exists()]
        if existing and not self.force:
            if self.main.exists():
                shown, partial = self.main, ""
            else:
                shown, partial = existing[0], f" (left from an incomplete write: {self.main.name} is missing)"
            raise FdppError(f"{shown} already exists{partial}; pass --force to overwrite it or choose another "
                            f"{self.option}")
        for path in self.paths:
            for leftover in leftovers(path):
                leftover.unlink(missing_ok=True)
                print(f"warning: removed {leftover}, a partial file left by an interrupted run",
                      file=stream or sys.stderr)

    def temp(self, path) -> Path:
        """The temporary name to write `path` under (its folder is created)."""
        path = Path(path)
        if path not in self.paths:
            raise ValueError(f"{path} is not one of this output's files")
        path.parent.mkdir(parents=True, exist_ok=True)
        return self._temps.setdefault(path, temp_name(path))

    def commit(self) -> None:
        """Rename every written file to its final name, the main file last; an old file of this output that was
        not written again (a --force overwrite without, say, a .data file) is removed."""
        for path in self.paths:
            temp = self._temps.get(path)
            if temp is not None and temp.exists():
                os.replace(temp, path)
            elif path.exists():
                path.unlink()
        self._temps.clear()

    def discard(self) -> None:
        for temp in self._temps.values():
            temp.unlink(missing_ok=True)
        self._temps.clear()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc is None:
            self.commit()
            return False
        if isinstance(exc, OSError) and not exc.filename:  # a failed write() names no file: name the output
            exc.filename = str(self.main)
        self.discard()
        return False


def rename_external_data(model, old_name: str, new_name: str) -> int:
    """Point the model's external tensors stored in `old_name` (a temporary name) at `new_name`; returns how
    many were changed."""
    changed = 0
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old_name:
                entry.value = new_name
                changed += 1
    return changed
