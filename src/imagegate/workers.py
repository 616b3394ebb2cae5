"""Worker threads that an interrupt can cancel but never orphan.

Python raises KeyboardInterrupt (and, through the CLI's handler, SIGTERM) in the main thread at
any bytecode, including inside `Thread.start()` while it waits for the new thread to run. A
ThreadPoolExecutor records a worker only after `start()` returns, so an interrupt landing there
leaves a running thread that nobody waits for: a run that goes on making and running containers
after the CLI has said it was interrupted. Here signals are held while the threads start, and
delivered once every thread is known."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_HELD = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM in this thread (threads started meanwhile inherit the mask, so the
    signals wait for the main thread); a held signal is delivered on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives Python's signal handlers
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_all(fn: Callable[[T], R], items: Sequence[T], cancel: threading.Event, name: str) -> list[R]:
    """`fn` over `items`, one thread each, all at once; the results in order. On an exception in
    the calling thread (an interrupt), `cancel` is set and every call is waited for before the
    exception goes on: each call must watch `cancel` and clean up after itself."""
    pool = ThreadPoolExecutor(max_workers=max(1, len(items)), thread_name_prefix=name)
    futures: list[Future[R]] = []
    try:
        with signals_held():
            futures = [pool.submit(fn, item) for item in items]
        while not all(f.done() for f in futures):
            wait(futures, timeout=0.5)
    except BaseException:
        cancel.set()
        wait(futures)
        raise
    finally:
        pool.shutdown(wait=True)
    return [f.result() for f in futures]
