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

The first signal also stops the worker threads (`stop()`): each raises Stopped at its next read
(a chunk of an engine's export, of a registry blob, of a layer being hashed or unpacked), and a
read that blocks in a server that sends nothing is cut by shutting its socket down
(`on_stop`). So the way out waits for no export or hashing to finish: the threads end within
a chunk's time, and the engine sees its export's connection close.

The handlers are installed at the first line the console script runs (cli.main), before the
heavy imports."""

from __future__ import annotations

import _thread
import atexit
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_SIGINT = 130
EXIT_SIGTERM = 143

_first: int | None = None  # the first signal received
_raised = False  # KeyboardInterrupt was raised for it (or the command is ending): never again
_held = 0  # depth of critical() sections in the main thread
_stop = threading.Event()  # the command stops: every worker's next read raises Stopped
_hard_stopped = False  # the deadline's hard stop came (deadline.py): never lifted either
# Blocking waits to cut on stop, by id: set and removed by plain dict operations (atomic under
# the GIL), never under a lock, since stop() also runs in a signal handler.
_cuts: dict[int, Callable[[], None]] = {}


class Stopped(KeyboardInterrupt):
    """Raised in a worker thread at its next read once the command stops (a signal, the
    deadline's hard stop): a KeyboardInterrupt, so that nothing catching Exception keeps it."""


def stop(*, final: bool = False) -> None:
    """Every worker thread stops: its next read raises Stopped, and each blocking wait
    registered with on_stop is cut. `final`: the command ends (never resumed). Idempotent;
    safe in a signal handler."""
    global _hard_stopped
    _hard_stopped = _hard_stopped or final
    _stop.set()
    for cut in tuple(_cuts.values()):
        with contextlib.suppress(Exception):
            cut()


def stopping() -> bool:
    return _stop.is_set()


def signalled() -> bool:
    """A signal came, or the deadline's hard stop: the stop is the command's, never lifted."""
    return _first is not None or _hard_stopped


def resume() -> None:
    """Lifts a stop that is not the command's (--fail-fast's, once what it stopped has ended)."""
    if not signalled():
        _stop.clear()


def check_stop(what: str = "the command's work") -> None:
    """In a worker's read loop: raises Stopped once the command stops."""
    if _stop.is_set():
        raise Stopped(f"stopped while reading {what}")


def on_stop(cut: Callable[[], None]) -> Callable[[], None]:
    """`cut()` (e.g. shutting a socket down) ends a blocking wait when the command stops; called
    at once when it already has. Returns what unregisters it."""
    key = id(cut)

    def done() -> None:
        _cuts.pop(key, None)

    _cuts[key] = cut  # `cut` stays alive while registered: its id names it alone
    if _stop.is_set():
        with contextlib.suppress(Exception):
            cut()
    return done


def shutdown_socket(sock: socket.socket) -> None:
    """Both directions of `sock` shut down: a recv blocked in another thread returns at once. The
    plain socket's call, also for TLS: no TLS goodbye from a thread that does not own it."""
    socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _first, _raised
    if _first is None:
        _first = signum
        stop()  # the workers stop now, also while the main thread holds the interrupt
    if _raised or _held:
        return
    if _swallowed(frame):
        # Raised here it would be printed ("Exception ignored in ...") and dropped: the signal is
        # delivered again at the next instruction, until the interrupt lands where it counts.
        _thread.interrupt_main(signal.Signals(signum))
        return
    _raised = True
    raise KeyboardInterrupt


def _swallowed(frame: FrameType | None) -> bool:
    """Whether an exception raised in `frame` is dropped by the interpreter: a finalizer, or the
    weakref callback of importlib's module locks (a signal while still importing lands there)."""
    code = frame.f_code if frame is not None else None
    return code is not None and (
        code.co_name == "__del__"
        or (code.co_name == "cb" and code.co_filename.startswith("<frozen importlib"))
    )


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
