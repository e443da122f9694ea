"""Progress of the steps that take more than a moment, on stderr (stdout stays the command's result).

On a terminal, a stage that counts its items (layers, steps, prompts) is a tqdm bar with an ETA; anywhere else
(a log file, a pipe, CI) every finished stage is one plain line with its elapsed time, and no carriage-return
frames are written. A stage that fails prints nothing: the error line follows.

    progress = Progress()
    with progress.stage("export layers", total=30, unit="layer") as stage:
        for layer in range(30):
            ...
            stage.update()
    # log:      "export layers: 30 layers in 4.2 s"
    # terminal: "export layers: 100%|██████████| 30/30 [00:04<00:00, 7.1layer/s]"
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Stage:
    """One stage: `update(n)` as items are done, then `finish()` (its line or final bar) or `close()` (it failed:
    nothing more is printed)."""

    def __init__(self, progress: "Progress", name: str, total: int | None, unit: str):
        self.name, self.total, self.unit = name, total, unit
        self.count = 0
        self.started = time.perf_counter()
        self._progress = progress
        self._bar = None
        if progress.enabled and total is not None and progress.on_terminal():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=name, unit=unit, file=progress.stream, leave=True, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def summary(self) -> str:
        """e.g. "export layers: 30 layers in 4.2 s", or "load model: 0.8 s" for a stage that counts nothing."""
        if self.total is None and not self.count:
            return f"{self.name}: {self.seconds:.1f} s"
        plural = self.unit if self.count == 1 else self.unit + "s"
        return f"{self.name}: {self.count} {plural} in {self.seconds:.1f} s"

    def finish(self) -> None:
        if self._bar is not None:
            self.close()
        elif self._progress.enabled:
            print(self.summary(), file=self._progress.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Progress:
    """Stages of one command. `enabled=False` prints nothing (library calls and tests); `stream` defaults to the
    stderr of the moment a stage starts."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self._stream = stream

    @property
    def stream(self):
        return self._stream or sys.stderr

    def on_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def start(self, name: str, total: int | None = None, unit: str = "step") -> Stage:
        return Stage(self, name, total, unit)

    @contextmanager
    def stage(self, name: str, total: int | None = None, unit: str = "step"):
        stage = self.start(name, total, unit)
        try:
            yield stage
        except BaseException:
            stage.close()
            raise
        stage.finish()


QUIET = Progress(enabled=False)
