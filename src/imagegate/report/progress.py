"""Progress and logs, on stderr only: `-v` info, `-vv` debug, `--quiet` nothing but errors.
Bars are drawn only on a terminal; in CI logs (not a TTY) a finished item is one log line."""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


def setup_logging(verbose: int, quiet: bool, stream: TextIO | None = None) -> None:
    """`imagegate.*` loggers to stderr at the level the flags ask for, as plain lines: CI logs
    are read with grep."""
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logger = logging.getLogger("imagegate")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt = (
        "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"
        if verbose >= 2
        else "imagegate: %(message)s"
    )
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


class ItemsBar:
    """One bar counting finished items (audit), on a terminal; inert elsewhere or when quiet."""

    def __init__(self, total: int, label: str, *, quiet: bool, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = not quiet and self.console.is_terminal
        self._lock = threading.Lock()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task: TaskID | None = None
        self._total, self._label = total, label

    def __enter__(self) -> ItemsBar:
        if self.enabled:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=self._total)
        return self

    def advance(self, line: str | None = None) -> None:
        with self._lock:  # called from worker threads
            if self._task is not None:
                if line:
                    self._progress.console.print(line, highlight=False, markup=False)
                self._progress.advance(self._task)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self._progress.stop()
