"""A reader filled by its own thread through a bounded queue: reading (network, disk, an engine's
export) overlaps the consumer's work, in bounded memory. The thread stops when asked, also while
it waits on a full queue, and what it met (an error, the end) reaches the consumer in order."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable

from imagegate._support import interrupts


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = _End()
_PUT_POLL_S = 0.2  # how soon a thread blocked on a full queue notices a stop
_GET_POLL_S = 0.2  # how soon a consumer waiting for a chunk notices the command stop


class ThreadedReader:
    """`read(n)` over the chunks `produce()` yields, produced in a thread named `name`, at most
    `depth` chunks ahead. `produce` runs in the thread, so a slow start blocks it, not the caller.

    With `tick_s`, a consumer waiting that long for a chunk calls `on_tick()` (which may raise to
    give up) and waits again. An error in the thread is raised in the consumer, through
    `describe()` when it is overridden."""

    def __init__(
        self,
        produce: Callable[[], Iterable[bytes]],
        *,
        depth: int,
        name: str,
        tick_s: float | None = None,
    ):
        self._q: queue.Queue[bytes | _End | _Failed] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._tick_s = tick_s
        self._buf, self._pos = b"", 0
        self._ended = False
        self.count = 0  # bytes handed to the consumer's buffer
        self._chunks: Iterable[bytes] | None = None
        self._thread = threading.Thread(target=self._pump, args=(produce,), name=name, daemon=True)
        self._thread.start()

    # -- the thread --------------------------------------------------------------------------

    def _put(self, item: bytes | _End | _Failed) -> bool:
        while not (self._stop.is_set() or interrupts.stopping()):
            try:
                self._q.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self, produce: Callable[[], Iterable[bytes]]) -> None:
        try:
            self._chunks = produce()
            for chunk in self._chunks:
                if chunk and not self._put(chunk):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))

    # -- the consumer ------------------------------------------------------------------------

    def on_tick(self) -> None:
        """No chunk for `tick_s` seconds (only with `tick_s`)."""

    def on_chunk(self, chunk: bytes) -> None:
        """A chunk reached the consumer."""

    def describe(self, error: BaseException) -> BaseException:
        """The error to raise for what the thread met."""
        return error

    def _next(self) -> bytes:
        tick = None if self._tick_s is None else time.monotonic() + self._tick_s
        while True:
            interrupts.check_stop(self._thread.name)
            try:
                item = self._q.get(timeout=_GET_POLL_S)
            except queue.Empty:
                if tick is not None and time.monotonic() >= tick:
                    tick = time.monotonic() + (self._tick_s or 0)
                    self.on_tick()
                continue
            if isinstance(item, _Failed):
                self._ended = True
                error = self.describe(item.error)
                if error is item.error:
                    raise error
                raise error from item.error
            if isinstance(item, _End):
                self._ended = True
                return b""
            self.count += len(item)
            self.on_chunk(item)
            return item

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf):
            if self._ended:
                return b""
            self._buf, self._pos = self._next(), 0
        if n < 0:
            parts = [self._buf[self._pos :]]
            while chunk := (b"" if self._ended else self._next()):
                parts.append(chunk)
            self._buf, self._pos = b"", 0
            return b"".join(parts)
        # A whole chunk is handed on as is: no copy.
        out = self._buf[self._pos : self._pos + n] if self._pos or n < len(self._buf) else self._buf
        self._pos += len(out)
        return out

    def close(self, *, wait: bool = True) -> None:
        """Stop reading ahead. `wait`: return once the thread no longer touches the source
        (it is between reads: each read ends); without it, close the chunk iterator only when
        the thread is already gone (the thread may be blocked in the source for long)."""
        self._stop.set()
        if wait:
            while self._thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._q.get(timeout=0.1)  # unblock a put
        close = getattr(self._chunks, "close", None)
        if close is not None and not self._thread.is_alive():
            close()
