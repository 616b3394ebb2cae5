"""How an interrupt stops a command: SIGINT and SIGTERM both raise KeyboardInterrupt in the main
thread, so both take the one way out that removes containers and waits for worker threads; the
exit code still tells them apart, as a shell reports a process killed by the signal (128 + its
number).

One interrupt is raised, once: every later signal (a second Ctrl-C 20 ms after the first, a CI
runner's SIGTERM after its SIGINT) is noted and returns, so the way out that the first one began
(removing the container, waiting for the workers) is never cut half-way. Inside a `critical()`
section of the main thread (the engine creating or removing a container: a request whose answer,
if cut, leaves a container nobody removes) the first one is also held, and raised when the
section ends. Python runs signal handlers in the main thread only, whatever thread the kernel
hands the signal to, so holding them is done here, not with the thread's signal mask.

The handlers are installed at the first line the console script runs (cli.main), before the
heavy imports."""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

EXIT_SIGINT = 130
EXIT_SIGTERM = 143

_first: int | None = None  # the first signal received
_raised = False  # KeyboardInterrupt was raised for it (or the command is ending): never again
_held = 0  # depth of critical() sections in the main thread


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    global _first, _raised
    if _first is None:
        _first = signum
    if _raised or _held:
        return
    _raised = True
    raise KeyboardInterrupt


def install_handlers() -> None:
    """Unconditionally: a CI runner may start us with SIGINT ignored (inherited across exec),
    and an interrupt must still stop the run and remove its container."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    atexit.register(_ignore)


def _ignore() -> None:
    # The interpreter's shutdown puts a Python handler back to the default (the signal then kills
    # the process: exit -2 or -15 instead of the code decided) but leaves an ignored one ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """A section of the main thread that an interrupt must not cut: one that arrives inside is
    raised as it ends. In another thread, nothing to do (no handler runs there)."""
    global _held, _raised
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _first is not None and not _raised:
            _raised = True
            raise KeyboardInterrupt


def ending() -> int | None:
    """The command is past its work: any signal from now on is only noted. The exit code of a
    signal that came while it ran and was never raised (e.g. during the last line), else None."""
    global _raised
    _raised = True
    return exit_code() if _first is not None else None


def exit_code() -> int:
    """The exit code of the interrupt that stopped the command: 130 (SIGINT) or 143 (SIGTERM)."""
    return EXIT_SIGTERM if _first == signal.SIGTERM else EXIT_SIGINT
