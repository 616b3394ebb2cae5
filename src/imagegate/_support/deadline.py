"""One deadline for a whole command: resolving the image, its manifest, preparing the root, the
stages. A server that answers one byte every few seconds never trips a per-read timeout; only a
deadline over the whole command ends it.

Two ways it ends a wait, the first the usual one:
- soft: readers take every socket timeout from `cap()` (each read, not each request, so a
  trickle cannot stretch it) and `check()` between tries, so each waiting thread raises
  DeadlineReached itself, at the deadline, naming what it waited for;
- hard: `armed()` marks a stretch of the main thread (preparing an image, a whole `layers`) that
  SIGALRM interrupts GRACE_S after the deadline, wherever it waits (a library's own read, an
  engine's answer), raising DeadlineReached there as Ctrl-C raises KeyboardInterrupt.

A thread that a hard stop leaves blocked cannot be joined: `stranded()` tells the entry point to
leave without waiting for it, once the message is out."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

from imagegate._support import interrupts
from imagegate.errors import ImagegateError

GRACE_S = 2.0  # after the deadline, before the hard stop: time for the soft way to name the wait
DEFAULT_S = 1800.0  # layers, compare, cache unpack, audit: a 20 GB image over a slow link fits
VERIFY_DEFAULT_S = 300.0  # verify --image: a manifest and a few small attestation blobs


class DeadlineReached(ImagegateError):
    """The command's deadline passed while it waited: exit 2, could not decide."""

    exit_code = 2


def process_start(stat: bytes | None = None) -> float:
    """When this process was started, on the monotonic clock: a command's deadline counts from
    its exec, interpreter start-up and imports included (a loaded CI host spends seconds there).
    Linux reads it from /proc/self/stat (boot-time clock ticks; `stat`: that line as read
    already); elsewhere: now."""
    now = time.monotonic()
    try:
        if stat is None:
            with open("/proc/self/stat", "rb") as f:
                stat = f.read()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started(stat) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < MAX_AGE_S else now


# A process older than this ran before the command (a test run, a long-lived caller): its
# command's clock starts now, not with the process.
MAX_AGE_S = 30.0


def started(stat: bytes) -> int:
    """The start time, in clock ticks since boot, of a process's /proc/PID/stat line (field 22,
    counted after the command name, which may hold spaces and parentheses)."""
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


class Deadline:
    """`explicit`: the user named it (--timeout), so every part of the command may take all of it
    (budget); otherwise it is a default, and each part keeps its own time too."""

    def __init__(
        self, seconds: float, option: str = "--timeout", start: float | None = None, explicit: bool = False
    ) -> None:
        self.seconds, self.option, self.explicit = seconds, option, explicit
        self.end = (time.monotonic() if start is None else start) + seconds
        self._lock = threading.Lock()
        self._waits: dict[int, str] = {}  # thread id -> what it waits for now

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def cap(self, seconds: float | None) -> float:
        """A wait of `seconds` (None: no limit of its own) that ends by the deadline."""
        left = max(0.05, self.remaining())
        return left if seconds is None else min(seconds, left)

    def error(self, what: str | None = None) -> DeadlineReached:
        waiting = what or self.waiting_for() or "the command's work"
        return DeadlineReached(
            f"the {self.seconds:g} s deadline ({self.option}) passed while waiting for {waiting}",
            hint=f"the server may be stalled or trickling; if it is only slow, raise {self.option}",
        )

    def check(self, what: str) -> None:
        if self.expired():
            raise self.error(what)

    def waiting_for(self) -> str | None:
        with self._lock:
            waits = list(dict.fromkeys(self._waits.values()))
        if not waits:
            return None
        return waits[0] + (f" (and {len(waits) - 1} more)" if len(waits) > 1 else "")

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Names what this thread waits for, for a hard stop's message."""
        me = threading.get_ident()
        with self._lock:
            before = self._waits.get(me)
            self._waits[me] = what
        try:
            yield
        finally:
            with self._lock:
                if before is None:
                    self._waits.pop(me, None)
                else:
                    self._waits[me] = before


_current: Deadline | None = None
_armed = 0
_stranded = False


def current() -> Deadline | None:
    return _current


def check(what: str) -> None:
    if _current is not None:
        _current.check(what)


def cap(seconds: float | None) -> float | None:
    return seconds if _current is None else _current.cap(seconds)


def budget(seconds: float) -> float:
    """The time of a part of the command whose own time is `seconds` (the in-image stages'
    timeouts added up), ending by the command's deadline; a deadline the user named (--timeout) is
    the part's whole: it is the one road by which --timeout reaches the work."""
    if _current is not None and _current.explicit:
        return _current.cap(None)
    return seconds if _current is None else _current.cap(seconds)


def expired_error(what: str) -> DeadlineReached | None:
    """The DeadlineReached to raise instead of a read error that the deadline caused, or None."""
    return _current.error(what) if _current is not None and _current.expired() else None


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    if _current is None:
        yield
        return
    with _current.waiting(what):
        yield


@contextlib.contextmanager
def covering(seconds: float, option: str = "--timeout", *, explicit: bool = False) -> Iterator[Deadline]:
    """The deadline of the command (or, nested, of one item of it) that runs inside the block;
    a nested one ends by the outer one."""
    global _current
    # The outermost deadline is the command's: it started with the process.
    outer = _current
    inner = Deadline(seconds, option, process_start() if outer is None else None, explicit)
    if outer is not None and outer.end < inner.end:  # the command's deadline comes first
        inner.seconds, inner.option, inner.end = outer.seconds, outer.option, outer.end
    _current = inner
    try:
        yield _current
    finally:
        _current = outer


def _on_alarm(_signum: int, _frame: FrameType | None) -> None:
    global _stranded
    if _current is not None and _armed:
        _stranded = True
        interrupts.stop(final=True)  # the worker threads stop too, at their next read
        raise _current.error()


@contextlib.contextmanager
def armed() -> Iterator[None]:
    """In the main thread: past the deadline (+ GRACE_S), the block is interrupted wherever it
    waits, with DeadlineReached. Elsewhere, or with no deadline: nothing."""
    global _armed
    d = _current
    if d is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    _armed += 1
    signal.setitimer(signal.ITIMER_REAL, max(0.01, d.remaining() + GRACE_S))
    try:
        yield
    finally:
        _armed -= 1
        if not _armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def stranded() -> bool:
    """A hard stop interrupted the main thread: threads it waited for may still be blocked."""
    return _stranded
