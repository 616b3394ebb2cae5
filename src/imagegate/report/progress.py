"""Progress and logs, on stderr only: `-v` info, `-vv` debug, `--quiet` nothing but errors.
Bars are drawn only on a terminal; in CI logs (not a TTY) a finished item is one log line."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # rich loads when something is shown: a quiet or JSON run never draws
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from imagegate.oci.layercheck import Progress as LayerProgress
    from imagegate.usecases.runner import Display


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
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from imagegate.report.console import a_terminal, make_console

        self.console = console or make_console(stderr=True)
        self.enabled = not quiet and a_terminal(self.console)
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
        self._bytes = 0  # read by the items' layer reads (layercheck.Progress, below)
        self._shown = 0.0

    def __enter__(self) -> ItemsBar:
        if self.enabled:
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=self._total)
        return self

    # layercheck.Progress: every item's blob reads, as one count of bytes beside the items'.
    def started(self, key: int, label: str, total: int | None) -> None:
        pass

    def advanced(self, key: int, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            now = time.monotonic()
            if self._task is not None and now - self._shown >= 0.2:  # a few redraws a second
                self._shown = now
                self._progress.update(
                    self._task, description=f"{self._label} · {size_text(self._bytes)} read"
                )

    def finished(self, key: int, status: str) -> None:
        pass

    def waiting(self, what: str, elapsed: float, done: bool) -> None:
        pass

    def more(self, n: int) -> None:
        """`n` more items than counted at the start (a mirror set, once listed, is its pairs)."""
        with self._lock:
            self._total += n
            if self._task is not None:
                self._progress.update(self._task, total=self._total)

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


class StageView:
    """Stages as they finish, while a run goes on: on a terminal a bar with the stage now
    running and its elapsed time; elsewhere (CI logs) one line per finished stage. The stage
    list comes from the controller's start event."""

    def __init__(self, *, console: Console | None = None) -> None:
        from imagegate.report.console import a_terminal, make_console

        self.console = console or make_console(stderr=True, highlight=False)
        self.bar = a_terminal(self.console)  # a bar on a terminal; a line a stage in a log
        self.ids: list[str] = []
        self.done = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> StageView:
        return self

    def _label(self) -> str:
        return f"running {self.ids[self.done]}" if self.done < len(self.ids) else "finishing"

    def event(self, ev: dict[str, object]) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        if ev.get("event") == "start":
            plan = ev.get("plan_stages")
            self.ids = [str(x) for x in plan] if isinstance(plan, list) else []
            if self.bar and self.ids and self._progress is None:
                self._progress = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=self.console,
                    transient=True,
                )
                self._progress.start()
                self._task = self._progress.add_task(self._label(), total=len(self.ids))
            return
        if ev.get("event") == "end":
            self.close()  # the image's part is over; outside stages may draw their own bars
            return
        if ev.get("event") != "stage":
            return
        self.done += 1
        total = len(self.ids) or "?"
        line = (
            f"imagegate: [{self.done}/{total}] {ev.get('id')} {ev.get('status')} ({ev.get('duration_s', 0)}s)"
        )
        if self._progress is not None and self._task is not None:
            self._progress.console.print(line, markup=False)
            self._progress.update(self._task, advance=1, description=self._label())
        else:
            self.console.print(line, markup=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LayerBars:
    """A rich progress bar per blob with throughput (layers, compare, the layers stage of a run)."""

    def __init__(self, console: Console):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[int, TaskID] = {}
        self.lock = threading.Lock()

    def started(self, key: int, label: str, total: int | None) -> None:
        with self.lock:
            if not self.progress.live.is_started:  # started on first use inside a run
                self.progress.start()
            self.tasks[key] = self.progress.add_task(label, total=total)

    def close(self) -> None:
        if self.progress.live.is_started:
            self.progress.stop()

    def advanced(self, key: int, nbytes: int) -> None:
        self.progress.advance(self.tasks[key], nbytes)

    def finished(self, key: int, status: str) -> None:
        task = self.tasks[key]
        label = self.progress.tasks[task].description if task < len(self.progress.tasks) else ""
        self.progress.update(task, description=f"{label} {status}")

    def waiting(self, what: str, elapsed: float, done: bool) -> None:
        """A pulsing line while the engine prepares its export (no byte yet), with the time."""
        with self.lock:
            if not self.progress.live.is_started:
                self.progress.start()
            key = -1
            if done:
                if key in self.tasks:
                    text = f"{what}: the engine prepared the export in {elapsed:.0f} s"
                    self.progress.update(self.tasks[key], description=text, total=1, completed=1)
                return
            text = f"{what}: the engine is preparing the export ({elapsed:.0f} s)"
            if key not in self.tasks:
                self.tasks[key] = self.progress.add_task(text, total=None)
            else:
                self.progress.update(self.tasks[key], description=text)


def size_text(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@dataclass
class _Blob:
    """A blob being read, as WaitLines tells it when done."""

    label: str
    nbytes: int
    start: float  # time.monotonic()


class WaitLines:
    """Not a terminal (CI logs): no bars, but a line every `every` seconds while the engine
    prepares its export, so that a long silent wait does not look like a hang."""

    def __init__(self, console: Console, every: float = 15.0, *, layers: bool = False):
        self.console, self.every = console, every
        self._next = every
        # With `layers`: a line as each blob is done (a run's layers stage, where the bars of
        # `imagegate layers` are not shown): label, status, bytes and time.
        self.layers = layers
        self._blobs: dict[int, _Blob] = {}
        self._lock = threading.Lock()

    def started(self, key: int, label: str, total: int | None) -> None:
        if self.layers:
            with self._lock:
                self._blobs[key] = _Blob(label, 0, time.monotonic())

    def advanced(self, key: int, nbytes: int) -> None:
        if self.layers:
            with self._lock:
                self._blobs[key].nbytes += nbytes

    def finished(self, key: int, status: str) -> None:
        if not self.layers:
            return
        with self._lock:
            blob = self._blobs.pop(key, _Blob("blob", 0, time.monotonic()))
        secs = time.monotonic() - blob.start
        # One line however long (a CI log has no width): soft_wrap.
        self.console.print(
            f"{blob.label}: {status}, {size_text(blob.nbytes)} in {secs:.1f} s", markup=False, soft_wrap=True
        )

    def waiting(self, what: str, elapsed: float, done: bool) -> None:
        if done:
            if elapsed >= self.every:
                self.console.print(f"{what}: the engine prepared the export in {elapsed:.0f} s", markup=False)
        elif elapsed >= self._next:
            self._next += self.every
            self.console.print(f"{what}: the engine is preparing the export ({elapsed:.0f} s)", markup=False)


@contextlib.contextmanager
def run_shown(silent: bool) -> Iterator[Display]:
    """A run's display: stage progress and layer bars on a terminal; in a CI log a line per
    layer read and a line every 15 s while the engine prepares a big image's export; nothing
    when silent."""
    from imagegate.usecases.runner import Display

    if silent:
        yield Display()
        return
    from imagegate.report.console import a_terminal, make_console

    err = make_console(stderr=True, highlight=False)
    bars = LayerBars(err) if a_terminal(err) else None
    try:
        with StageView(console=err) as view:
            yield Display(on_event=view.event, progress=bars or WaitLines(err, layers=True))
    finally:
        if bars is not None:
            bars.close()


@contextlib.contextmanager
def layer_progress(quiet: bool) -> Iterator[LayerProgress]:
    """The progress of reading an image's blobs (layers, compare, cache unpack), on stderr: bars
    on a terminal, a line every 15 s of an engine's silent export elsewhere, nothing when quiet."""
    from imagegate.oci.layercheck import NoProgress
    from imagegate.report.console import a_terminal, make_console

    err = make_console(stderr=True, highlight=False, markup=False)
    bars = None if quiet or not a_terminal(err) else LayerBars(err)
    try:
        if bars is not None:
            bars.progress.start()
        yield bars or (NoProgress() if quiet else WaitLines(err))
    finally:
        if bars is not None:
            bars.progress.stop()
